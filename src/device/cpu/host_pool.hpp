// The host's helper threads for the offloaded optimizer's passes (host AdamW, gradient accumulation,
// sums of squares): kept between calls, so a pass over one chunk of a few million elements costs no
// thread creation (31 threads created and joined per call took about as long as the chunk's update).
#pragma once

#include <cstddef>
#include <functional>

namespace shardlm {

// Runs body(i) once for every i < pieces on `threads` threads (the caller's among them), the pieces
// handed out in order from a shared counter; returns when every piece is done. One pass at a time:
// a second caller waits for the first. An exception from a piece is rethrown here after the pass.
void host_parallel_for(size_t pieces, int threads, const std::function<void(size_t)>& body);

}  // namespace shardlm
