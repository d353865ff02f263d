// ByteTokenizer: UTF-8 bytes are token ids 0..255; BOS, EOS and PAD follow them; its files for
// transformers. make_tokenizer: the deck's data.tokenizer to a Tokenizer.
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "hf_tokenizer.hpp"

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

std::map<std::string, std::string> ByteTokenizer::hf_files(int model_max_length) {
  using Json = nlohmann::ordered_json;
  const char* names[3] = {kBosText, kEosText, kPadText};
  Json added = Json::array();
  for (int i = 0; i < 3; ++i)
    added.push_back({{"id", kBos + i}, {"content", names[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  // A byte-level BPE without merges: GPT-2's printable stand-in of byte b has id b.
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[hf::byte_level_chars()[static_cast<size_t>(b)]] = b;
  const Json bos = {{"SpecialToken", {{"id", kBosText}, {"type_id", 0}}}};
  Json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
      // Sequences start with BOS, as the training data's do.
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{kBosText, {{"id", kBosText}, {"ids", {kBos}}, {"tokens", {kBosText}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
        {"merges", Json::array()}}}};
  const Json special = {{"bos_token", kBosText}, {"eos_token", kEosText}, {"pad_token", kPadText}};
  Json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"bos_token", kBosText},
                 {"eos_token", kEosText},
                 {"pad_token", kPadText},
                 {"model_max_length", model_max_length},
                 {"clean_up_tokenization_spaces", false}};
  return {{"tokenizer.json", tokenizer.dump(2) + "\n"},
          {"tokenizer_config.json", config.dump(2) + "\n"},
          {"special_tokens_map.json", special.dump(2) + "\n"}};
}

std::string tokenizer_file(const std::string& tokenizer_json) {
  std::error_code ec;
  return std::filesystem::is_directory(tokenizer_json, ec)
             ? (std::filesystem::path(tokenizer_json) / "tokenizer.json").string()
             : tokenizer_json;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& tokenizer_json) {
  if (tokenizer_json.empty()) return std::make_unique<ByteTokenizer>();
  const std::string file = tokenizer_file(tokenizer_json);
  auto tok = std::make_unique<HfTextTokenizer>(HfTokenizer::from_file(file));
  SHARDLM_CHECK(tok->eos_id() >= 0, "tokenizer ", file,
                ": no EOS token found (tokenizer_config.json eos_token, or a token named </s>, <|endoftext|>, ...)");
  return tok;
}

}  // namespace shardlm
