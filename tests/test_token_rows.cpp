// The CPU backend's token-row primitives (Backend::rows_*) against the host reference of
// token_rows_check.hpp, in fp32, bf16 and fp16.
#define BOOST_TEST_MODULE test_token_rows
#include "token_rows_check.hpp"

using namespace shardlm;

BOOST_AUTO_TEST_CASE(token_rows_match_the_reference_in_every_dtype) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    BOOST_TEST_CONTEXT(dtype_name(dt)) { token_rows_test::check_token_rows(*cpu, dt); }
  }
}
