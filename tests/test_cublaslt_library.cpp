#define BOOST_TEST_MODULE test_cublaslt_library
#include <boost/test/unit_test.hpp>
// Tests of cublaslt() (label cpu, built with the CUDA backend, no GPU needed): cuBLASLt is not loaded
// until the first call (it is opened, not linked, so processes that never run a GEMM skip its start-up
// cost), the call loads libcublasLt.so.<CUBLAS_VER_MAJOR> and resolves every entry point to that
// library's own symbol, and later calls return the same table.

#include <dlfcn.h>

#include <string>

#include "cublaslt_library.hpp"

namespace {

const std::string kSoname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);

bool loaded() {
  void* h = dlopen(kSoname.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h) dlclose(h);  // drops only the reference RTLD_NOLOAD took
  return h != nullptr;
}

}  // namespace

BOOST_AUTO_TEST_CASE(cublaslt_is_opened_at_the_first_call_with_every_entry_point) {
  BOOST_TEST(!loaded(), kSoname << " is loaded before the first call: is it linked again?");
  const shardlm::cuda::CublasLt& lt = shardlm::cuda::cublaslt();
  BOOST_TEST(loaded());
  void* library = dlopen(kSoname.c_str(), RTLD_NOW | RTLD_NOLOAD);
  BOOST_REQUIRE(library);
#define SHARDLM_CHECK_ENTRY(name)                                                        \
  BOOST_TEST(reinterpret_cast<void*>(lt.name) == dlsym(library, "cublasLt" #name), #name); \
  BOOST_TEST(reinterpret_cast<void*>(lt.name) != nullptr, #name);
  SHARDLM_CUBLASLT_ENTRY_POINTS(SHARDLM_CHECK_ENTRY)
#undef SHARDLM_CHECK_ENTRY
  dlclose(library);
  BOOST_TEST(&shardlm::cuda::cublaslt() == &lt);
}
