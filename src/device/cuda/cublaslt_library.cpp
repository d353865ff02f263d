// cublaslt(): dlopen of libcublasLt.so.<major> and dlsym of each entry point, once.
#include "cublaslt_library.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <stdexcept>
#include <string>

namespace shardlm::cuda {
namespace {

const std::string kSoname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);

// The folder of the loaded CUDA runtime (linked, so always there), with a trailing '/'; empty if unknown.
std::string cudart_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) == 0 || !info.dli_fname) return {};
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

void* open_library() {
  if (void* h = dlopen(kSoname.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first_error = dlerror();
  const std::string beside = cudart_folder();
  if (!beside.empty())
    if (void* h = dlopen((beside + kSoname).c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  throw std::runtime_error("cannot open cuBLASLt (" + kSoname + "): " + first_error +
                           (beside.empty() ? std::string() : "; nor beside the CUDA runtime in " + beside) +
                           ". Put the CUDA toolkit's library folder on LD_LIBRARY_PATH (e.g. `module load cuda`)");
}

template <typename F>
void bind(void* library, F& entry, const char* name) {
  entry = reinterpret_cast<F>(dlsym(library, name));
  if (!entry) throw std::runtime_error("cuBLASLt (" + kSoname + ") has no entry point " + name + ": a different CUDA");
}

CublasLt load() {
  void* lib = open_library();  // kept open for the life of the process
  CublasLt lt{};
#define SHARDLM_CUBLASLT_BIND(name) bind(lib, lt.name, "cublasLt" #name);
  SHARDLM_CUBLASLT_ENTRY_POINTS(SHARDLM_CUBLASLT_BIND)
#undef SHARDLM_CUBLASLT_BIND
  return lt;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt lt = load();
  return lt;
}

}  // namespace shardlm::cuda
