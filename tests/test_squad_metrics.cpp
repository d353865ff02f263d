#define BOOST_TEST_MODULE test_squad_metrics
#include <boost/test/unit_test.hpp>

// Tests of the SQuAD v1.1 metrics against values worked out by hand from the official
// evaluate-v1.1.py definition, and of reading every reference answer of a SQuAD file.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardlm/core.hpp"
#include "shardlm/data.hpp"
#include "test_support.hpp"

using namespace shardlm;
namespace tt = boost::test_tools;

namespace {

const std::string kMultiAnswer = SHARDLM_SOURCE_DIR "/tests/fixtures/data/squad_multi_answer.json";

}  // namespace

BOOST_AUTO_TEST_CASE(normalisation_lowers_strips_punctuation_and_articles) {
  BOOST_TEST(squad_normalize_answer("The Denver Broncos!") == "denver broncos");
  // Every lone "a" goes; the runs of spaces they and the punctuation leave collapse.
  BOOST_TEST(squad_normalize_answer("  A  man,   a plan;  a canal: Panama ") == "man plan canal panama");
  // Punctuation goes before articles: "the-end" becomes one word "theend", not an article.
  BOOST_TEST(squad_normalize_answer("the-end") == "theend");
  BOOST_TEST(squad_normalize_answer("an_apple") == "anapple");  // '_' is in string.punctuation
  BOOST_TEST(squad_normalize_answer("a.m.") == "am");
  BOOST_TEST(squad_normalize_answer("theater") == "theater");   // articles are whole words only
  BOOST_TEST(squad_normalize_answer("The 'the'") == "");
  BOOST_TEST(squad_normalize_answer("") == "");
}

BOOST_AUTO_TEST_CASE(normalisation_treats_unicode_as_python_does) {
  // string.punctuation is ASCII only: curly quotes and the em dash stay.
  BOOST_TEST(squad_normalize_answer("\u201CDenver\u201D \u2014 Broncos") == "\u201Cdenver\u201D \u2014 broncos");
  // str.lower() lowers non-ASCII letters too.
  BOOST_TEST(squad_normalize_answer("\u00C9COLE Normale") == "\u00E9cole normale");
  BOOST_TEST(squad_normalize_answer("\u0130stanbul") == "i\u0307stanbul");  // İ lowers to two code points
  // \b is Unicode-aware: the em dash ends the word "the", but "é" continues the word "a".
  BOOST_TEST(squad_normalize_answer("the\u2014end") == "\u2014end");
  BOOST_TEST(squad_normalize_answer("a\u00E9") == "a\u00E9");
  // str.split() splits at no-break space and at U+001C..U+001F.
  BOOST_TEST(squad_normalize_answer("Denver\u00A0Broncos") == "denver broncos");
  BOOST_TEST(squad_normalize_answer("x\x1Cy") == "x y");
  // Invalid UTF-8 reads as U+FFFD (errors="replace").
  BOOST_TEST(squad_normalize_answer("caf\xC3") == "caf\uFFFD");
}

BOOST_AUTO_TEST_CASE(exact_match_and_f1_of_single_references) {
  BOOST_TEST(squad_exact_match("the Denver Broncos.", "Denver Broncos") == 1.0);
  BOOST_TEST(squad_exact_match("Denver", "Denver Broncos") == 0.0);
  // 1 of 1 predicted tokens right, 1 of 2 wanted: P 1, R 1/2, F1 2/3.
  BOOST_TEST(squad_f1("Denver", "Denver Broncos") == 2.0 / 3.0, tt::tolerance(1e-12));
  // Bags, not sets: [cat cat sat] vs [cat sat on mat] share cat once and sat: P 2/3, R 1/2, F1 4/7.
  BOOST_TEST(squad_f1("the cat the cat sat", "cat sat on the mat") == 4.0 / 7.0, tt::tolerance(1e-12));
  // [“denver” — broncos] vs [denver broncos]: only broncos is shared: P 1/3, R 1/2, F1 2/5.
  BOOST_TEST(squad_f1("\u201CDenver\u201D \u2014 Broncos", "Denver Broncos") == 0.4, tt::tolerance(1e-12));
  BOOST_TEST(squad_exact_match("\u201CDenver\u201D \u2014 Broncos", "Denver Broncos") == 0.0);
  // "1,000" is the token "1000": P 1/2, R 1, F1 2/3.
  BOOST_TEST(squad_f1("1000 men", "1,000") == 2.0 / 3.0, tt::tolerance(1e-12));
  BOOST_TEST(squad_f1("Carolina Panthers", "Denver Broncos") == 0.0);
}

