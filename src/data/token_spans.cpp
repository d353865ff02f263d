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
  return common_prefix(tok.encode(text.substr(0, pos)), ids);
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
