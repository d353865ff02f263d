// Small helpers shared by the serial and MPI suites.
#pragma once

#include <boost/test/unit_test.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "shardlm/core.hpp"

// The message of the shardlm::Error `f` throws; fails the test if it throws nothing.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const shardlm::Error& e) {
    return e.what();
  }
  BOOST_ERROR("expected a shardlm::Error, none was thrown");
  return "";
}

// A byte-level BPE tokenizer.json of a few tokens: small, but a tokenizer a reader accepts.
inline const char* const kTinyTokenizerJson = R"({
  "added_tokens": [{"id": 5, "content": "<eos>", "special": true, "normalized": false}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
  "post_processor": null,
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "unk_token": null,
            "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4}, "merges": ["a b", "Ġ ab"]}
})";

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// How many times `what` occurs in `text` (overlaps counted).
inline size_t count_of(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++count;
  return count;
}

// The whole of a file the test reads (a failed check when it does not open).
inline std::string read_text_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  BOOST_TEST_REQUIRE(f != nullptr, "cannot read " << path);
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  return text;
}

// Writes `text` to the file `path`, creating its folder (a failed check when it cannot).
inline void write_text_file(const std::filesystem::path& path, const std::string& text) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
  BOOST_TEST_REQUIRE(out.good(), "cannot write " << path);
}

// Runs a shell command, appending what it prints on stdout to `output`; its exit code (-1 if it did
// not exit).
inline int run_shell(const std::string& cmd, std::string& output) {
  FILE* pipe = popen(cmd.c_str(), "r");
  BOOST_TEST_REQUIRE(pipe != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
