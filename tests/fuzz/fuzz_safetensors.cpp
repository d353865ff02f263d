// libFuzzer target for read_safetensors: any input must parse or raise shardlm::Error, never crash.
// Build (not part of CMake), from the repository root:
//   clang++ -g -O1 -std=c++17 -fsanitize=fuzzer,address,undefined -I/usr/lib/x86_64-linux-gnu/openmpi/include \
//     -DOMPI_SKIP_MPICXX=1 -Iinclude tests/fuzz/fuzz_safetensors.cpp src/core/dtype.cpp src/io/safetensors_read.cpp \
//     -o /tmp/fuzz_safetensors
//   mkdir -p /tmp/fuzz_corpus && /tmp/fuzz_safetensors -max_total_time=60 /tmp/fuzz_corpus tests/fixtures/safetensors
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

#include "shardlm/io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The reader takes a path: each input goes through one temporary file per fuzzing process.
  static const std::string path = "/tmp/fuzz_safetensors_" + std::to_string(getpid()) + ".safetensors";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    shardlm::read_safetensors(path);
  } catch (const shardlm::Error&) {
    // Rejecting the input is the expected outcome; anything else escapes and is reported as a crash.
  }
  return 0;
}
