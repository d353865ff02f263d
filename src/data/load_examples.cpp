// load_examples: the one place a data.format picks its reader.
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

std::vector<Example> load_examples(DataFormat format, const std::string& path, const Tokenizer& tok,
                                   const DatasetOptions& opt) {
  switch (format) {
    case DataFormat::Squad: return load_squad(path, tok, opt);
    case DataFormat::Jsonl: return load_jsonl(path, tok, opt);
    case DataFormat::Chess: return load_chess(path, tok, opt);
    case DataFormat::Chat:  // needs the deck's template settings
      throw Error(concat(path, ": data.format = chat is read by load_chat (shardlm/chat.hpp), with the chat template"));
  }
  throw Error(concat("data.format: no reader for value ", static_cast<int>(format)));
}

}  // namespace shardlm
