// Reading data files: one check that a path opens as a file, and the blank-line rule of the
// line-per-record formats.
#include "data_file.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "shardlm/core.hpp"

namespace shardlm {

namespace {

// A regular file under the data file limit (a directory, /dev/zero or a pipe is refused by name).
std::unique_ptr<std::istream> open_data_file(const std::string& path) {
  return open_input_file(path, "data file", kMaxDataFileBytes);
}

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}

}  // namespace

std::string read_data_file(const std::string& path) { return read_input_file(path, "data file", kMaxDataFileBytes); }

nlohmann::json parse_json_record(const std::string& line, const std::string& where) {
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw Error(concat(where, ": not valid JSON: ", clip_for_message(e.what())));
  }
  SHARDLM_CHECK(record.is_object(), where, ": expected a JSON object");
  return record;
}

void for_each_record_line(const std::string& path,
                          const std::function<void(const std::string& line, const std::string& where)>& record) {
  std::unique_ptr<std::istream> in = open_data_file(path);
  std::string line;
  for (size_t line_number = 1; std::getline(*in, line); ++line_number)
    if (!is_blank(line)) record(line, concat(path, ":", line_number));
  if (in->bad()) throw Error(concat("cannot read data file '", path, "'"));
}

}  // namespace shardlm
