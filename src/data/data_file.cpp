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

std::ifstream open_data_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  // A directory opens as a stream on Linux and reads as empty: reject it by name instead.
  std::error_code ec;
  if (!in || std::filesystem::is_directory(path, ec)) throw Error(concat("cannot open data file '", path, "'"));
  return in;
}

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}

}  // namespace

std::string read_data_file(const std::string& path) {
  std::ifstream in = open_data_file(path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(concat("cannot read data file '", path, "'"));
  return text.str();
}

nlohmann::json parse_json_record(const std::string& line, const std::string& where) {
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw Error(concat(where, ": not valid JSON: ", e.what()));
  }
  SHARDLM_CHECK(record.is_object(), where, ": expected a JSON object");
  return record;
}

void for_each_record_line(const std::string& path,
                          const std::function<void(const std::string& line, const std::string& where)>& record) {
  std::ifstream in = open_data_file(path);
  std::string line;
  for (size_t line_number = 1; std::getline(in, line); ++line_number)
    if (!is_blank(line)) record(line, concat(path, ":", line_number));
  if (in.bad()) throw Error(concat("cannot read data file '", path, "'"));
}

}  // namespace shardlm
