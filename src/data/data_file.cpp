// Reading data files: one check that a path opens as a file, and the blank-line rule of the
// line-per-record formats.
#include "data_file.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../core/input_file.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

namespace {

// A regular file under the data file limit (a directory, /dev/zero or a pipe is refused by name).
std::unique_ptr<std::istream> open_data_file(const std::string& path) {
  return open_input_file(path, "data file", kMaxDataFileBytes);
}

// A line on the log every kProgressSeconds while a large file loads (log_info: rank 0 only), and
// one at the end when any was written, so a long start-up shows it is reading.
class LoadProgress {
 public:
  LoadProgress(const std::string& path, uintmax_t file_bytes) : path_(path), file_bytes_(file_bytes) {}
  void advance(size_t bytes, size_t lines) {
    done_ += bytes;
    lines_ = lines;
    unchecked_ += bytes;
    if ((lines & 1023) != 0 && unchecked_ < (uintmax_t{16} << 20)) return;  // the clock: every 1024 lines or 16 MiB
    unchecked_ = 0;
    if (timer_.seconds() < next_) return;
    next_ += kProgressSeconds;
    said_ = true;
    log_info(concat("reading data file ", path_, ": ", done_ >> 20, " of ", file_bytes_ >> 20, " MiB, ", lines_,
                    " lines, ", seconds(), " s"));
  }
  void finish() const {
    if (said_)
      log_info(concat("read data file ", path_, ": ", lines_, " lines in ", seconds(), " s"));
  }

 private:
  static constexpr double kProgressSeconds = 5.0;
  std::string seconds() const {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f", timer_.seconds());
    return text;
  }
  std::string path_;
  uintmax_t file_bytes_;
  uintmax_t done_ = 0, unchecked_ = 0;
  size_t lines_ = 0;
  double next_ = kProgressSeconds;
  bool said_ = false;
  Timer timer_;
};

// A UTF-8 byte-order mark (Windows editors write one) is no part of the first record.
void drop_byte_order_mark(std::string& text) {
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
}

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}

}  // namespace

std::string read_data_file(const std::string& path) {
  std::string text = read_input_file(path, "data file", kMaxDataFileBytes);
  drop_byte_order_mark(text);
  return text;
}

nlohmann::json parse_json_record(const std::string& line, const std::string& where) {
  nlohmann::json record;
  try {
    record = parse_json_bounded(line, where);
  } catch (const nlohmann::json::exception& e) {
    throw Error(concat(where, ": not valid JSON: ", clip_for_message(e.what())));
  }
  SHARDLM_CHECK(record.is_object(), where, ": expected a JSON object");
  return record;
}

void for_each_record_line(const std::string& path,
                          const std::function<void(const std::string& line, const std::string& where)>& record) {
  std::unique_ptr<std::istream> in = open_data_file(path);
  std::error_code ec;
  const uintmax_t file_bytes = std::filesystem::file_size(path, ec);
  LoadProgress progress(path, ec ? 0 : file_bytes);
  std::string line;
  for (size_t line_number = 1; std::getline(*in, line); ++line_number) {
    if (line_number == 1) drop_byte_order_mark(line);
    if (!is_blank(line)) record(line, concat(path, ":", line_number));
    progress.advance(line.size() + 1, line_number);
  }
  if (in->bad()) throw Error(concat("cannot read data file '", path, "'"));
  progress.finish();
}

}  // namespace shardlm
