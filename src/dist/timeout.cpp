// dist.timeout's default: how long a collective may make no progress before the job ends.
#include <cstdlib>
#include <string>

#include "shardlm/dist.hpp"

namespace shardlm {

double default_dist_timeout() {
  const char* v = std::getenv("SHARDLM_NCCL_TIMEOUT");
  if (!v || !*v) return 600.0;
  // The job scripts' knob from before the deck key: a typo must not become a zero timeout.
  char* end = nullptr;
  const double seconds = std::strtod(v, &end);
  SHARDLM_CHECK(end != v && *end == '\0' && seconds > 0 && seconds < 1e9, "SHARDLM_NCCL_TIMEOUT = '", v,
                "': must be a number of seconds > 0 (or unset; dist.timeout in the deck sets it too)");
  return seconds;
}

}  // namespace shardlm
