// JSON-lines metrics sink of a run (rank 0 writes, other ranks hold a closed sink).
#pragma once

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace shardlm {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // append: continue the file of an earlier run (a resumed run) instead of starting it anew.
  MetricsWriter(const std::string& path, bool append);
  void write(const nlohmann::json& record);  // one line, flushed so `tail -f` follows the run

 private:
  std::ofstream out_;
  std::string path_;
};

}  // namespace shardlm
