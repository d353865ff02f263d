// ByteTokenizer: UTF-8 bytes are token ids 0..255; BOS, EOS and PAD follow them. make_tokenizer:
// the deck's data.tokenizer to a Tokenizer.
#include <filesystem>
#include <memory>

#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

std::vector<int32_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  // Cast through unsigned char so bytes >= 0x80 map to 128..255, not negative ids.
  for (char c : text) ids.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  }
  return text;
}


std::unique_ptr<Tokenizer> make_tokenizer(const std::string& tokenizer_json) {
  if (tokenizer_json.empty()) return std::make_unique<ByteTokenizer>();
  std::error_code ec;
  const std::string file = std::filesystem::is_directory(tokenizer_json, ec)
                               ? (std::filesystem::path(tokenizer_json) / "tokenizer.json").string()
                               : tokenizer_json;
  auto tok = std::make_unique<HfTextTokenizer>(HfTokenizer::from_file(file));
  SHARDLM_CHECK(tok->eos_id() >= 0, "tokenizer ", file,
                ": no EOS token found (tokenizer_config.json eos_token, or a token named </s>, <|endoftext|>, ...)");
  return tok;
}

}  // namespace shardlm