BOOST_AUTO_TEST_CASE(empty_prediction) {
  BOOST_TEST(squad_exact_match("", "Denver Broncos") == 0.0);
  BOOST_TEST(squad_f1("", "Denver Broncos") == 0.0);
  // Both sides normalise to "": an exact match, but no common token, so F1 0.
  BOOST_TEST(squad_exact_match("", "The") == 1.0);
  BOOST_TEST(squad_f1("", "The") == 0.0);
}

BOOST_AUTO_TEST_CASE(best_score_over_references) {
  const std::vector<std::string> refs = {"Denver Broncos", "The Denver Broncos", "Broncos"};
  BOOST_TEST(squad_best_exact_match("denver broncos", refs) == 1.0);
  BOOST_TEST(squad_best_f1("denver broncos", refs) == 1.0);
  // "Broncos": exact against the third reference.
  BOOST_TEST(squad_best_exact_match("Broncos", refs) == 1.0);
  // "Denver": F1 2/3 against the first two, 0 against the third.
  BOOST_TEST(squad_best_exact_match("Denver", refs) == 0.0);
  BOOST_TEST(squad_best_f1("Denver", refs) == 2.0 / 3.0, tt::tolerance(1e-12));
  BOOST_TEST(squad_best_f1("Denver", {}) == 0.0);
}

BOOST_AUTO_TEST_CASE(reference_answers_and_ids_of_a_squad_file) {
  const std::vector<SquadQuestion> questions = load_squad_questions(kMultiAnswer, DatasetOptions{});
  BOOST_TEST_REQUIRE(questions.size() == 3u);
  BOOST_TEST(questions[0].id == "q-winner");
  BOOST_TEST(questions[0].answers == (std::vector<std::string>{"Denver Broncos", "The Denver Broncos", "Broncos"}),
             tt::per_element());
  BOOST_TEST(questions[1].id == "q-score");
  BOOST_TEST(questions[1].answers.size() == 1u);
  BOOST_TEST(questions[2].id == "q-river");
  BOOST_TEST(questions[2].answers.size() == 2u);

  // Training still uses the first answer only: the target text is " Denver Broncos" + EOS.
  ByteTokenizer tok;
  const std::vector<Example> examples = load_squad(kMultiAnswer, tok, DatasetOptions{});
  BOOST_TEST_REQUIRE(examples.size() == 3u);
  std::vector<int32_t> answer;
  for (int32_t t : examples[0].targets)
    if (t >= 0) answer.push_back(t);
  BOOST_TEST(tok.decode(answer) == " Denver Broncos");
  BOOST_TEST(answer.back() == ByteTokenizer::kEos);
}

BOOST_AUTO_TEST_CASE(questions_follow_the_examples_subset) {
  // 5 of the demo eval set's 40 questions: the same seeded subset must pick the same records.
  const std::string eval = SHARDLM_SOURCE_DIR "/input/data/demo_squad_eval.json";
  DatasetOptions opt;
  opt.limit = 5;
  opt.seed = 7;
  opt.shuffle_subset = true;
  ByteTokenizer tok;
  const std::vector<Example> examples = load_squad(eval, tok, opt);
  const std::vector<SquadQuestion> questions = load_squad_questions(eval, opt);
  BOOST_TEST_REQUIRE(questions.size() == examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    std::vector<int32_t> answer;
    for (int32_t t : examples[i].targets)
      if (t >= 0 && t != ByteTokenizer::kEos) answer.push_back(t);
    BOOST_TEST(tok.decode(answer) == " " + questions[i].answers[0]);
  }
}

