#define BOOST_TEST_MODULE test_data
#include <boost/test/unit_test.hpp>

// Tests of the data module: byte tokenizer, SQuAD and JSONL readers, micro-batches, sampler.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "shardlm/core.hpp"
#include "shardlm/data.hpp"
#include "temp_dir.hpp"
#include "test_support.hpp"

using namespace shardlm;
namespace fs = std::filesystem;

namespace {

const std::string kSourceDir = SHARDLM_SOURCE_DIR;
const std::string kSquadTrain = kSourceDir + "/input/data/demo_squad_train.json";
const std::string kSquadEval = kSourceDir + "/input/data/demo_squad_eval.json";
const std::string kDemoText = kSourceDir + "/input/data/demo_text.jsonl";
// What load_squad should see in a SQuAD file, read independently with nlohmann-json.
struct SquadRecord {
  std::string question;
  std::string context;
  std::string answer;
  size_t answer_start = 0;  // in code points, as SQuAD counts
};

std::vector<SquadRecord> read_squad_records(const std::string& path) {
  std::ifstream in(path);
  const nlohmann::json root = nlohmann::json::parse(in);
  std::vector<SquadRecord> records;
  for (const auto& article : root.at("data")) {
    for (const auto& paragraph : article.at("paragraphs")) {
      for (const auto& qa : paragraph.at("qas")) {
        SquadRecord r;
        r.question = qa.at("question").get<std::string>();
        r.context = paragraph.at("context").get<std::string>();
        r.answer = qa.at("answers").at(0).at("text").get<std::string>();
        r.answer_start = qa.at("answers").at(0).at("answer_start").get<size_t>();
        records.push_back(r);
      }
    }
  }
  return records;
}

// Byte offset of code point `n` of a UTF-8 string.
size_t byte_offset_of_code_point(const std::string& text, size_t n) {
  size_t seen = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool starts_code_point = (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
    if (starts_code_point && seen++ == n) return i;
  }
  return text.size();
}

std::vector<int32_t> loss_ids(const Example& ex) {
  std::vector<int32_t> ids;
  for (int32_t t : ex.targets) {
    if (t >= 0) ids.push_back(t);
  }
  return ids;
}

// Every loss position predicts the next token, and the last position predicts nothing.
void check_next_token_targets(const Example& ex) {
  BOOST_REQUIRE_EQUAL(ex.tokens.size(), ex.targets.size());
  BOOST_REQUIRE(!ex.tokens.empty());
  BOOST_TEST(ex.targets.back() == -1);
  for (size_t t = 0; t + 1 < ex.tokens.size(); ++t) {
    if (ex.targets[t] >= 0) BOOST_TEST(ex.targets[t] == ex.tokens[t + 1]);
  }
}

std::string squad_file(const std::string& qas_json) {
  return R"({"version":"1.1","data":[{"title":"T","paragraphs":[{"context":"The sky is blue.","qas":)" +
         qas_json + "}]}]}";
}

std::vector<int32_t> ids_of(const std::string& text) { return ByteTokenizer().encode(text); }

// A malformed data file: its name, what it holds and the parts its error message must name.
struct BadFile {
  std::string name;
  std::string content;
  std::vector<std::string> expected;
};

// Each file written into tmp and loaded: the error names every expected part. Then a file that is not
// there (`missing` in tmp): the error names it.
void check_bad_files(const TempDir& tmp, const std::vector<BadFile>& files, const std::string& missing,
                     const std::function<void(const std::string&)>& load) {
  for (const BadFile& f : files) {
    const std::string path = tmp.write(f.name, f.content);
    const std::string msg = error_of([&] { load(path); });
    for (const std::string& part : f.expected)
      BOOST_TEST(contains(msg, part), f.name << ": " << msg);
  }
  const std::string path = (tmp.root / missing).string();
  BOOST_TEST(error_of([&] { load(path); }) == "cannot open data file '" + path + "'");
}

}  // namespace

