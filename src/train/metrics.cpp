// JSON-lines metrics sink.
#include "metrics.hpp"

#include "shardlm/core.hpp"

namespace shardlm {

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : out_(path, append ? std::ios::app : std::ios::trunc), path_(path) {
  SHARDLM_CHECK(out_.good(), "cannot write metrics file '", path, "'");
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
  SHARDLM_CHECK(out_.good(), "writing metrics file '", path_, "' failed (disk full?)");
}

}  // namespace shardlm
