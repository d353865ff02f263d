// Token boundaries of byte positions in a text tokenized whole (token_spans.hpp).
#include "token_spans.hpp"

#include <algorithm>

namespace shardlm {

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

size_t first_token_from(const std::string& text, size_t pos, const std::vector<int32_t>& ids, const Tokenizer& tok) {
  if (pos == 0) return 0;
  const std::vector<int32_t> head = tok.encode(text.substr(0, pos));
  size_t first = common_prefix(head, ids);
  // Tokens past the common prefix can still lie wholly before pos: a head ending in whitespace that the
  // whole text splits otherwise (GPT-2's "\n\n" alone is one token, before a word two). Each is the
  // head's while the text the ids decode to from the last shared token grows and stays a prefix of what
  // the head's own ids decode to from there. Decoding both from that token, never the text before it:
  // a special token earlier decodes to nothing (the decode skips it) or, for Llama 2, spaces the word
  // after it, so a decode of the whole prefix is not the text it came from.
  const size_t from = first > 0 ? first - 1 : 0;
  const auto tail = [from](const std::vector<int32_t>& v, size_t end) {
    return std::vector<int32_t>(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(end));
  };
  const std::string rest = tok.decode(tail(head, head.size()));
  for (size_t decoded = first > 0 ? tok.decode(tail(ids, first)).size() : 0; first < ids.size(); ++first) {
    const std::string d = tok.decode(tail(ids, first + 1));
    if (d.size() <= decoded || d.size() > rest.size() || rest.compare(0, d.size(), d) != 0) break;
    decoded = d.size();
  }
  return first;
}

size_t end_token_at(const std::string& text, size_t pos, const std::vector<int32_t>& ids, const Tokenizer& tok) {
  if (pos >= text.size()) return ids.size();
  const std::vector<int32_t> head = tok.encode(text.substr(0, pos));
  const size_t agree = common_prefix(head, ids);
  return agree < head.size() ? std::min(agree + 1, ids.size()) : agree;
}

PromptCompletionIds encode_prompt_completion(const std::string& prompt, const std::string& completion,
                                             const Tokenizer& tok) {
  PromptCompletionIds out;
  const std::string text = prompt + completion;
  out.ids = tok.encode(text);
  out.completion_begin = first_token_from(text, prompt.size(), out.ids, tok);
  return out;
}

}  // namespace shardlm