// ---- tokenizer ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(tokenizer_round_trips_utf8) {
  ByteTokenizer tok;
  BOOST_TEST(tok.vocab_size() == 259);
  const std::vector<std::string> samples = {
      "Hello, world!", "café naïve Ångström", "北京市", "emoji 🙂🚀", "", "tab\tnew\nline"};
  for (const std::string& s : samples) {
    const std::vector<int32_t> ids = tok.encode(s);
    BOOST_TEST(ids.size() == s.size());
    for (int32_t id : ids) BOOST_TEST((id >= 0 && id < 256));
    BOOST_TEST(tok.decode(ids) == s);
  }
  BOOST_TEST(tok.encode("é") == (std::vector<int32_t>{0xC3, 0xA9}),
             boost::test_tools::per_element());
  BOOST_TEST(tok.encode("🙂") == (std::vector<int32_t>{0xF0, 0x9F, 0x99, 0x82}),
             boost::test_tools::per_element());
  BOOST_TEST(tok.encode("A") == std::vector<int32_t>{65}, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(tokenizer_decode_drops_special_ids) {
  ByteTokenizer tok;
  const std::vector<int32_t> ids = {ByteTokenizer::kBos, 'h', 'i', ByteTokenizer::kEos,
                                    ByteTokenizer::kPad, -1};
  BOOST_TEST(tok.decode(ids) == "hi");
}

// ---- SQuAD ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(demo_squad_files_have_correct_answer_offsets) {
  for (const std::string& path : {kSquadTrain, kSquadEval}) {
    for (const SquadRecord& r : read_squad_records(path)) {
      const size_t begin = byte_offset_of_code_point(r.context, r.answer_start);
      BOOST_TEST(r.context.substr(begin, r.answer.size()) == r.answer);
    }
  }
  BOOST_TEST(read_squad_records(kSquadTrain).size() == 200u);
  BOOST_TEST(read_squad_records(kSquadEval).size() == 40u);
}

BOOST_AUTO_TEST_CASE(demo_squad_eval_facts_differ_from_train) {
  std::set<std::string> train_contexts;
  for (const SquadRecord& r : read_squad_records(kSquadTrain)) train_contexts.insert(r.context);
  for (const SquadRecord& r : read_squad_records(kSquadEval))
    BOOST_TEST(train_contexts.count(r.context) == 0u);
}

BOOST_AUTO_TEST_CASE(squad_prompt_and_targets_align) {
  ByteTokenizer tok;
  for (const std::string& path : {kSquadTrain, kSquadEval}) {
    const std::vector<SquadRecord> records = read_squad_records(path);
    const std::vector<Example> examples = load_squad(path, tok, DatasetOptions{});
    BOOST_REQUIRE_EQUAL(examples.size(), records.size());
    for (size_t i = 0; i < examples.size(); ++i) {
      const Example& ex = examples[i];
      const SquadRecord& r = records[i];
      check_next_token_targets(ex);
      BOOST_TEST(ex.tokens.front() == ByteTokenizer::kBos);
      BOOST_TEST(ex.tokens.back() == ByteTokenizer::kEos);
      BOOST_TEST(tok.decode(ex.tokens) ==
                 "Question: " + r.question + " Context: " + r.context + " Answer: " + r.answer);

      // The loss covers exactly " answer" then EOS, on consecutive positions ending before EOS.
      const std::vector<int32_t> targets = loss_ids(ex);
      BOOST_REQUIRE(!targets.empty());
      BOOST_TEST(targets.back() == ByteTokenizer::kEos);
      BOOST_TEST(tok.decode(targets) == " " + r.answer);
      BOOST_TEST(targets.size() == r.answer.size() + 2);
      const size_t first = ex.tokens.size() - 1 - targets.size();
      for (size_t t = 0; t < ex.tokens.size(); ++t) {
        BOOST_TEST((ex.targets[t] >= 0) == (t >= first && t + 1 < ex.tokens.size()));
      }
      // The first loss position is the ':' closing "Answer:".
      BOOST_TEST(ex.tokens[first] == ':');
    }
  }
}

BOOST_AUTO_TEST_CASE(squad_truncates_only_the_context) {
  ByteTokenizer tok;
  const std::vector<SquadRecord> records = read_squad_records(kSquadTrain);
  // Room for every question and answer, but far too little for most contexts.
  size_t max_fixed = 0;
  for (const SquadRecord& r : records) {
    max_fixed = std::max(max_fixed, std::string("Question:  Context:  Answer: ").size() +
                                        r.question.size() + r.answer.size() + 2);
  }
  DatasetOptions opt;
  opt.max_length = static_cast<int>(max_fixed) + 5;
  const std::vector<Example> examples = load_squad(kSquadTrain, tok, opt);
  BOOST_REQUIRE_EQUAL(examples.size(), records.size());
  size_t truncated = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& ex = examples[i];
    const SquadRecord& r = records[i];
    check_next_token_targets(ex);
    const size_t full = 2 + std::string("Question:  Context:  Answer: ").size() +
                        r.question.size() + r.context.size() + r.answer.size();
    const size_t expected = std::min(full, static_cast<size_t>(opt.max_length));
    BOOST_TEST(ex.tokens.size() == expected);
    truncated += full > expected ? 1 : 0;
    const std::string kept_context = r.context.substr(0, r.context.size() - (full - expected));
    BOOST_TEST(tok.decode(ex.tokens) ==
               "Question: " + r.question + " Context: " + kept_context + " Answer: " + r.answer);
    BOOST_TEST(ex.tokens.back() == ByteTokenizer::kEos);
    BOOST_TEST(tok.decode(loss_ids(ex)) == " " + r.answer);
  }
  BOOST_TEST(truncated > examples.size() / 2);
}

