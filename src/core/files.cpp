// Input files read whole or by lines, checked before reading: regular files under a size limit
// (check_input_file), JSON of bounded nesting;
// output files written whole, with the reason of a failure.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "input_file.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

std::string clip_for_message(const std::string& text, size_t limit) {
  if (text.size() <= limit) return text;
  return concat(text.substr(0, limit), "... (", text.size(), " characters)");
}

namespace {

// What a file that is not a regular file is, for the message that refuses it.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "it is a directory";
  if (S_ISFIFO(mode)) return "not a regular file but a pipe (FIFO)";
  if (S_ISSOCK(mode)) return "not a regular file but a socket";
  if (S_ISCHR(mode)) return "not a regular file but a character device";
  if (S_ISBLK(mode)) return "not a regular file but a block device";
  return "not a regular file";
}

void check_stat(const struct stat& st, const std::string& path, const std::string& what, uint64_t max_bytes) {
  if (!S_ISREG(st.st_mode)) throw Error(concat("cannot open ", what, " '", path, "': ", file_kind(st.st_mode)));
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw Error(concat(what, " '", path, "' is ", st.st_size, " bytes, more than the limit of ", max_bytes,
                       " bytes for it"));
}

}  // namespace

void check_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  struct stat st {};
  // stat follows links: a link to a regular file is a regular file. stat never opens, so a pipe
  // is refused here before an open() could wait for its writer.
  if (path.empty() || ::stat(path.c_str(), &st) != 0) throw Error(concat("cannot open ", what, " '", path, "'"));
  check_stat(st, path, what, max_bytes);
}

std::unique_ptr<std::istream> open_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  check_input_file(path, what, max_bytes);
  auto in = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!*in) throw Error(concat("cannot open ", what, " '", path, "'"));
  return in;
}

std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  check_input_file(path, what, max_bytes);
  // O_NONBLOCK: should the name become a pipe after the check, open() still returns at once and
  // the fstat below refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(concat("cannot open ", what, " '", path, "': ", std::strerror(errno)));
  std::string text;
  try {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw Error(concat("cannot read ", what, " '", path, "': ", std::strerror(errno)));
    check_stat(st, path, what, max_bytes);
    text.reserve(static_cast<size_t>(st.st_size));
    char buffer[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw Error(concat("cannot read ", what, " '", path, "': ", std::strerror(errno)));
      if (n == 0) break;
      text.append(buffer, static_cast<size_t>(n));
      // A file that grows while it is read is still held to the limit.
      if (text.size() > max_bytes)
        throw Error(concat(what, " '", path, "' is more than the limit of ", max_bytes, " bytes for it"));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return text;
}

namespace {

template <typename Json>
Json parse_bounded(const std::string& text, const std::string& where, int max_depth) {
  const typename Json::parser_callback_t check = [&](int depth, typename Json::parse_event_t, Json&) {
    if (depth > max_depth) throw Error(concat(where, ": nests deeper than ", max_depth, " levels"));
    return true;
  };
  return Json::parse(text, check);
}

}  // namespace

nlohmann::json parse_json_bounded(const std::string& text, const std::string& where, int max_depth) {
  return parse_bounded<nlohmann::json>(text, where, max_depth);
}

nlohmann::ordered_json parse_ordered_json_bounded(const std::string& text, const std::string& where, int max_depth) {
  return parse_bounded<nlohmann::ordered_json>(text, where, max_depth);
}

void write_all(int fd, const void* data, size_t bytes, const std::string& what, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd, p + done, std::min<size_t>(bytes - done, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(concat("writing ", what, " '", path, "': ", std::strerror(n < 0 ? errno : EIO)));
    done += static_cast<size_t>(n);
  }
}

void replace_file(const std::string& path, const std::string& what,
                  const std::function<void(int fd, const std::string& tmp)>& fill) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(concat("cannot create ", what, " '", tmp, "': ", std::strerror(errno)));
  try {
    fill(fd, tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  int err = ::fsync(fd) != 0 && errno != EINVAL ? errno : 0;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw Error(concat("writing ", what, " '", tmp, "': ", std::strerror(err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(concat("cannot rename ", what, " '", tmp, "' to '", path, "': ", std::strerror(err)));
  }
}

void check_writable_folder(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(concat(what, " = '", dir, "': cannot create it: ", ec.message()));
  if (!std::filesystem::is_directory(dir)) throw Error(concat(what, " = '", dir, "': not a folder"));
  const std::string probe = (std::filesystem::path(dir) / concat(".shardlm-write-test.", ::getpid())).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(concat(what, " = '", dir, "': cannot create a file in it: ", std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace shardlm
