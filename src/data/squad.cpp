// load_squad: SQuAD v1.1 JSON to question-answering examples whose loss covers the answer only;
// load_squad_questions: the same questions' ids and reference answers for exact match and F1.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "../core/input_file.hpp"
#include "data_file.hpp"
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

// [BOS] "Question: q Context: c Answer:" " a" [EOS]; only the context shrinks to fit max_length.
Example build_example(const QaRecord& record, const Tokenizer& tok, int max_length) {
  const std::vector<int32_t> head = tok.encode("Question: " + record.question + " Context: ");
  const std::vector<int32_t> context = tok.encode(record.context);
  const std::vector<int32_t> tail = tok.encode(" Answer:");
  const std::vector<int32_t> answer = tok.encode(" " + record.answers[0]);
  const bool bos = tok.bos_id() >= 0;
  const size_t fixed = (bos ? 1 : 0) + head.size() + tail.size() + answer.size() + 1;
  SHARDLM_CHECK(fixed <= static_cast<size_t>(max_length), record.where,
                ": the question and answer take ", fixed,
                " tokens without any context, more than max_length ", max_length);
  const size_t kept = std::min(context.size(), static_cast<size_t>(max_length) - fixed);

  Example ex;
  ex.tokens.reserve(fixed + kept);
  if (bos) ex.tokens.push_back(tok.bos_id());
  ex.tokens.insert(ex.tokens.end(), head.begin(), head.end());
  ex.tokens.insert(ex.tokens.end(), context.begin(),
                   context.begin() + static_cast<std::ptrdiff_t>(kept));
  ex.tokens.insert(ex.tokens.end(), tail.begin(), tail.end());
  const size_t answer_begin = ex.tokens.size();
  ex.tokens.insert(ex.tokens.end(), answer.begin(), answer.end());
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
  std::vector<Example> examples;
  examples.reserve(records.size());
  for (const QaRecord& record : records)
    examples.push_back(build_example(record, tok, opt.max_length));
  return select_subset(std::move(examples), opt);
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