BOOST_AUTO_TEST_CASE(squad_too_small_max_length_names_record) {
  DatasetOptions opt;
  opt.max_length = 20;
  const std::string msg = error_of([&] { load_squad(kSquadTrain, ByteTokenizer(), opt); });
  BOOST_TEST(contains(msg, "demo_squad_train.json"), msg);
  BOOST_TEST(contains(msg, "data[0].paragraphs[0].qas[0]"), msg);
  BOOST_TEST(contains(msg, "max_length 20"), msg);
}

BOOST_AUTO_TEST_CASE(squad_malformed_files_throw_with_file_name) {
  TempDir tmp{"data"};
  ByteTokenizer tok;
  DatasetOptions opt;
  const std::vector<BadFile> files = {
      {"missing_answers.json",
       squad_file(R"([{"id":"q1","question":"What colour?"}])"),
       {"missing_answers.json", "data[0].paragraphs[0].qas[0]", "'q1'", "missing 'answers'"}},
      {"no_answers.json",
       squad_file(R"([{"id":"q1","question":"A?","answers":[{"text":"blue","answer_start":11}]},
                                         {"id":"q2","question":"B?","answers":[]}])"),
       {"no_answers.json", "qas[1]", "'q2'", "no answers"}},
      {"bad_json.json",
       R"({"version":"1.1","data":[{"title":"T",)",
       {"bad_json.json", "not valid JSON"}},
      {"no_data.json", R"({"version":"1.1"})", {"no_data.json", "missing 'data'"}},
      {"missing_context.json",
       R"({"data":[{"paragraphs":[{"context":"x","qas":[]},{"qas":[]}]}]})",
       {"missing_context.json", "data[0].paragraphs[1]", "missing 'context'"}},
      {"question_not_string.json",
       squad_file(R"([{"question":7,"answers":[{"text":"blue"}]}])"),
       {"question_not_string.json", "qas[0]", "'question' must be a string"}},
      {"empty.json", R"({"version":"1.1","data":[]})", {"empty.json", "no question records"}},
  };
  check_bad_files(tmp, files, "nowhere.json", [&](const std::string& path) { load_squad(path, tok, opt); });
  const std::string dir_msg = error_of([&] { load_squad(tmp.root.string(), tok, opt); });
  BOOST_TEST(contains(dir_msg, "cannot open data file"), dir_msg);
}

BOOST_AUTO_TEST_CASE(squad_subset_selection_is_deterministic) {
  ByteTokenizer tok;
  const std::vector<Example> all = load_squad(kSquadTrain, tok, DatasetOptions{});
  auto position_in_all = [&](const Example& ex) {
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i].tokens == ex.tokens) return i;
    }
    BOOST_ERROR("subset example not found in the full set");
    return all.size();
  };
  auto positions = [&](const std::vector<Example>& subset) {
    std::vector<size_t> out;
    for (const Example& ex : subset) out.push_back(position_in_all(ex));
    return out;
  };

  DatasetOptions first;
  first.limit = 10;
  const std::vector<size_t> head = positions(load_squad(kSquadTrain, tok, first));
  BOOST_TEST(head == (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}),
             boost::test_tools::per_element());

  DatasetOptions seeded = first;
  seeded.shuffle_subset = true;
  seeded.seed = 7;
  const std::vector<size_t> a = positions(load_squad(kSquadTrain, tok, seeded));
  const std::vector<size_t> b = positions(load_squad(kSquadTrain, tok, seeded));
  BOOST_TEST(a == b, boost::test_tools::per_element());
  BOOST_TEST(a.size() == 10u);
  BOOST_TEST(std::is_sorted(a.begin(), a.end()));
  BOOST_TEST(std::set<size_t>(a.begin(), a.end()).size() == 10u);
  BOOST_TEST(a != head);
  // The subset is what the seeded permutation puts first, whatever the loader.
  std::vector<size_t> expected = seeded_permutation(all.size(), 7);
  expected.resize(10);
  std::sort(expected.begin(), expected.end());
  BOOST_TEST(a == expected, boost::test_tools::per_element());

  DatasetOptions other_seed = seeded;
  other_seed.seed = 8;
  BOOST_TEST(positions(load_squad(kSquadTrain, tok, other_seed)) != a);

  // Growing the limit only adds examples.
  DatasetOptions larger = seeded;
  larger.limit = 20;
  const std::vector<size_t> c = positions(load_squad(kSquadTrain, tok, larger));
  BOOST_TEST(std::includes(c.begin(), c.end(), a.begin(), a.end()));

  DatasetOptions everything = seeded;
  everything.limit = 10000;
  BOOST_TEST(load_squad(kSquadTrain, tok, everything).size() == all.size());
}

