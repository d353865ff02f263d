// write_staged_folder: a folder written under DIR.partial and swapped in for DIR when complete.
#include "staged_folder.hpp"

#include "shardlm/core.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

void rename_or_throw(const std::string& what, const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  SHARDLM_CHECK(!ec, what, ": cannot rename ", from.string(), " to ", to.string(), ": ", ec.message());
}

// Puts the complete STAGING in the place of DIR, keeping DIR's files that STAGING lacks and that
// `replaces` does not claim.
void install(const std::string& what, const fs::path& staging, const fs::path& dir,
             const std::function<bool(const std::string&)>& replaces) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return rename_or_throw(what, staging, dir);
  SHARDLM_CHECK(fs::is_directory(dir), what, ": ", dir.string(), " exists and is not a folder");
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!replaces(name) && !fs::exists(staging / name)) rename_or_throw(what, entry.path(), staging / name);
  }
  const fs::path old = fs::path(dir.string() + ".old");
  fs::remove_all(old, ec);
  rename_or_throw(what, dir, old);
  rename_or_throw(what, staging, dir);
  fs::remove_all(old, ec);
  SHARDLM_CHECK(!ec, what, ": cannot remove the earlier folder moved to ", old.string(), ": ", ec.message());
}

}  // namespace

void write_staged_folder(const std::string& dir, const std::string& what,
                         const std::function<bool(const std::string& file_name)>& replaces,
                         const std::function<void(const std::filesystem::path& staging)>& write) {
  SHARDLM_CHECK(!dir.empty(), what, ": no output folder given");
  fs::path target = fs::path(dir);
  if (!target.has_filename()) target = target.parent_path();  // "out/" -> "out"
  const fs::path staging = fs::path(target.string() + ".partial");
  std::error_code ec;
  fs::remove_all(staging, ec);  // left by a writer that was killed
  fs::create_directories(staging, ec);
  SHARDLM_CHECK(!ec && fs::is_directory(staging), what, ": cannot create the folder ", staging.string(),
                ec ? ": " + ec.message() : std::string());
  try {
    write(staging);
    install(what, staging, target, replaces);
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

}  // namespace shardlm
