// load_examples: the one place a data.format name picks its reader.
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

std::vector<Example> load_examples(const std::string& format, const std::string& path,
                                   const Tokenizer& tok, const DatasetOptions& opt) {
  if (format == "squad") return load_squad(path, tok, opt);
  if (format == "jsonl") return load_jsonl(path, tok, opt);
  if (format == "chess") return load_chess(path, tok, opt);
  throw Error(concat("data.format = '", format, "': must be squad, jsonl or chess"));
}

}  // namespace shardlm