// ---- JSONL ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(jsonl_demo_text_and_prompt_targets) {
  ByteTokenizer tok;
  const std::vector<Example> examples = load_jsonl(kDemoText, tok, DatasetOptions{});
  BOOST_REQUIRE_EQUAL(examples.size(), 35u);  // 30 text lines, 5 prompt/completion, 1 blank

  const Example& text = examples[0];
  const std::string sentence = "The river Varne flows slowly past the old mill at Ashford.";
  std::vector<int32_t> expected = {ByteTokenizer::kBos};
  for (int32_t id : ids_of(sentence)) expected.push_back(id);
  expected.push_back(ByteTokenizer::kEos);
  BOOST_TEST(text.tokens == expected, boost::test_tools::per_element());
  check_next_token_targets(text);
  for (size_t t = 0; t + 1 < text.tokens.size(); ++t)
    BOOST_TEST(text.targets[t] == text.tokens[t + 1]);

  const Example& pair = examples[30];
  const std::string prompt = "Translate to French: good morning\nAnswer:";
  check_next_token_targets(pair);
  BOOST_TEST(pair.tokens.size() == prompt.size() + std::string(" bonjour").size() + 2);
  BOOST_TEST(tok.decode(pair.tokens) == prompt + " bonjour");
  const std::vector<int32_t> targets = loss_ids(pair);
  BOOST_TEST(tok.decode(targets) == " bonjour");
  BOOST_TEST(targets.back() == ByteTokenizer::kEos);
  // The first loss position is the last prompt byte (index prompt.size(), after BOS).
  for (size_t t = 0; t < pair.tokens.size(); ++t) {
    BOOST_TEST((pair.targets[t] >= 0) == (t >= prompt.size() && t + 1 < pair.tokens.size()));
  }
  for (const Example& ex : examples) check_next_token_targets(ex);
}

// A UTF-8 byte-order mark (as Windows editors save) is not part of the first record, in every format.
BOOST_AUTO_TEST_CASE(a_byte_order_mark_changes_nothing) {
  TempDir tmp{"bom"};
  const std::string bom = "\xEF\xBB\xBF";
  ByteTokenizer tok;
  const std::string jsonl = "{\"prompt\": \"Hi\", \"completion\": \" there\"}\n{\"text\": \"plain\"}\n";
  const std::string chess = "{\"Moves\": [\"e2e4\", \"e7e5\"]}\n";
  const std::string squad = read_text_file(kSquadTrain);
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"a.jsonl", jsonl}, {"c.jsonl", chess}, {"s.json", squad}}) {
    BOOST_TEST_CONTEXT(name) {
      const std::string plain = tmp.write("plain_" + name, text), marked = tmp.write("bom_" + name, bom + text);
      const auto load = [&](const std::string& path) {
        return name == "a.jsonl"   ? load_jsonl(path, tok, DatasetOptions{})
               : name == "c.jsonl" ? load_chess(path, tok, DatasetOptions{})
                                   : load_squad(path, tok, DatasetOptions{});
      };
      const std::vector<Example> a = load(plain), b = load(marked);
      BOOST_TEST_REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) BOOST_TEST((a[i].tokens == b[i].tokens && a[i].targets == b[i].targets));
    }
  }
}

// A tokenizer without BOS (Qwen's): the prompt's last token predicts the completion's first, so a completion
// that leaves it no room is refused as such, not as "an empty prompt".
BOOST_AUTO_TEST_CASE(a_completion_without_room_for_the_prompt_says_so) {
  struct NoBos final : Tokenizer {
    ByteTokenizer bytes;
    std::vector<int32_t> encode(const std::string& text) const override { return bytes.encode(text); }
    std::string decode(const std::vector<int32_t>& ids) const override { return bytes.decode(ids); }
    int32_t bos_id() const override { return -1; }
    int32_t eos_id() const override { return ByteTokenizer::kEos; }
    int32_t pad_id() const override { return ByteTokenizer::kPad; }
    int32_t vocab_size() const override { return 259; }
  } tok;
  TempDir tmp{"nobos"};
  const std::string path = tmp.write("p.jsonl", "{\"prompt\": \"Question?\", \"completion\": \"abcdef\"}\n");
  DatasetOptions opt;
  opt.max_length = 7;  // the completion and EOS: no room for a prompt token
  const std::string msg = error_of([&] { load_jsonl(path, tok, opt); });
  BOOST_TEST(contains(msg, "leaves no room in max_length 7 for the prompt's last token"), msg);
  opt.max_length = 8;  // one prompt token: '?' predicts 'a'
  const Example ex = load_jsonl(path, tok, opt).at(0);
  BOOST_TEST(ex.tokens.size() == 8u);
  BOOST_TEST(ex.targets[0] == 'a');
  const std::string empty = tmp.write("e.jsonl", "{\"prompt\": \"\", \"completion\": \"abc\"}\n");
  BOOST_TEST(contains(error_of([&] { load_jsonl(empty, tok, DatasetOptions{}); }), "an empty prompt needs a tokenizer with a BOS"));
}

