// load_jsonl: JSON lines of {"text"} (loss on every next token) or {"prompt","completion"}
// (loss on the completion and EOS only).
#include <algorithm>
#include <nlohmann/json.hpp>

#include "data_file.hpp"
#include "token_spans.hpp"
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

namespace {

using nlohmann::json;

std::string string_field(const json& object, const char* key, const std::string& where) {
  const json& value = object.at(key);
  SHARDLM_CHECK(value.is_string(), where, ": '", key, "' must be a string");
  return value.get<std::string>();
}

// [BOS] prompt completion [EOS], tokenized whole (token_spans.hpp); the prompt's tokens lose their
// beginning to fit, the completion's never.
Example prompt_example(const std::string& prompt_text, const std::string& completion_text, const Tokenizer& tok,
                       int max_length, const std::string& where) {
  const PromptCompletionIds pc = encode_prompt_completion(prompt_text, completion_text, tok);
  const auto prompt_end = pc.ids.begin() + static_cast<std::ptrdiff_t>(pc.completion_begin);
  const size_t completion = pc.ids.size() - pc.completion_begin;
  const bool bos = tok.bos_id() >= 0;
  const size_t fixed = completion + 1 + (bos ? 1 : 0);
  SHARDLM_CHECK(bos || pc.completion_begin > 0, where, ": an empty prompt needs a tokenizer with a BOS token");
  // Without BOS, the prompt's last token predicts the completion's first: at least that one must fit.
  SHARDLM_CHECK(fixed + (bos ? 0 : 1) <= static_cast<size_t>(max_length), where, ": the completion takes ", fixed,
                bos ? " tokens with BOS and EOS, more than max_length "
                    : " tokens with EOS, which leaves no room in max_length ",
                max_length,
                bos ? "" : " for the prompt's last token (the tokenizer has no BOS to predict the completion from)");
  const size_t kept = std::min(pc.completion_begin, static_cast<size_t>(max_length) - fixed);
  Example ex;
  ex.cut = kept < pc.completion_begin;
  ex.tokens.reserve(fixed + kept);
  if (bos) ex.tokens.push_back(tok.bos_id());
  ex.tokens.insert(ex.tokens.end(), prompt_end - static_cast<std::ptrdiff_t>(kept), prompt_end);
  const size_t completion_begin = ex.tokens.size();
  ex.tokens.insert(ex.tokens.end(), prompt_end, pc.ids.end());
  ex.tokens.push_back(tok.eos_id());
  // From the last prompt token (or BOS) on, each position predicts a completion token or EOS.
  ex.targets.assign(ex.tokens.size(), -1);
  for (size_t t = completion_begin - 1; t + 1 < ex.tokens.size(); ++t)
    ex.targets[t] = ex.tokens[t + 1];
  return ex;
}

Example parse_line(const std::string& line, const std::string& where, const Tokenizer& tok,
                   int max_length) {
  const json record = parse_json_record(line, where);
  const bool has_text = record.contains("text");
  const bool has_prompt = record.contains("prompt");
  const bool has_completion = record.contains("completion");
  SHARDLM_CHECK(!(has_text && (has_prompt || has_completion)), where,
                ": has both 'text' and 'prompt'/'completion'");
  if (has_text) return next_token_example(tok.encode(string_field(record, "text", where)), tok, max_length);
  SHARDLM_CHECK(has_prompt && has_completion, where,
                ": expected 'text' or both 'prompt' and 'completion'");
  return prompt_example(string_field(record, "prompt", where), string_field(record, "completion", where), tok,
                        max_length, where);
}

}  // namespace

Example next_token_example(const std::vector<int32_t>& text, const Tokenizer& tok, int max_length) {
  Example ex;
  ex.tokens.reserve(text.size() + 2);
  if (tok.bos_id() >= 0) ex.tokens.push_back(tok.bos_id());
  ex.tokens.insert(ex.tokens.end(), text.begin(), text.end());
  ex.tokens.push_back(tok.eos_id());
  if (ex.tokens.size() > static_cast<size_t>(max_length)) {
    ex.tokens.resize(static_cast<size_t>(max_length));
    ex.cut = true;
  }
  ex.targets.assign(ex.tokens.size(), -1);
  for (size_t t = 0; t + 1 < ex.tokens.size(); ++t) ex.targets[t] = ex.tokens[t + 1];
  return ex;
}

std::vector<Example> load_jsonl(const std::string& path, const Tokenizer& tok,
                                const DatasetOptions& opt) {
  SHARDLM_CHECK(opt.max_length >= 2, path, ": max_length must be at least 2, got ", opt.max_length);
  std::vector<Example> examples;
  for_each_record_line(path, [&](const std::string& line, const std::string& where) {
    examples.push_back(parse_line(line, where, tok, opt.max_length));
  });
  SHARDLM_CHECK(!examples.empty(), path, ": no records in the file");
  return select_subset(std::move(examples), opt);
}

}  // namespace shardlm
