// chat: conversations for data.format = chat. Records in OpenAI messages, ShareGPT or alpaca form
// become messages; the model's chat template (a Jinja program, run by src/data/jinja*.cpp as
// transformers runs it) renders them; each assistant turn's span is found by rendering prefixes
// and takes the loss (data.train_on_prompt: every token does). docs/data.md describes the rules.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/config.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

// One conversation: messages as the template sees them ({"role", "content", ...}).
struct Conversation {
  nlohmann::ordered_json messages;
  std::string where;  // "FILE:LINE", or "FILE: record N" in a JSON array
};

// The conversations of a chat file: JSON lines (one record a line) or one JSON array of records.
// With `format` Auto each record's fields say its form: "messages", "conversations" (ShareGPT:
// from system/human/gpt, value) or "instruction" (alpaca: instruction, optional input, output,
// optional system; the user turn is the instruction, then a blank line and the input when there is
// one). A record that does not fit is an Error "WHERE: ..." naming the field.
std::vector<Conversation> read_conversations(const std::string& path, ChatFormat format);

// A chat template with the special tokens it is rendered with (bos_token, eos_token, pad_token,
// unk_token where known), as tokenizer.apply_chat_template passes them.
class ChatTemplate {
 public:
  // From a .jinja file, or from a tokenizer_config.json's chat_template (a string, or a list of
  // {name, template} of which "default" is taken) with its special tokens.
  static ChatTemplate from_file(const std::string& path);
  // `text` named `source` in errors, with these special tokens (empty: undefined).
  static ChatTemplate from_text(const std::string& text, const std::string& source, const std::string& bos_token = "",
                                const std::string& eos_token = "");
  // apply_chat_template(messages, tokenize=False, add_generation_prompt=...). Throws
  // jinja::TemplateError (an Error) naming the template and line; a raise_exception() says
  // "the template refuses the input: ...".
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt) const;
  const std::string& source() const;
  const std::string& eos_token() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// data.chat_template when given; else model.dir's chat_template.jinja or its tokenizer_config.json's
// chat_template; else the same beside the tokenizer (`tokenizer_json`: data.tokenizer's file or
// folder). The .jinja override takes its special tokens from those tokenizer_config.json files.
// Error saying where it looked when there is none.
ChatTemplate find_chat_template(const std::string& override_path, const std::string& model_dir,
                                const std::string& tokenizer_json);

// One conversation rendered, tokenized and masked.
struct ChatSample {
  std::string text;                               // the rendering (add_generation_prompt false)
  std::vector<int32_t> ids;                       // its tokens, cut to max_length
  std::vector<uint8_t> trained;                   // per token: 1 = takes a loss
  std::vector<std::pair<size_t, size_t>> spans;   // the trained byte ranges of text
  size_t assistant_turns = 0;
  size_t misaligned_turns = 0;                    // assistant turns whose prefixes did not line up
  bool cut = false;                               // longer than max_length
};

// Renders `c`, finds each assistant turn's span (after the rendering of the turns before it with
// the generation prompt, through the rendering up to it; a trailing eos_token that only the last
// turn gets is left out) and tokenizes the whole text once, a token trained when it overlaps a
// span. Error "WHERE: ..." when the template refuses the conversation.
ChatSample make_chat_sample(const Conversation& c, const ChatTemplate& tmpl, const Tokenizer& tok, bool train_on_prompt,
                            int max_length);

// The training sequence of a sample: position t predicts token t + 1 where that token is trained.
Example chat_example(const ChatSample& sample);

// A chat file loaded for training: its examples (after DatasetOptions' subset rule) and counts.
struct ChatLoad {
  std::vector<Example> examples;
  size_t conversations = 0, assistant_turns = 0, misaligned_turns = 0, misaligned_conversations = 0, cut = 0;
};
ChatLoad load_chat(const DataSection& data, const std::string& model_dir, const std::string& tokenizer_json,
                   const std::string& path, const Tokenizer& tok, const DatasetOptions& opt);
// The one warning of a load whose prefixes did not line up; empty when they all did.
std::string chat_alignment_warning(const ChatLoad& load, const std::string& path);

}  // namespace shardlm