BOOST_AUTO_TEST_CASE(jsonl_truncation) {
  TempDir tmp{"data"};
  ByteTokenizer tok;
  const std::string long_text(50, 'x');
  const std::string path =
      tmp.write("trunc.jsonl", "{\"text\": \"" + long_text + "\"}\n" +
                                   R"({"prompt": "0123456789abcdefghij", "completion": "OK"})" +
                                   "\n" + R"({"prompt": "", "completion": ""})" + "\n");
  DatasetOptions opt;
  opt.max_length = 12;
  const std::vector<Example> examples = load_jsonl(path, tok, opt);
  BOOST_REQUIRE_EQUAL(examples.size(), 3u);

  // Text: the first max_length tokens, so EOS is cut and every position still predicts.
  BOOST_TEST(examples[0].tokens.size() == 12u);
  BOOST_TEST(examples[0].tokens[0] == ByteTokenizer::kBos);
  BOOST_TEST(tok.decode(examples[0].tokens) == std::string(11, 'x'));
  BOOST_TEST(loss_ids(examples[0]).size() == 11u);
  check_next_token_targets(examples[0]);

  // Prompt/completion: the prompt loses its beginning; completion and EOS stay.
  const Example& pc = examples[1];
  BOOST_TEST(pc.tokens.size() == 12u);
  BOOST_TEST(pc.tokens.front() == ByteTokenizer::kBos);
  BOOST_TEST(tok.decode(pc.tokens) == "cdefghijOK");
  BOOST_TEST(pc.tokens.back() == ByteTokenizer::kEos);
  BOOST_TEST(tok.decode(loss_ids(pc)) == "OK");
  BOOST_TEST(loss_ids(pc).size() == 3u);
  check_next_token_targets(pc);

  // Empty prompt and completion: BOS predicts EOS.
  BOOST_TEST(examples[2].tokens == (std::vector<int32_t>{ByteTokenizer::kBos, ByteTokenizer::kEos}),
             boost::test_tools::per_element());
  BOOST_TEST(examples[2].targets == (std::vector<int32_t>{ByteTokenizer::kEos, -1}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(jsonl_malformed_lines_name_file_and_line) {
  TempDir tmp{"data"};
  ByteTokenizer tok;
  DatasetOptions opt;
  opt.max_length = 16;
  const std::string ok = R"({"text": "fine"})";
  const std::vector<BadFile> files = {
      {"bad.jsonl",
       ok + "\n\n" + R"({"text": "unterminated)" + "\n",
       {"bad.jsonl:3: not valid JSON"}},
      {"neither.jsonl",
       ok + "\n" + R"({"body": "x"})" + "\n",
       {"neither.jsonl:2:", "'text' or both 'prompt' and 'completion'"}},
      {"half.jsonl", R"({"prompt": "x"})", {"half.jsonl:1:", "'completion'"}},
      {"both.jsonl",
       R"({"text": "x", "prompt": "y", "completion": "z"})",
       {"both.jsonl:1:", "both"}},
      {"not_string.jsonl", R"({"text": 5})", {"not_string.jsonl:1:", "'text' must be a string"}},
      {"array.jsonl", R"(["text"])", {"array.jsonl:1:", "expected a JSON object"}},
      {"long_completion.jsonl",
       ok + "\n" + R"({"prompt": "p", "completion": "0123456789abcdef"})",
       {"long_completion.jsonl:2:", "max_length 16"}},
      {"blank.jsonl", "\n  \n\n", {"blank.jsonl", "no records"}},
  };
  check_bad_files(tmp, files, "nowhere.jsonl", [&](const std::string& path) { load_jsonl(path, tok, opt); });
  // Not a regular file: refused by name before a byte is read (/dev/zero would grow memory forever).
  BOOST_TEST(contains(error_of([&] { load_jsonl("/dev/zero", tok, opt); }), "not a regular file"));
  BOOST_TEST(contains(error_of([&] { load_jsonl(tmp.root.string(), tok, opt); }), "it is a directory"));
  // A 1 MB line that is not JSON: the message shows at most 200 characters of it.
  const std::string huge = tmp.write("huge.jsonl", "{\"text\": " + std::string(1 << 20, 'x') + "\n");
  const std::string huge_msg = error_of([&] { load_jsonl(huge, tok, opt); });
  BOOST_TEST(contains(huge_msg, "huge.jsonl:1: not valid JSON"), huge_msg.substr(0, 300));
  BOOST_TEST(huge_msg.size() < 1000u);
}

BOOST_AUTO_TEST_CASE(jsonl_subset_selection) {
  ByteTokenizer tok;
  const std::vector<Example> all = load_jsonl(kDemoText, tok, DatasetOptions{});
  DatasetOptions opt;
  opt.limit = 5;
  opt.shuffle_subset = true;
  opt.seed = 3;
  const std::vector<Example> subset = load_jsonl(kDemoText, tok, opt);
  std::vector<size_t> chosen = seeded_permutation(all.size(), 3);
  chosen.resize(5);
  std::sort(chosen.begin(), chosen.end());
  BOOST_REQUIRE_EQUAL(subset.size(), 5u);
  for (size_t i = 0; i < 5; ++i) BOOST_TEST(subset[i].tokens == all[chosen[i]].tokens);
}

// ---- micro-batches --------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(micro_batch_pads_to_longest) {
  std::vector<Example> data(3);
  data[0].tokens = {1, 2, 3};
  data[0].targets = {2, 3, -1};
  data[1].tokens = {4, 5, 6, 7, 8};
  data[1].targets = {-1, -1, 7, 8, -1};
  data[2].tokens = {9};
  data[2].targets = {-1};
  const int32_t pad = ByteTokenizer::kPad;

  const MicroBatch mb = make_micro_batch(data, {1, 0, 2}, pad);
  BOOST_TEST(mb.batch == 3);
  BOOST_TEST(mb.seq == 5);
  BOOST_TEST(
      mb.tokens == (std::vector<int32_t>{4, 5, 6, 7, 8, 1, 2, 3, pad, pad, 9, pad, pad, pad, pad}),
      boost::test_tools::per_element());
  BOOST_TEST(
      mb.targets == (std::vector<int32_t>{-1, -1, 7, 8, -1, 2, 3, -1, -1, -1, -1, -1, -1, -1, -1}),
      boost::test_tools::per_element());
  BOOST_TEST(mb.target_count == 4);
  BOOST_TEST(count_targets(data, {1, 0, 2}) == 4);
  BOOST_TEST(count_targets(data, {0, 0}) == 4);

  const MicroBatch single = make_micro_batch(data, {0}, pad);
  BOOST_TEST(single.batch == 1);
  BOOST_TEST(single.seq == 3);
  BOOST_TEST(single.target_count == 2);

  const MicroBatch empty = make_micro_batch(data, {}, pad);
  BOOST_TEST(empty.batch == 0);
  BOOST_TEST(empty.seq == 0);
  BOOST_TEST(empty.tokens.empty());
  BOOST_TEST(empty.targets.empty());
  BOOST_TEST(empty.target_count == 0);
  BOOST_TEST(count_targets(data, {}) == 0);

  BOOST_CHECK_THROW(make_micro_batch(data, {3}, pad), Error);
  BOOST_CHECK_THROW(count_targets(data, {7}), Error);

  // Rounded up to a multiple (the fused attention's shapes), within max_seq, never below the longest:
  // the extra columns are padding without loss.
  const MicroBatch rounded = make_micro_batch(data, {1, 0, 2}, pad, 4, 0);
  BOOST_TEST(rounded.seq == 8);
  BOOST_TEST(rounded.target_count == 4);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 8; ++c) {
      const size_t i = static_cast<size_t>(r) * 8 + c;
      BOOST_TEST(rounded.tokens[i] == (c < 5 ? mb.tokens[static_cast<size_t>(r) * 5 + c] : pad));
      BOOST_TEST(rounded.targets[i] == (c < 5 ? mb.targets[static_cast<size_t>(r) * 5 + c] : -1));
    }
  BOOST_TEST(make_micro_batch(data, {1, 0, 2}, pad, 4, 6).seq == 6);   // capped at max_seq
  BOOST_TEST(make_micro_batch(data, {1, 0, 2}, pad, 64, 3).seq == 5);  // never below the longest
  BOOST_TEST(make_micro_batch(data, {0}, pad, 1, 0).seq == 3);
  BOOST_TEST(make_micro_batch(data, {}, pad, 64, 0).seq == 0);
  BOOST_CHECK_THROW(make_micro_batch(data, {0}, pad, 0, 0), Error);
}

