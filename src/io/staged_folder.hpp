// Writing a folder of files as a whole (a Hugging Face export, a PEFT adapter): written beside it,
// then put in its place.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

namespace shardlm {

// Writes folder DIR as a whole: `write` fills the new, empty folder DIR.partial, which then takes
// DIR's place; on an error DIR is left as it was and DIR.partial is removed. Files of an existing
// DIR that the new folder lacks and that `replaces(file name)` does not claim (a tokenizer put
// beside the weights) move into the new folder, so they stay; the others go with the old folder.
// `what` begins each message ("export", "adapter").
void write_staged_folder(const std::string& dir, const std::string& what,
                         const std::function<bool(const std::string& file_name)>& replaces,
                         const std::function<void(const std::filesystem::path& staging)>& write);

}  // namespace shardlm
