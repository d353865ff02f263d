// write_staged_folder: a folder's files written under DIR.partial, then renamed into DIR one by one.
#include "staged_folder.hpp"

#include <set>
#include <vector>

#include "shardlm/core.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

// DIR as given, less a trailing slash ("out/" -> "out"); a symbolic link is refused, not followed.
fs::path checked_target(const std::string& dir, const std::string& what, bool overwrite) {
  SHARDLM_CHECK(!dir.empty(), what, ": no output folder given");
  fs::path target = fs::path(dir);
  if (!target.has_filename()) target = target.parent_path();
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(target, ec);
  SHARDLM_CHECK(!fs::is_symlink(status), what, ": ", target.string(),
                " is a symbolic link: give the folder it points to, or a new folder");
  if (!fs::exists(status)) return target;
  SHARDLM_CHECK(fs::is_directory(status), what, ": ", target.string(), " exists and is not a folder");
  SHARDLM_CHECK(overwrite || fs::is_empty(target, ec), what, ": ", target.string(),
                " is not empty: pass --overwrite to replace the files this writes there (others stay), or give a "
                "new folder");
  return target;
}

// Moves every file of the complete STAGING into DIR, replacing DIR's file of that name, then removes
// DIR's regular files that `stale` claims and STAGING did not bring.
void move_in(const std::string& what, const fs::path& staging, const fs::path& dir,
             const std::function<bool(const std::string&)>& stale) {
  std::set<std::string> written;
  for (const auto& entry : fs::directory_iterator(staging)) written.insert(entry.path().filename().string());
  std::error_code ec;
  for (const std::string& name : written) {
    // Checked for every file before any moves: a folder of one of these names is the user's.
    const fs::file_status status = fs::symlink_status(dir / name, ec);
    SHARDLM_CHECK(!fs::exists(status) || fs::is_regular_file(status), what, ": ", (dir / name).string(),
                  " is not a regular file: it is left alone and the new export stays in ", staging.string());
  }
  for (const std::string& name : written) {
    fs::rename(staging / name, dir / name, ec);
    SHARDLM_CHECK(!ec, what, ": cannot move ", (staging / name).string(), " into ", dir.string(), ": ", ec.message(),
                  " (the files not moved yet stay in ", staging.string(), ")");
  }
  fs::remove(staging, ec);  // empty now: remove() refuses a folder that is not
  std::vector<fs::path> old;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!written.count(name) && entry.is_regular_file() && !entry.is_symlink() && stale(name))
      old.push_back(entry.path());
  }
  for (const fs::path& p : old) {
    fs::remove(p, ec);
    SHARDLM_CHECK(!ec, what, ": cannot remove ", p.string(), ", a file of the earlier export: ", ec.message());
  }
}

}  // namespace

fs::path check_output_folder(const std::string& dir, const std::string& what, bool overwrite) {
  const fs::path target = checked_target(dir, what, overwrite);
  const fs::path staging = fs::path(target.string() + ".partial");
  std::error_code ec;
  SHARDLM_CHECK(!fs::exists(fs::symlink_status(staging, ec)), what, ": ", staging.string(),
                " exists (left by an export that was stopped?): it is not removed; delete it or give another folder");
  return target;
}

void write_staged_folder(const std::string& dir, const std::string& what, bool overwrite,
                         const std::function<bool(const std::string& file_name)>& stale,
                         const std::function<void(const std::filesystem::path& staging)>& write) {
  const fs::path target = check_output_folder(dir, what, overwrite);
  const fs::path staging = fs::path(target.string() + ".partial");
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  // create_directory is false for a folder that appeared meanwhile: only a folder made here is removed below.
  const bool created = fs::create_directory(staging, ec);
  SHARDLM_CHECK(created && !ec, what, ": cannot create the folder ", staging.string(),
                ec ? ": " + ec.message() : std::string(": it exists"));
  try {
    write(staging);
  } catch (...) {
    fs::remove_all(staging, ec);  // holds only what `write` put there
    throw;
  }
  if (!fs::exists(fs::symlink_status(target, ec))) {
    fs::rename(staging, target, ec);
    SHARDLM_CHECK(!ec, what, ": cannot rename ", staging.string(), " to ", target.string(), ": ", ec.message());
    return;
  }
  move_in(what, staging, target, stale);
}

}  // namespace shardlm