// Sequence packing: first-fit decreasing into rows, samples end to end with their starts, and a
// step's rows dealt out so every rank runs the same number of micro-steps.
BOOST_AUTO_TEST_CASE(packing_fills_rows_first_fit_decreasing) {
  std::vector<Example> data;
  for (const int n : {3, 6, 1, 4, 2, 5}) {
    Example ex;
    for (int t = 0; t < n; ++t) ex.tokens.push_back(10 * n + t), ex.targets.push_back(t + 1 < n ? 10 * n + t + 1 : -1);
    data.push_back(ex);
  }
  // Lengths 3 6 1 4 2 5 into rows of 7: 6+1, 5+2, 4+3.
  const std::vector<PackedRow> rows = pack_rows(data, {0, 1, 2, 3, 4, 5}, 7);
  BOOST_TEST(rows.size() == 3u);
  BOOST_TEST((rows[0] == PackedRow{1, 2}));
  BOOST_TEST((rows[1] == PackedRow{5, 4}));
  BOOST_TEST((rows[2] == PackedRow{3, 0}));
  BOOST_CHECK_THROW(pack_rows(data, {1}, 5), Error);  // a sample longer than a row
  BOOST_TEST(pack_rows(data, {}, 7).empty());

  const int32_t pad = ByteTokenizer::kPad;
  const MicroBatch mb = make_packed_micro_batch(data, {rows[1], {2}}, pad);
  BOOST_TEST(mb.batch == 2);
  BOOST_TEST(mb.seq == 7);
  BOOST_TEST(mb.tokens == (std::vector<int32_t>{50, 51, 52, 53, 54, 20, 21, 10, pad, pad, pad, pad, pad, pad}),
             boost::test_tools::per_element());
  BOOST_TEST(mb.targets == (std::vector<int32_t>{51, 52, 53, 54, -1, 21, -1, -1, -1, -1, -1, -1, -1, -1}),
             boost::test_tools::per_element());
  BOOST_TEST(mb.starts == (std::vector<int32_t>{0, 0, 0, 0, 0, 5, 5, 0, 1, 1, 1, 1, 1, 1}),
             boost::test_tools::per_element());
  BOOST_TEST(mb.target_count == 5);
  BOOST_TEST(make_micro_batch(data, {0, 1}, pad).starts.empty());  // unpacked: one sample per row
  BOOST_TEST(make_packed_micro_batch(data, {rows[0]}, pad, 4, 0).seq == 8);  // rounded as unpacked ones

  // 3 rows over 2 ranks, 1 row per micro-batch: 2 micro-steps each, rank 1's second one empty.
  const PackedStep step = pack_step(data, {0, 1, 2, 3, 4, 5}, 7, 2, 1);
  BOOST_TEST(step.micro_steps == 2);
  BOOST_TEST((step.micro_batch(0, 0, 2, 1) == std::vector<PackedRow>{rows[0]}));
  BOOST_TEST((step.micro_batch(0, 1, 2, 1) == std::vector<PackedRow>{rows[1]}));
  BOOST_TEST((step.micro_batch(1, 0, 2, 1) == std::vector<PackedRow>{rows[2]}));
  BOOST_TEST(step.micro_batch(1, 1, 2, 1).empty());
  const MicroBatch none = make_packed_micro_batch(data, step.micro_batch(1, 1, 2, 1), pad);
  BOOST_TEST(none.batch * none.seq == 0);
  BOOST_TEST(pack_step(data, {0, 1, 2, 3, 4, 5}, 7, 1, 4).micro_steps == 1);
}

