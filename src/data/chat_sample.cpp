// Chat samples: a conversation rendered by its template, each assistant turn's span found by
// rendering prefixes (TRL's assistant-only loss without {% generation %} markers), the text
// tokenized once, and the tokens that overlap a span trained.
#include <algorithm>

#include "chat.hpp"
#include "token_spans.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

namespace {

using Json = nlohmann::ordered_json;

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

Json first_messages(const Json& messages, size_t n) {
  return Json(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(n));
}

// The byte span of assistant turn i in `full`: after the rendering of the turns before it with the
// generation prompt, through the rendering up to it (less an eos_token the template adds only after
// a conversation's last turn). Empty when the prefixes do not line up.
std::pair<size_t, size_t> turn_span(const Json& messages, size_t i, const std::string& full, const ChatTemplate& tmpl) {
  std::string prompt, through;
  try {
    prompt = tmpl.render(first_messages(messages, i), true);
    through = tmpl.render(first_messages(messages, i + 1), false);
  } catch (const Error&) {  // a template that refuses a partial conversation (none before an assistant turn)
    return {0, 0};
  }
  if (!starts_with(full, prompt)) return {0, 0};
  size_t end = through.size();
  const std::string& eos = tmpl.eos_token();
  if (!starts_with(full, through)) {
    const bool trailing_eos = !eos.empty() && through.size() >= eos.size() &&
                              through.compare(through.size() - eos.size(), eos.size(), eos) == 0 &&
                              starts_with(full, through.substr(0, through.size() - eos.size()));
    if (!trailing_eos) return {0, 0};
    end = through.size() - eos.size();
  }
  return end > prompt.size() ? std::make_pair(prompt.size(), end) : std::make_pair(size_t{0}, size_t{0});
}

}  // namespace

ChatSample make_chat_sample(const Conversation& c, const ChatTemplate& tmpl, const Tokenizer& tok, bool train_on_prompt,
                            int max_length) {
  ChatSample s;
  try {
    s.text = tmpl.render(c.messages, false);
  } catch (const Error& e) {
    throw Error(concat(c.where, ": the chat template cannot render this conversation: ", e.what()));
  }
  s.ids = tok.encode(s.text);
  s.trained.assign(s.ids.size(), train_on_prompt ? 1 : 0);
  for (size_t i = 0; i < c.messages.size(); ++i) {
    if (c.messages[i].value("role", "") != "assistant") continue;
    ++s.assistant_turns;
    const auto [begin, end] = turn_span(c.messages, i, s.text, tmpl);
    if (end == 0) {
      ++s.misaligned_turns;
      continue;
    }
    s.spans.emplace_back(begin, end);
    if (train_on_prompt) continue;
    const size_t first = first_token_from(s.text, begin, s.ids, tok), last = end_token_at(s.text, end, s.ids, tok);
    for (size_t t = first; t < last; ++t) s.trained[t] = 1;
  }
  if (s.ids.size() > static_cast<size_t>(max_length)) {
    s.cut = true;
    s.ids.resize(static_cast<size_t>(max_length));
    s.trained.resize(static_cast<size_t>(max_length));
  }
  return s;
}

Example chat_example(const ChatSample& sample) {
  Example ex;
  ex.tokens = sample.ids;
  ex.targets.assign(sample.ids.size(), -1);
  for (size_t t = 0; t + 1 < sample.ids.size(); ++t)
    if (sample.trained[t + 1]) ex.targets[t] = sample.ids[t + 1];
  return ex;
}

ChatLoad load_chat(const DataSection& data, const std::string& model_dir, const std::string& tokenizer_json,
                   const std::string& path, const Tokenizer& tok, const DatasetOptions& opt) {
  const ChatTemplate tmpl = find_chat_template(data.chat_template, model_dir, tokenizer_json);
  ChatLoad load;
  std::vector<Example> all;
  for (const Conversation& c : read_conversations(path, data.chat_format)) {
    const ChatSample s = make_chat_sample(c, tmpl, tok, data.train_on_prompt, opt.max_length);
    ++load.conversations;
    load.assistant_turns += s.assistant_turns;
    load.misaligned_turns += s.misaligned_turns;
    load.misaligned_conversations += s.misaligned_turns > 0;
    load.cut += s.cut;
    all.push_back(chat_example(s));
  }
  load.examples = select_subset(std::move(all), opt);
  return load;
}

std::string chat_alignment_warning(const ChatLoad& load, const std::string& path) {
  if (load.misaligned_turns == 0) return "";
  return concat("warning: ", path, ": in ", load.misaligned_conversations, " of ", load.conversations,
                " conversations, ", load.misaligned_turns, " of ", load.assistant_turns,
                " assistant turns take no loss: the chat template renders the conversation before them differently "
                "once they are followed by more turns, so their prefixes do not line up (shardlm preprocess shows which)");
}

}  // namespace shardlm
