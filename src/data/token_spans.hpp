// Token boundaries of byte positions in a text tokenized whole, without offsets from the tokenizer:
// the text before a position, tokenized alone, agrees with the whole text's tokens up to the first
// token that crosses the position. The chat, SQuAD and prompt/completion loaders tokenize each
// sample once and place its loss with these, so a piece never gets tokens of its own at a seam
// (a SentencePiece "▁" or a byte-level "Ġ" that the whole text does not have).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardlm/data.hpp"

namespace shardlm {

// How many leading ids a and b share.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

// The first of `ids` (text's tokens) that overlaps text[pos, ...): past the tokens that the text before
// pos, tokenized alone, shares with `ids`, and past any further ones that decode to a part of it.
size_t first_token_from(const std::string& text, size_t pos, const std::vector<int32_t>& ids, const Tokenizer& tok);

// One past the last of `ids` that overlaps text[..., pos).
size_t end_token_at(const std::string& text, size_t pos, const std::vector<int32_t>& ids, const Tokenizer& tok);

// `prompt` + `completion` tokenized whole, and the index of the first token that overlaps the completion.
struct PromptCompletionIds {
  std::vector<int32_t> ids;
  size_t completion_begin = 0;
};
PromptCompletionIds encode_prompt_completion(const std::string& prompt, const std::string& completion,
                                             const Tokenizer& tok);

}  // namespace shardlm