BOOST_AUTO_TEST_CASE(micro_batch_of_squad_examples) {
  const std::vector<Example> data = load_squad(kSquadEval, ByteTokenizer(), DatasetOptions{});
  const std::vector<size_t> indices = {3, 1, 4};
  const MicroBatch mb = make_micro_batch(data, indices, ByteTokenizer::kPad);
  size_t longest = 0;
  for (size_t i : indices) longest = std::max(longest, data[i].tokens.size());
  BOOST_TEST(mb.seq == static_cast<int>(longest));
  BOOST_TEST(mb.target_count == count_targets(data, indices));
  for (size_t row = 0; row < indices.size(); ++row) {
    const Example& ex = data[indices[row]];
    for (size_t t = 0; t < longest; ++t) {
      const size_t k = row * longest + t;
      BOOST_TEST(mb.tokens[k] == (t < ex.tokens.size() ? ex.tokens[t] : ByteTokenizer::kPad));
      BOOST_TEST(mb.targets[k] == (t < ex.targets.size() ? ex.targets[t] : -1));
    }
  }
}

// ---- seeded permutation and sampler ---------------------------------------------------------

BOOST_AUTO_TEST_CASE(seeded_permutation_is_a_fixed_permutation) {
  for (size_t n : {0, 1, 2, 17, 1000}) {
    std::vector<size_t> perm = seeded_permutation(n, 42);
    BOOST_TEST(perm == seeded_permutation(n, 42), boost::test_tools::per_element());
    std::sort(perm.begin(), perm.end());
    for (size_t i = 0; i < n; ++i) BOOST_TEST(perm[i] == i);
  }
  BOOST_TEST(seeded_permutation(1000, 42) != seeded_permutation(1000, 43));
  // Pinned values: the order must not change with the compiler or standard library.
  BOOST_TEST(seeded_permutation(10, 0) == (std::vector<size_t>{7, 2, 0, 8, 3, 9, 6, 1, 5, 4}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(sampler_without_shuffle_is_sequential) {
  DistributedSampler sampler(103, 8, 5, false);
  BOOST_TEST(sampler.steps_per_epoch() == 12u);
  for (size_t epoch : {0, 3}) {
    for (size_t step = 0; step < 12; ++step) {
      const std::vector<size_t> batch = sampler.global_batch(epoch, step);
      BOOST_REQUIRE_EQUAL(batch.size(), 8u);
      for (size_t i = 0; i < 8; ++i) BOOST_TEST(batch[i] == step * 8 + i);
    }
  }
  BOOST_TEST(sampler.micro_batch(0, 2, 1, 2, 1, 2) == (std::vector<size_t>{22, 23}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(sampler_micro_batches_partition_each_global_batch) {
  const size_t global = 16;
  for (bool shuffle : {false, true}) {
    DistributedSampler sampler(100, global, 11, shuffle);
    BOOST_TEST(sampler.steps_per_epoch() == 6u);
    for (int world : {1, 2, 4}) {
      for (int micro_size : {1, 2, 4, 8, 16}) {
        if (global % static_cast<size_t>(world * micro_size) != 0) continue;
        const int micros = static_cast<int>(global) / (world * micro_size);
        for (size_t epoch : {0, 1}) {
          for (size_t step = 0; step < sampler.steps_per_epoch(); ++step) {
            const std::vector<size_t> batch = sampler.global_batch(epoch, step);
            std::vector<size_t> joined;
            for (int rank = 0; rank < world; ++rank) {
              for (int micro = 0; micro < micros; ++micro) {
                const std::vector<size_t> mb =
                    sampler.micro_batch(epoch, step, rank, world, micro, micro_size);
                BOOST_REQUIRE_EQUAL(mb.size(), static_cast<size_t>(micro_size));
                joined.insert(joined.end(), mb.begin(), mb.end());
              }
            }
            // Ranks in order, micro-batches in order: exactly the global batch, no overlap.
            BOOST_TEST(joined == batch, boost::test_tools::per_element());
            BOOST_TEST(std::set<size_t>(joined.begin(), joined.end()).size() == global);
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(sampler_shuffled_epochs_are_distinct_permutations) {
  const size_t n = 96, global = 8;
  DistributedSampler sampler(n, global, 2024, true);
  std::vector<std::vector<size_t>> epochs;
  for (size_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<size_t> order;
    for (size_t step = 0; step < sampler.steps_per_epoch(); ++step) {
      const std::vector<size_t> batch = sampler.global_batch(epoch, step);
      order.insert(order.end(), batch.begin(), batch.end());
    }
    std::vector<size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < n; ++i) BOOST_TEST(sorted[i] == i);
    epochs.push_back(order);
  }
  BOOST_TEST(epochs[0] != epochs[1]);
  BOOST_TEST(epochs[1] != epochs[2]);
  BOOST_TEST(epochs[0] != epochs[2]);

  // Same seed, same orders; another seed, another order.
  DistributedSampler same(n, global, 2024, true);
  DistributedSampler other(n, global, 2025, true);
  BOOST_TEST(same.global_batch(1, 4) == sampler.global_batch(1, 4),
             boost::test_tools::per_element());
  BOOST_TEST(other.global_batch(0, 0) != sampler.global_batch(0, 0));

  // The last incomplete global batch is dropped.
  DistributedSampler ragged(99, global, 2024, true);
  BOOST_TEST(ragged.steps_per_epoch() == 12u);
}

BOOST_AUTO_TEST_CASE(sampler_rejects_bad_sizes_and_ranges) {
  DistributedSampler sampler(64, 8, 1, true);
  BOOST_CHECK_THROW(sampler.micro_batch(0, 0, 0, 3, 0, 1), Error);  // 8 % 3
  BOOST_CHECK_THROW(sampler.micro_batch(0, 0, 0, 2, 0, 3), Error);  // 8 % 6
  BOOST_CHECK_THROW(sampler.micro_batch(0, 0, 0, 4, 0, 4), Error);  // 8 % 16
  const std::string msg = error_of([&] { sampler.micro_batch(0, 0, 0, 3, 0, 1); });
  BOOST_TEST(contains(msg, "not divisible"), msg);
  BOOST_CHECK_THROW(sampler.global_batch(0, 8), Error);  // 8 steps per epoch
  BOOST_CHECK_THROW(sampler.micro_batch(0, 8, 0, 2, 0, 2), Error);
  BOOST_CHECK_THROW(sampler.micro_batch(0, 0, 0, 2, 2, 2), Error);  // 2 micro-batches per rank
  BOOST_CHECK_THROW(sampler.micro_batch(0, 0, 0, 2, -1, 2), Error);
  BOOST_CHECK_THROW(sampler.micro_batch(0, 0, 2, 2, 0, 2), Error);  // rank >= world
  BOOST_CHECK_THROW(sampler.micro_batch(0, 0, 0, 0, 0, 2), Error);
  BOOST_CHECK_THROW(sampler.micro_batch(0, 0, 0, 2, 0, 0), Error);
  BOOST_CHECK_THROW(DistributedSampler(64, 0, 1, true), Error);
  BOOST_CHECK_THROW(DistributedSampler(7, 8, 1, true), Error);
  BOOST_CHECK_NO_THROW(sampler.micro_batch(0, 7, 3, 4, 1, 1));
}
