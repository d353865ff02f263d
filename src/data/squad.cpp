// load_squad: SQuAD v1.1 JSON to question-answering examples whose loss covers the answer only;
// load_squad_questions: the same questions' ids and reference answers for exact match and F1.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "../core/input_file.hpp"
#include "data_file.hpp"
#include "token_spans.hpp"
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

namespace {

using nlohmann::json;

// One question with its context and answers (training uses the first); `where` names it in
// error messages; `id` is empty when the record has none.
struct QaRecord {
  std::string where;
  std::string id;
  std::string question;
  std::string context;
  std::vector<std::string> answers;
};

const json& member(const json& object, const char* key, const std::string& where) {
  SHARDLM_CHECK(object.is_object(), where, ": expected a JSON object");
  auto it = object.find(key);
  SHARDLM_CHECK(it != object.end(), where, ": missing '", key, "'");
  return *it;
}

const json& array_member(const json& object, const char* key, const std::string& where) {
  const json& value = member(object, key, where);
  SHARDLM_CHECK(value.is_array(), where, ": '", key, "' must be an array");
  return value;
}

std::string string_member(const json& object, const char* key, const std::string& where) {
  const json& value = member(object, key, where);
  SHARDLM_CHECK(value.is_string(), where, ": '", key, "' must be a string");
  return value.get<std::string>();
}

// Walks data[].paragraphs[].qas[] and keeps each question with all its answers.
std::vector<QaRecord> collect_records(const json& root, const std::string& path) {
  std::vector<QaRecord> records;
  const json& articles = array_member(root, "data", path);
  for (size_t a = 0; a < articles.size(); ++a) {
    const std::string article_where = concat(path, ": data[", a, "]");
    const json& paragraphs = array_member(articles[a], "paragraphs", article_where);
    for (size_t p = 0; p < paragraphs.size(); ++p) {
      const std::string paragraph_where = concat(article_where, ".paragraphs[", p, "]");
      const std::string context = string_member(paragraphs[p], "context", paragraph_where);
      const json& qas = array_member(paragraphs[p], "qas", paragraph_where);
      for (size_t q = 0; q < qas.size(); ++q) {
        QaRecord record;
        record.where = concat(paragraph_where, ".qas[", q, "]");
        if (qas[q].is_object() && qas[q].contains("id") && qas[q]["id"].is_string()) {
          record.id = qas[q]["id"].get<std::string>();
          record.where += concat(" (id '", record.id, "')");
        }
        record.question = string_member(qas[q], "question", record.where);
        const json& answers = array_member(qas[q], "answers", record.where);
        SHARDLM_CHECK(!answers.empty(), record.where, ": no answers");
        for (size_t k = 0; k < answers.size(); ++k)
          record.answers.push_back(string_member(answers[k], "text", concat(record.where, ".answers[", k, "]")));
        SHARDLM_CHECK(!record.answers[0].empty(), record.where, ": the first answer is empty");
        record.context = context;
        records.push_back(std::move(record));
      }
    }
  }
  return records;
}

// The prompt "Question: q Context: c Answer:" with the first `context_bytes` of the context.
std::string qa_prompt(const QaRecord& record, size_t context_bytes) {
  return "Question: " + record.question + " Context: " + record.context.substr(0, context_bytes) + " Answer:";
}
std::string qa_answer(const QaRecord& record) { return " " + record.answers[0]; }
size_t qa_tokens(const QaRecord& record, size_t context_bytes, const Tokenizer& tok) {
  return tok.encode(qa_prompt(record, context_bytes) + qa_answer(record)).size();
}

// How many bytes of the context (whole UTF-8 characters) the sample keeps: a start with which prompt
// and answer take at most max_length - specials tokens where one more character would not fit (the
// longest, but for the rare prefixes whose token count falls as a word completes). The first probe is
// where the text's bytes per token put the cut, then steps doubling away from it until a fitting and a
// failing length bracket the answer, then bisection: a few encodings a sample, and these steps exactly
// in bench/check_qa_tokens.py.
size_t context_kept(const QaRecord& record, const Tokenizer& tok, size_t specials, int max_length) {
  const std::string& context = record.context;
  const size_t room = static_cast<size_t>(max_length) - std::min(specials, static_cast<size_t>(max_length));
  const size_t whole = qa_tokens(record, context.size(), tok);
  if (whole <= room) return context.size();
  const size_t none = qa_tokens(record, 0, tok);
  SHARDLM_CHECK(none <= room, record.where, ": the question and answer take ", none + specials,
                " tokens without any context, more than max_length ", max_length);
  size_t lo = 0, hi = context.size();  // a start of lo bytes fits, of hi does not
  const auto inside = [&](size_t at) { return (static_cast<unsigned char>(context[at]) & 0xC0) == 0x80; };
  // A character's start in (lo, hi) at or below `at` (clamped into it), else above; hi when there is none.
  const auto char_start = [&](size_t at) {
    if (hi - lo <= 1) return hi;
    const size_t from = std::clamp(at, lo + 1, hi - 1);
    size_t p = from;
    while (p > lo && inside(p)) --p;
    if (p > lo) return p;
    for (p = from; p < hi && inside(p);) ++p;
    return p;
  };
  const auto probe = [&](size_t at) {
    const bool fits = qa_tokens(record, at, tok) <= room;
    (fits ? lo : hi) = at;
    return fits;
  };
  const double bytes_per_token =
      static_cast<double>(qa_prompt(record, context.size()).size() + qa_answer(record).size()) / double(whole);
  const size_t over = static_cast<size_t>(std::ceil(static_cast<double>(whole - room) * bytes_per_token));
  size_t step = std::max<size_t>(16, static_cast<size_t>(std::ceil(4 * bytes_per_token)));
  size_t at = char_start(context.size() - std::min(context.size(), over));
  if (at != hi && probe(at)) {
    for (; (at = char_start(lo + step)) != hi && probe(at); step *= 2) {
    }
  } else if (at != hi) {
    for (; (at = char_start(hi > step ? hi - step : 0)) != hi && !probe(at); step *= 2) {
    }
  }
  while ((at = char_start(lo + (hi - lo) / 2)) != hi) probe(at);
  return lo;
}

// [BOS] "Question: q Context: c Answer: a" [EOS], tokenized whole (a piece tokenized alone would
// start with a stray "▁" or "Ġ"), the loss on the tokens that overlap the answer and on EOS. Only
// the context shrinks to fit max_length (context_kept).
Example build_example(const QaRecord& record, const Tokenizer& tok, int max_length) {
  const size_t specials = (tok.bos_id() >= 0 ? 1 : 0) + 1;
  const size_t kept = context_kept(record, tok, specials, max_length);
  const PromptCompletionIds qa = encode_prompt_completion(qa_prompt(record, kept), qa_answer(record), tok);
  SHARDLM_CHECK(qa.completion_begin > 0 && qa.completion_begin < qa.ids.size(), record.where,
                ": the tokenizer gives the answer no tokens of its own after the prompt");

  Example ex;
  ex.cut = kept < record.context.size();
  ex.tokens.reserve(qa.ids.size() + specials);
  if (tok.bos_id() >= 0) ex.tokens.push_back(tok.bos_id());
  const size_t answer_begin = ex.tokens.size() + qa.completion_begin;
  ex.tokens.insert(ex.tokens.end(), qa.ids.begin(), qa.ids.end());
  ex.tokens.push_back(tok.eos_id());

  // The last prompt token predicts the first answer token; the last answer token predicts EOS.
  ex.targets.assign(ex.tokens.size(), -1);
  for (size_t t = answer_begin - 1; t + 1 < ex.tokens.size(); ++t) ex.targets[t] = ex.tokens[t + 1];
  return ex;
}

// A whole JSON file; Error naming it when it cannot be read or parsed.
json read_json_file(const std::string& path) {
  const std::string text = read_data_file(path);
  try {
    return parse_json_bounded(text, path);
  } catch (const json::exception& e) {
    throw Error(concat(path, ": not valid JSON: ", e.what()));
  }
}

std::vector<QaRecord> read_records(const std::string& path) {
  const json root = read_json_file(path);
  std::vector<QaRecord> records = collect_records(root, path);
  SHARDLM_CHECK(!records.empty(), path, ": no question records in the file");
  return records;
}

}  // namespace

