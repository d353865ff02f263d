// Input files read whole or by lines, checked before reading: regular files under a size limit.
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "shardlm/core.hpp"

namespace shardlm {

std::string clip_for_message(const std::string& text, size_t limit) {
  if (text.size() <= limit) return text;
  return concat(text.substr(0, limit), "... (", text.size(), " characters)");
}

std::unique_ptr<std::istream> open_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  struct stat st {};
  // stat follows links: a link to a regular file is a regular file.
  if (path.empty() || ::stat(path.c_str(), &st) != 0) throw Error(concat("cannot open ", what, " '", path, "'"));
  if (S_ISDIR(st.st_mode)) throw Error(concat("cannot open ", what, " '", path, "': it is a directory"));
  if (!S_ISREG(st.st_mode))
    throw Error(concat("cannot open ", what, " '", path, "': not a regular file (a device, pipe or socket)"));
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw Error(concat(what, " '", path, "' is ", st.st_size, " bytes, more than the limit of ", max_bytes,
                       " bytes for it"));
  auto in = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!*in) throw Error(concat("cannot open ", what, " '", path, "'"));
  return in;
}

std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  std::unique_ptr<std::istream> in = open_input_file(path, what, max_bytes);
  std::ostringstream text;
  text << in->rdbuf();
  if (in->bad()) throw Error(concat("cannot read ", what, " '", path, "'"));
  return text.str();
}

}  // namespace shardlm
