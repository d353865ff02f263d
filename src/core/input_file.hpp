// Checks of user-supplied input before it is opened or parsed: a regular file of bounded size
// (never a pipe, device, socket or folder, so no open() blocks), and JSON of bounded nesting.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace shardlm {

// Error "cannot open WHAT 'PATH'" when it does not exist, naming what it is when it is a
// directory, a pipe (FIFO), a socket or a device, and its size when larger than max_bytes.
// For readers that open the file themselves (HDF5, a long-lived stream): call it just before.
void check_input_file(const std::string& path, const std::string& what, uint64_t max_bytes);

// Deeper nesting than any config, tokenizer or record shardlm reads; a depth bomb of '[' costs
// tens of bytes of memory per byte of input, so it is refused at this depth.
constexpr int kMaxJsonNesting = 64;

// JSON text parsed with its nesting bounded: Error "WHERE: nests deeper than N levels" and, for
// text that is not JSON, nlohmann's parse_error as json::parse throws it.
nlohmann::json parse_json_bounded(const std::string& text, const std::string& where,
                                  int max_depth = kMaxJsonNesting);
// The same keeping the objects' key order (chat records and templates walk it).
nlohmann::ordered_json parse_ordered_json_bounded(const std::string& text, const std::string& where,
                                                  int max_depth = kMaxJsonNesting);

}  // namespace shardlm
