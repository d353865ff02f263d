// Reading data files, shared by the readers: the whole file (SQuAD JSON) or its non-blank lines
// (JSON lines, chess games), with one message naming the file when it cannot be opened or read,
// and one JSON-lines record.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace shardlm {

// The file's bytes. Error "cannot open data file 'PATH'" (also for a directory) or "cannot read".
std::string read_data_file(const std::string& path);

// Calls record(line, "PATH:LINE") for each line of the file that is not blank, in order.
// Errors as read_data_file.
void for_each_record_line(const std::string& path,
                          const std::function<void(const std::string& line, const std::string& where)>& record);

// One JSON-lines record: a JSON object, else Error "WHERE: not valid JSON: ..." or "WHERE:
// expected a JSON object".
nlohmann::json parse_json_record(const std::string& line, const std::string& where);

}  // namespace shardlm