BOOST_AUTO_TEST_CASE(scores_over_a_file_count_unanswered_questions) {
  const std::vector<SquadQuestion> questions = load_squad_questions(kMultiAnswer, DatasetOptions{});
  // q-winner: exact (third reference). q-score: "24 10" normalises to "24 10", not "2410": EM 0,
  // F1 0. q-river: no prediction, scores 0 but counts.
  SquadScores s = squad_scores(questions, {{"q-winner", "Broncos"}, {"q-score", "24 10"}});
  BOOST_TEST(s.questions == 3u);
  BOOST_TEST(s.answered == 2u);
  BOOST_TEST(s.exact_match == 100.0 / 3.0, tt::tolerance(1e-12));
  BOOST_TEST(s.f1 == 100.0 / 3.0, tt::tolerance(1e-12));

  // "Casor": F1 against "Casor River" is P 1, R 1/2 = 2/3, the same against "the Casor River".
  s = squad_scores(questions, {{"q-winner", "Denver"}, {"q-score", "24-10"}, {"q-river", "Casor"}});
  BOOST_TEST(s.answered == 3u);
  BOOST_TEST(s.exact_match == 100.0 / 3.0, tt::tolerance(1e-12));
  BOOST_TEST(s.f1 == 100.0 * (2.0 / 3.0 + 1.0 + 2.0 / 3.0) / 3.0, tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(question_without_id_is_named) {
  const std::string msg = error_of([] {
    load_squad_questions(SHARDLM_SOURCE_DIR "/tests/fixtures/data/squad_no_id.json", DatasetOptions{});
  });
  BOOST_TEST(contains(msg, "squad_no_id.json"));
  BOOST_TEST(contains(msg, "qas[0]"));
  BOOST_TEST(contains(msg, "'id'"));
}

// ---- against the official script on Unicode text ------------------------------------------
// tests/fixtures/squad_unicode/expected.json holds what the official evaluate-v1.1.py (run by
// make_fixture.py under Python 3) makes of each pair and of the whole file: Greek final sigma,
// Unicode digits beside articles, combining marks, CJK, Unicode spaces and other case mappings.

namespace {

const std::string kUnicodeDir = SHARDLM_SOURCE_DIR "/tests/fixtures/squad_unicode";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  BOOST_TEST_REQUIRE(in.good(), path);
  return nlohmann::json::parse(in);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_pair_scores_as_the_official_script_does) {
  const nlohmann::json expected = read_json(kUnicodeDir + "/expected.json");
  BOOST_TEST_REQUIRE(expected.at("pairs").size() > 30u);
  for (const nlohmann::json& p : expected["pairs"]) {
    const std::string prediction = p["prediction"], answer = p["answer"];
    BOOST_TEST(squad_normalize_answer(prediction) == p["prediction_normalized"].get<std::string>(), prediction);
    BOOST_TEST(squad_normalize_answer(answer) == p["answer_normalized"].get<std::string>(), answer);
    BOOST_TEST(squad_exact_match(prediction, answer) == p["exact_match"].get<double>(), prediction << " / " << answer);
    BOOST_TEST(squad_f1(prediction, answer) == p["f1"].get<double>(), tt::tolerance(1e-12));
  }
}

BOOST_AUTO_TEST_CASE(a_predictions_file_scores_as_the_official_script_does) {
  const nlohmann::json expected = read_json(kUnicodeDir + "/expected.json");
  const SquadScores s = squad_scores(load_squad_questions(kUnicodeDir + "/dev.json", DatasetOptions{}),
                                     read_squad_predictions(kUnicodeDir + "/predictions.json"));
  BOOST_TEST(s.questions == expected["pairs"].size());  // one case has two answers; one question has no prediction
  BOOST_TEST(s.answered == s.questions - 1);
  BOOST_TEST(s.exact_match == expected["exact_match"].get<double>(), tt::tolerance(1e-12));
  BOOST_TEST(s.f1 == expected["f1"].get<double>(), tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(a_malformed_predictions_file_is_named) {
  const std::string dir = SHARDLM_BINARY_DIR "/test_runs/squad_predictions";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/list.json") << "[\"a\"]";
  std::ofstream(dir + "/number.json") << "{\"q1\": \"x\", \"q2\": 3}";
  BOOST_TEST(contains(error_of([&] { read_squad_predictions(dir + "/list.json"); }), "list.json"));
  const std::string msg = error_of([&] { read_squad_predictions(dir + "/number.json"); });
  BOOST_TEST(contains(msg, "number.json"), msg);
  BOOST_TEST(contains(msg, "'q2'"), msg);
  BOOST_TEST(contains(error_of([&] { read_squad_predictions(dir + "/missing.json"); }), "missing.json"));
}