std::vector<Example> load_squad(const std::string& path, const Tokenizer& tok,
                                const DatasetOptions& opt) {
  SHARDLM_CHECK(opt.max_length >= 2, path, ": max_length must be at least 2, got ", opt.max_length);
  const std::vector<QaRecord> records = read_records(path);
  // Only the records the subset keeps are tokenized (a deck's 250 of SQuAD's 87,599).
  std::vector<Example> examples;
  for (size_t index : subset_indices(records.size(), opt))
    examples.push_back(build_example(records[index], tok, opt.max_length));
  return examples;
}

std::vector<SquadQuestion> load_squad_questions(const std::string& path, const DatasetOptions& opt) {
  const std::vector<QaRecord> records = read_records(path);
  std::vector<SquadQuestion> questions;
  for (size_t index : subset_indices(records.size(), opt)) {
    const QaRecord& record = records[index];
    // Predictions are keyed by id, so a question without one could never be scored.
    SHARDLM_CHECK(!record.id.empty(), record.where, ": missing string 'id' (needed to score predictions)");
    questions.push_back({record.id, record.answers});
  }
  return questions;
}

std::unordered_map<std::string, std::string> read_squad_predictions(const std::string& path) {
  const json root = read_json_file(path);
  SHARDLM_CHECK(root.is_object(), path,
                ": expected a JSON object of question id -> predicted answer (the official script's input)");
  std::unordered_map<std::string, std::string> predictions;
  for (const auto& [id, answer] : root.items()) {
    SHARDLM_CHECK(answer.is_string(), path, ": the prediction of '", id, "' must be a string");
    predictions[id] = answer.get<std::string>();
  }
  return predictions;
}

}  // namespace shardlm
