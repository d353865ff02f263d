// Writing a folder of files as a whole (a Hugging Face export, a PEFT adapter): written beside it,
// then moved in file by file; nothing in the folder that the writer did not write is touched.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

namespace shardlm {

// The checks write_staged_folder makes before writing anything (a symbolic link, a non-empty DIR
// without `overwrite`, a leftover DIR.partial): an Error naming the folder. Returns DIR as a path.
std::filesystem::path check_output_folder(const std::string& dir, const std::string& what, bool overwrite);

// Writes the files of folder DIR: `write` fills DIR.partial, a folder this call creates (an existing
// DIR.partial is an Error naming it, never removed); when it is complete each of its files is
// renamed over DIR's file of that name. A new or empty DIR is written as a whole; a non-empty one
// is an Error unless `overwrite`, and a DIR that is a symbolic link always is. With `overwrite`,
// DIR's other entries stay as they are, except regular files that `stale(file name)` claims as an
// earlier write's own (an earlier export's weight shards), removed once the new files are in place.
// On an error before the files move, DIR is left as it was and DIR.partial is removed.
// `what` begins each message ("export", "adapter").
void write_staged_folder(const std::string& dir, const std::string& what, bool overwrite,
                         const std::function<bool(const std::string& file_name)>& stale,
                         const std::function<void(const std::filesystem::path& staging)>& write);

}  // namespace shardlm
