#define BOOST_TEST_MODULE test_tokenizer
#include <boost/test/unit_test.hpp>

// Tests of HfTokenizer against reference ids recorded with transformers.js and checked against
// Hugging Face `tokenizers` (tests/fixtures/tokenizer/generate_reference.mjs, check_reference.py):
// GPT-2 byte-level BPE, the same vocabulary behind BLOOM's and Llama 3's pre-tokenizers, and
// Llama 2 (converted here from ../shared/data/llama2-tokenizer/tokenizer.model); decoding,
// special tokens, malformed files and speed.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "shardlm/core.hpp"
#include "shardlm/data.hpp"
#include "temp_dir.hpp"
#include "test_support.hpp"

using namespace shardlm;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kFixtures = std::string(SHARDLM_SOURCE_DIR) + "/tests/fixtures/tokenizer";
const std::string kGpt2 = kFixtures + "/gpt2/tokenizer.json";
const std::string kLlamaModel =
    std::string(SHARDLM_SOURCE_DIR) + "/../shared/data/llama2-tokenizer/tokenizer.model";
// Generated tokenizer.json files (variants, Llama 2) live in the build tree.
const fs::path kGenerated = fs::path(SHARDLM_BINARY_DIR) / "tokenizer-fixtures";

const json& reference() {
  static const json ref = json::parse(read_text_file(kFixtures + "/reference.json"));
  return ref;
}

std::vector<std::string> corpus_lines() {
  const std::string corpus = read_text_file(kFixtures + "/corpus.txt");
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < corpus.size()) {
    const size_t end = corpus.find('\n', start);
    lines.push_back(corpus.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// gpt2/tokenizer.json with a variant of variants.json applied, as generate_reference.mjs does.
std::string variant_file(const std::string& name) {
  const json variants = json::parse(read_text_file(kFixtures + "/variants.json"));
  const json& variant = variants.at("variants").at(name);
  json tok = json::parse(read_text_file(kGpt2));
  for (const auto& [key, value] : variant.at("tokenizer").items()) {
    if (key == "model") {
      for (const auto& [k, v] : value.items()) tok["model"][k] = v;
    } else if (key == "added_tokens") {
      for (const auto& t : value) tok["added_tokens"].push_back(t);
    } else {
      tok[key] = value;
    }
  }
  if (variant.at("merges_as_pairs").get<bool>()) {
    json pairs = json::array();
    for (const auto& m : tok["model"]["merges"]) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      pairs.push_back(json::array({s.substr(0, space), s.substr(space + 1)}));
    }
    tok["model"]["merges"] = pairs;
  }
  const fs::path path = kGenerated / name / "tokenizer.json";
  write_text_file(path, tok.dump());
  return path.string();
}

std::string llama2_file() {
  BOOST_REQUIRE_MESSAGE(fs::exists(kLlamaModel),
                        "the Llama 2 tokenizer model is missing: " << kLlamaModel);
  const fs::path path = kGenerated / "llama2" / "tokenizer.json";
  write_text_file(path, sentencepiece_to_tokenizer_json(kLlamaModel));
  return path.string();
}

const HfTokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, HfTokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    const std::string path = name == "gpt2"     ? kGpt2
                             : name == "llama2" ? llama2_file()
                                                : variant_file(name);
    it = cache.emplace(name, HfTokenizer::from_file(path)).first;
  }
  return it->second;
}

std::string show(const std::vector<int32_t>& ids) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
  return out.str() + "]";
}

// Every corpus line and the whole corpus against the reference of tokenizer `name`.
void check_against_reference(const std::string& name) {
  const HfTokenizer& tok = tokenizer(name);
  const json& ref = reference().at("tokenizers").at(name);
  const std::vector<std::string> lines = corpus_lines();
  BOOST_REQUIRE_EQUAL(lines.size(), ref.at("lines").size());
  std::vector<std::pair<std::string, const json*>> cases;
  for (size_t i = 0; i < lines.size(); ++i) cases.emplace_back(lines[i], &ref["lines"][i]);
  cases.emplace_back(read_text_file(kFixtures + "/corpus.txt"), &ref["whole"]);
  size_t failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [text, expected] = cases[i];
    const std::string label = i < lines.size() ? "line " + std::to_string(i + 1) : "whole corpus";
    const auto ids = tok.encode(text, false);
    const auto ids_special = tok.encode(text, true);
    const auto want = expected->at("ids").get<std::vector<int32_t>>();
    const auto want_special = expected->at("ids_special").get<std::vector<int32_t>>();
    const std::string decoded = tok.decode(want_special, false);
    const std::string decoded_skip = tok.decode(want_special, true);
    const bool ok = ids == want && ids_special == want_special &&
                    decoded == expected->at("decoded").get<std::string>() &&
                    decoded_skip == expected->at("decoded_skip").get<std::string>();
    if (!ok && ++failures <= 10) {
      BOOST_ERROR(name << " " << label << ": ids " << show(ids) << " want " << show(want)
                       << "; ids_special " << show(ids_special) << " want " << show(want_special)
                       << "; decoded '" << decoded << "' want '"
                       << expected->at("decoded").get<std::string>() << "'; decoded_skip '"
                       << decoded_skip << "' want '"
                       << expected->at("decoded_skip").get<std::string>() << "'");
    }
  }
  BOOST_TEST(failures == 0u, name << ": " << failures << " of " << cases.size() << " texts differ");
}

// A small valid tokenizer.json to break in the malformed-file tests.
json tiny_tokenizer() {
  return json::parse(kTinyTokenizerJson);
}

// The megabytes per second `tok` encodes `text` at, best of three runs.
double encode_speed(const HfTokenizer& tok, const std::vector<std::string>& texts, size_t bytes) {
  double best = 0.0;
  for (int run = 0; run < 3; ++run) {
    const auto start = std::chrono::steady_clock::now();
    size_t count = 0;
    for (const std::string& t : texts) count += tok.encode(t, false).size();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    BOOST_REQUIRE(count > 0);
    best = std::max(best, static_cast<double>(bytes) / 1e6 / seconds);
  }
  return best;
}

}  // namespace

BOOST_AUTO_TEST_CASE(gpt2_matches_reference) { check_against_reference("gpt2"); }

// The Unicode normal forms (Qwen2's and Qwen3's tokenizer.json set NFC): GPT-2's tokenizer with each in front
// encodes a text as the plain tokenizer encodes the text in that form.
BOOST_AUTO_TEST_CASE(unicode_normal_forms_normalize_before_encoding) {
  const json gpt2 = json::parse(read_text_file(kGpt2));
  const HfTokenizer plain = HfTokenizer::from_file(kGpt2);
  const std::string decomposed = "caf" "e\xCC\x81 \xEF\xAC\x81ne";  // e + U+0301, then U+FB01 (the fi ligature)
  const std::string composed = "caf\xC3\xA9 \xEF\xAC\x81ne";       // U+00E9
  const std::string compatible = "caf\xC3\xA9 fine";                  // NFKC: the ligature split too
  const std::string decomposed_compatible = "cafe\xCC\x81 fine";
  for (const auto& [form, expected] : std::vector<std::pair<std::string, std::string>>{
           {"NFC", composed}, {"NFD", decomposed}, {"NFKC", compatible}, {"NFKD", decomposed_compatible}}) {
    json t = gpt2;
    t["normalizer"] = json{{"type", form}};
    const HfTokenizer tok = HfTokenizer::from_json(t.dump(), form);
    BOOST_TEST(tok.encode(decomposed, false) == plain.encode(expected, false), form);
    BOOST_TEST(tok.encode(composed, false) == plain.encode(expected, false), form);
  }
  BOOST_TEST(plain.encode(decomposed, false) != plain.encode(composed, false));  // the forms do differ
}

BOOST_AUTO_TEST_CASE(bloom_pre_tokenizer_matches_reference) {
  check_against_reference("bloom_style");
}

BOOST_AUTO_TEST_CASE(llama3_pre_tokenizer_matches_reference) {
  check_against_reference("llama3_style");
}

BOOST_AUTO_TEST_CASE(llama2_matches_reference) { check_against_reference("llama2"); }

BOOST_AUTO_TEST_CASE(decode_round_trips) {
  // Byte-level BPE is lossless and Llama's decoder removes the prepended space again, so text
  // without special tokens comes back whole. With special tokens: Llama's decoder spaces them
  // ("<s> Hello") and <mask>'s lstrip swallows the spaces before it.
  for (const std::string name : {"gpt2", "bloom_style", "llama3_style", "llama2"}) {
    const HfTokenizer& tok = tokenizer(name);
    for (const std::string& line : corpus_lines()) {
      const auto ids = tok.encode(line, false);
      const bool special =
          std::any_of(ids.begin(), ids.end(), [&](int32_t id) { return tok.is_special(id); });
      if (!special) {
        BOOST_TEST(tok.decode(ids, false) == line, name << ": '" << line << "'");
        BOOST_TEST(tok.decode(tok.encode(line, true), true) == line, name << ": '" << line << "'");
      } else if (name != "llama2" && !contains(line, "<mask>")) {
        BOOST_TEST(tok.decode(ids, false) == line, name << ": '" << line << "'");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(special_tokens) {
  const HfTokenizer& gpt2 = tokenizer("gpt2");
  BOOST_TEST(gpt2.vocab_size() == 50257);
  BOOST_TEST(gpt2.token_to_id("<|endoftext|>") == 50256);
  BOOST_TEST(gpt2.id_to_token(50256) == "<|endoftext|>");
  BOOST_TEST(gpt2.id_to_token(15496) == "Hello");
  BOOST_TEST(gpt2.token_to_id("Ġworld") == 995);
  BOOST_TEST(gpt2.token_to_id("no such token") == -1);
  BOOST_TEST(gpt2.id_to_token(60000).empty());
  BOOST_TEST(gpt2.is_special(50256));
  BOOST_TEST(!gpt2.is_special(995));
  // From gpt2/tokenizer_config.json.
  BOOST_TEST(gpt2.bos_id() == 50256);
  BOOST_TEST(gpt2.eos_id() == 50256);
  BOOST_TEST(gpt2.pad_id() == -1);
  BOOST_TEST(gpt2.unk_id() == 50256);
  BOOST_TEST(gpt2.encode("a<|endoftext|>b", true) == (std::vector<int32_t>{64, 50256, 65}));
  BOOST_TEST(gpt2.decode({64, 50256, 65}, true) == "ab");
  BOOST_TEST(gpt2.decode({64, 50256, 65}, false) == "a<|endoftext|>b");
  // Unknown ids are skipped; a lone continuation byte decodes to U+FFFD.
  BOOST_TEST(gpt2.decode({64, 99999, -1, 65}) == "ab");
  // "\xC4\xA2" (U+0122) is the byte-level character of byte 0x80.
  BOOST_TEST(gpt2.decode({gpt2.token_to_id("\xC4\xA2")}) == "\xEF\xBF\xBD");
  BOOST_TEST(gpt2.encode("", true).empty());

  const HfTokenizer& llama = tokenizer("llama2");
  BOOST_TEST(llama.vocab_size() == 32000);
  BOOST_TEST(llama.bos_id() == 1);
  BOOST_TEST(llama.eos_id() == 2);
  BOOST_TEST(llama.unk_id() == 0);
  BOOST_TEST(llama.pad_id() == -1);
  BOOST_TEST(llama.encode("Hello world", true) == (std::vector<int32_t>{1, 15043, 3186}));
  BOOST_TEST(llama.encode("Hello world", false) == (std::vector<int32_t>{15043, 3186}));
  BOOST_TEST(llama.encode("", true) == (std::vector<int32_t>{1}));
  BOOST_TEST(llama.token_to_id("<0x0A>") == 13);
  BOOST_TEST(llama.decode({1, 15043, 3186, 2}, true) == "Hello world");
  // Byte fallback: an emoji the vocabulary lacks is its four bytes, and decodes back.
  const auto emoji = llama.encode("\xF0\x9F\x98\x80", false);
  BOOST_TEST(emoji == (std::vector<int32_t>{29871, 243, 162, 155, 131}));
  BOOST_TEST(llama.decode(emoji) == "\xF0\x9F\x98\x80");
  BOOST_TEST(llama.decode({243, 162}) == "\xEF\xBF\xBD\xEF\xBF\xBD");  // a cut sequence

  // Bos from the template of a post-processor, lstrip of <mask>, a normalized added token.
  const HfTokenizer& llama3 = tokenizer("llama3_style");
  BOOST_TEST(llama3.vocab_size() == 50261);
  BOOST_TEST(llama3.bos_id() == 50257);
  BOOST_TEST(llama3.encode("x <mask>", false) == (std::vector<int32_t>{87, 50259}));
  BOOST_TEST(llama3.encode("shardlm", false) == (std::vector<int32_t>{50260}));
  BOOST_TEST(!llama3.is_special(50260));
  BOOST_TEST(llama3.decode({50257, 50260, 50258}, true) == "shardlm");
}

BOOST_AUTO_TEST_CASE(copies_share_the_model_across_threads) {
  const HfTokenizer tok = tokenizer("gpt2");  // a copy
  const std::vector<std::string> lines = corpus_lines();
  std::vector<std::vector<int32_t>> serial;
  for (const auto& line : lines) serial.push_back(tok.encode(line, false));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < lines.size(); ++i) {
          if (tok.encode(lines[i], false) != serial[i]) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) BOOST_TEST(m == 0);
}

BOOST_AUTO_TEST_CASE(invalid_utf8_text_is_an_error) {
  const std::string message = error_of([] { tokenizer("gpt2").encode("ab\xC3(", false); });
  BOOST_TEST(contains(message, "not valid UTF-8"), message);
  BOOST_TEST(contains(message, "byte 2"), message);
}

BOOST_AUTO_TEST_CASE(malformed_files_name_the_file_and_path) {
  TempDir tmp{"tokenizer"};
  const auto write_and_load = [&](const std::string& name, const std::string& text) {
    const fs::path path = tmp.root / name / "tokenizer.json";
    write_text_file(path, text);
    return std::make_pair(path.string(), error_of([&] { HfTokenizer::from_file(path.string()); }));
  };
  // The tiny tokenizer itself loads and works.
  {
    const fs::path path = tmp.root / "ok" / "tokenizer.json";
    write_text_file(path, tiny_tokenizer().dump());
    const HfTokenizer tok = HfTokenizer::from_file(path.string());
    BOOST_TEST(tok.encode("ab ab<eos>", false) == (std::vector<int32_t>{2, 4, 5}));
    BOOST_TEST(tok.eos_id() == 5);
  }
  {
    const auto [path, message] = write_and_load("syntax", "{\"model\": {\"type\": \"BPE\",");
    BOOST_TEST(contains(message, path), message);
    BOOST_TEST(contains(message, "not valid JSON"), message);
  }
  {
    json t = tiny_tokenizer();
    t["model"]["merges"][1] = "Ġab";
    const auto [path, message] = write_and_load("merge", t.dump());
    BOOST_TEST(contains(message, path + ": model.merges[1]"), message);
  }
  {
    json t = tiny_tokenizer();
    t["model"]["merges"][0] = "a c";
    const auto [path, message] = write_and_load("merge_vocab", t.dump());
    BOOST_TEST(contains(message, path + ": model.merges[0]: 'c' is not in model.vocab"), message);
  }
  {
    json t = tiny_tokenizer();
    t["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "BertNormalizer"}]})");
    const auto [path, message] = write_and_load("normalizer", t.dump());
    BOOST_TEST(
        contains(message, path + ": normalizer.normalizers[0].type: 'BertNormalizer' is not supported"),
        message);
  }
  {
    json t = tiny_tokenizer();
    t["model"]["type"] = "WordPiece";
    const auto [path, message] = write_and_load("model", t.dump());
    BOOST_TEST(contains(message, path + ": model.type: 'WordPiece' is not supported"), message);
  }
  {
    json t = tiny_tokenizer();
    t["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"Regex": "(a"},
                                        "behavior": "Isolated", "invert": false})");
    const auto [path, message] = write_and_load("regex", t.dump());
    BOOST_TEST(contains(message, path + ": pre_tokenizer.pattern.Regex"), message);
  }
  {
    json t = tiny_tokenizer();
    t["pre_tokenizer"]["behavior"] = "Isolated";
    t["pre_tokenizer"]["type"] = "Split";
    t["pre_tokenizer"]["pattern"] = json::parse(R"({"String": " "})");
    t["pre_tokenizer"]["behavior"] = "Sideways";
    const auto [path, message] = write_and_load("behavior", t.dump());
    BOOST_TEST(contains(message, path + ": pre_tokenizer.behavior: unknown split behavior"),
               message);
  }
  {
    json t = tiny_tokenizer();
    t["added_tokens"][0].erase("content");
    const auto [path, message] = write_and_load("added", t.dump());
    BOOST_TEST(contains(message, path + ": added_tokens[0].content: missing"), message);
  }
  {
    json t = tiny_tokenizer();
    t.erase("model");
    const auto [path, message] = write_and_load("no_model", t.dump());
    BOOST_TEST(contains(message, path + ": model: missing"), message);
  }
  {
    const std::string missing = (tmp.root / "absent" / "tokenizer.json").string();
    const std::string message = error_of([&] { HfTokenizer::from_file(missing); });
    BOOST_TEST(contains(message, missing), message);
  }
  {
    const fs::path path = tmp.root / "bad_config" / "tokenizer.json";
    write_text_file(path, tiny_tokenizer().dump());
    write_text_file(tmp.root / "bad_config" / "tokenizer_config.json", "{\"bos_token\": 3");
    const std::string message = error_of([&] { HfTokenizer::from_file(path.string()); });
    BOOST_TEST(contains(message, "tokenizer_config.json: not valid JSON"), message);
  }
  {
    const fs::path model = tmp.root / "not_a_model.model";
    write_text_file(model, "\x0a\xff\xff\xff");
    const std::string message = error_of([&] { sentencepiece_to_tokenizer_json(model.string()); });
    BOOST_TEST(contains(message, model.string() + ": not a SentencePiece model"), message);
  }
}

BOOST_AUTO_TEST_CASE(encodes_at_least_one_megabyte_per_second) {
  // A few MB of mixed text: the corpus lines, numbered so that not every word is a cache hit.
  const std::vector<std::string> lines = corpus_lines();
  std::vector<std::string> texts;
  size_t bytes = 0;
  for (int copy = 0; bytes < 3'000'000; ++copy) {
    std::string text;
    for (size_t i = 0; i < lines.size(); ++i) {
      text += lines[i] + " " + std::to_string(copy * 131 + static_cast<int>(i)) + "\n";
    }
    bytes += text.size();
    texts.push_back(std::move(text));
  }
  for (const std::string name : {"gpt2", "llama3_style", "llama2"}) {
    const double mb_per_s = encode_speed(tokenizer(name), texts, bytes);
    BOOST_TEST_MESSAGE(name << ": " << mb_per_s << " MB/s on " << bytes / 1e6 << " MB");
    std::cout << "tokenizer speed " << name << ": " << mb_per_s << " MB/s on " << bytes / 1e6
              << " MB of mixed text (one core)\n";
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
    BOOST_TEST(mb_per_s >= 1.0, name << " encodes at " << mb_per_s << " MB/s, below 1 MB/s");
#endif
  }
}

// A sample's ids without its BOS and EOS; the ids its loss is on, without EOS.
std::vector<int32_t> body_ids(const Example& ex, const Tokenizer& tok) {
  const size_t first = tok.bos_id() >= 0 ? 1 : 0;
  return std::vector<int32_t>(ex.tokens.begin() + static_cast<std::ptrdiff_t>(first), ex.tokens.end() - 1);
}
std::vector<int32_t> answer_ids(const Example& ex) {
  std::vector<int32_t> ids;
  for (size_t t = 0; t + 1 < ex.targets.size(); ++t)
    if (ex.targets[t] >= 0) ids.push_back(ex.targets[t]);
  if (!ids.empty()) ids.pop_back();  // EOS
  return ids;
}

// SQuAD and prompt/completion samples with a real SentencePiece (Llama 2) and byte-level BPE
// (GPT-2) tokenizer are the whole text's tokens, their loss on the tokens of the answer: pieces
// tokenized apart gave Llama 2 a stray "▁" before the context and the answer, GPT-2 a lone "Ġ".
BOOST_AUTO_TEST_CASE(squad_and_prompt_samples_are_the_whole_texts_tokens) {
  TempDir dir("qa_whole");
  const std::string question = "Where is the café?", answer = "Zürich";
  const std::string context = "The café Odéon is in Zürich, near the lake. It opened in 1911 and is still open today.";
  const std::string squad = dir.write(
      "squad.json", json({{"data", {{{"paragraphs", {{{"context", context},
                                                      {"qas", {{{"id", "q1"}, {"question", question},
                                                                {"answers", {{{"text", answer}}}}}}}}}}}}}})
                        .dump());
  const std::string jsonl =
      dir.write("pc.jsonl", json({{"prompt", "Translate to French: good morning\nAnswer:"}, {"completion", " bonjour"}})
                                    .dump() + "\n");
  for (const std::string name : {"llama2", "gpt2"}) {
    BOOST_TEST_CONTEXT(name) {
      const HfTextTokenizer tok(tokenizer(name));
      const std::string prompt = "Question: " + question + " Context: " + context + " Answer:";
      const Example ex = load_squad(squad, tok, DatasetOptions{}).at(0);
      BOOST_TEST(body_ids(ex, tok) == tok.encode(prompt + " " + answer), show(ex.tokens));
      const std::vector<int32_t> whole = tok.encode(prompt + " " + answer), head = tok.encode(prompt);
      BOOST_TEST(answer_ids(ex) == std::vector<int32_t>(whole.begin() + static_cast<std::ptrdiff_t>(head.size()),
                                                        whole.end()));
      BOOST_TEST(tok.decode(answer_ids(ex)).find(answer) != std::string::npos);
      BOOST_TEST(ex.targets.back() == -1);
      BOOST_TEST(ex.targets[ex.targets.size() - 2] == tok.eos_id());

      // Cut to fit: the longest start of the context, in whole characters, with which the sample fits.
      DatasetOptions opt;
      opt.max_length = static_cast<int>(ex.tokens.size()) - 7;
      const Example cut = load_squad(squad, tok, opt).at(0);
      BOOST_TEST(cut.tokens.size() <= size_t(opt.max_length));
      const std::string text = tok.decode(body_ids(cut, tok));
      const size_t from = text.find(" Context: ") + 10, to = text.rfind(" Answer:");
      BOOST_TEST_REQUIRE(to != std::string::npos);
      const std::string kept = text.substr(from, to - from);
      BOOST_TEST(context.compare(0, kept.size(), kept) == 0, kept);
      BOOST_TEST(kept.size() < context.size());
      size_t next = kept.size() + 1;
      while (next < context.size() && (static_cast<unsigned char>(context[next]) & 0xC0) == 0x80) ++next;
      const std::string longer = "Question: " + question + " Context: " + context.substr(0, next) + " Answer:";
      BOOST_TEST(tok.encode(longer + " " + answer).size() + ex.tokens.size() - whole.size() > size_t(opt.max_length));
      BOOST_TEST(body_ids(cut, tok) == tok.encode("Question: " + question + " Context: " + kept + " Answer: " + answer));

      const Example pc = load_jsonl(jsonl, tok, DatasetOptions{}).at(0);
      const std::string pc_prompt = "Translate to French: good morning\nAnswer:";
      BOOST_TEST(body_ids(pc, tok) == tok.encode(pc_prompt + " bonjour"));
      const std::vector<int32_t> pc_whole = tok.encode(pc_prompt + " bonjour"), pc_head = tok.encode(pc_prompt);
      BOOST_TEST(answer_ids(pc) == std::vector<int32_t>(pc_whole.begin() + static_cast<std::ptrdiff_t>(pc_head.size()),
                                                        pc_whole.end()));
      // A prompt ending in whitespace that the whole text splits otherwise: GPT-2's "\n\n" alone is one
      // token, before a word two; neither takes the loss.
      const std::string nl = dir.write("nl.jsonl", json({{"prompt", "Capital of France?\n\n"}, {"completion", "Paris"}})
                                                       .dump() + "\n");
      const Example pn = load_jsonl(nl, tok, DatasetOptions{}).at(0);
      BOOST_TEST(body_ids(pn, tok) == tok.encode("Capital of France?\n\nParis"));
      BOOST_TEST(tok.decode(answer_ids(pn)) == "Paris", tok.decode(answer_ids(pn)));
    }
  }
}

// A prompt holding special tokens (GPT-2 with <|im_start|> and <|im_end|> added) and ending in "\n\n",
// which the whole text splits into two "Ċ" before the completion: neither takes the loss. (Both did:
// the text decoded up to them skipped the special tokens and never matched the prompt's.)
BOOST_AUTO_TEST_CASE(a_prompt_with_special_tokens_keeps_its_own_tokens) {
  TempDir dir("qa_special");
  json spec = json::parse(read_text_file(kGpt2));
  int32_t next = 50257;
  for (const char* content : {"<|im_start|>", "<|im_end|>"})
    spec["added_tokens"].push_back({{"id", next++}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                    {"rstrip", false}, {"normalized", false}, {"special", true}});
  const HfTextTokenizer tok(HfTokenizer::from_json(spec.dump(), "gpt2 + chat tokens",
                                                   read_text_file(kFixtures + "/gpt2/tokenizer_config.json")));
  const std::string prompt = "<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\n\n";
  const std::string file = dir.write("pc.jsonl", json({{"prompt", prompt}, {"completion", "Paris"}}).dump() + "\n");
  const Example ex = load_jsonl(file, tok, DatasetOptions{}).at(0);
  BOOST_TEST(body_ids(ex, tok) == tok.encode(prompt + "Paris"), show(ex.tokens));
  BOOST_TEST(answer_ids(ex) == tok.encode("Paris"), show(answer_ids(ex)));
}

// The byte tokenizer's files for transformers (what `shardlm export` writes for a byte-tokenizer
// run): read back as a Hugging Face tokenizer.json, they give the byte tokenizer's ids.
BOOST_AUTO_TEST_CASE(byte_tokenizer_files_encode_as_the_byte_tokenizer) {
  const std::map<std::string, std::string> files = ByteTokenizer::hf_files(256);
  BOOST_TEST_REQUIRE(files.count("tokenizer.json") == 1u);
  BOOST_TEST(files.count("tokenizer_config.json") == 1u);
  BOOST_TEST(files.count("special_tokens_map.json") == 1u);
  const std::filesystem::path dir = SHARDLM_BINARY_DIR "/test_runs/byte_tokenizer_files";
  std::filesystem::create_directories(dir);
  for (const auto& [name, text] : files) std::ofstream(dir / name) << text;
  const std::unique_ptr<Tokenizer> hf = make_tokenizer((dir / "tokenizer.json").string());
  const ByteTokenizer bytes;
  for (const std::string& text : {std::string("Question: who won? Answer: the Broncos"), std::string("  two  spaces\n"),
                                 std::string("caf\xC3\xA9 \xE6\x9D\xB1\xE4\xBA\xAC \xF0\x9F\x98\x80"),
                                 std::string("\x01\x7F control\tbytes")}) {
    BOOST_TEST(hf->encode(text) == bytes.encode(text), text);
    BOOST_TEST(hf->decode(bytes.encode(text)) == text);
  }
  BOOST_TEST(hf->bos_id() == ByteTokenizer::kBos);
  BOOST_TEST(hf->eos_id() == ByteTokenizer::kEos);
  BOOST_TEST(hf->pad_id() == ByteTokenizer::kPad);
  BOOST_TEST(hf->vocab_size() == bytes.vocab_size());
  const nlohmann::json config = nlohmann::json::parse(files.at("tokenizer_config.json"));
  BOOST_TEST(config.at("tokenizer_class") == "PreTrainedTokenizerFast");
  BOOST_TEST(config.at("eos_token") == ByteTokenizer::kEosText);
  BOOST_TEST(config.at("model_max_length") == 256);
}

// ---- TextStream: streaming the decoded text of generated ids -----------------------------------

namespace {

// Decodes id 99 followed by 100 as "€", a trailing 99 as U+FFFD (a character not yet whole, as a
// byte-level tokenizer decodes it), every other id as that byte.
class SplitCharTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string&) const override { return {}; }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == 99) s += i + 1 < ids.size() && ids[i + 1] == 100 ? (++i, "\xE2\x82\xAC") : "\xEF\xBF\xBD";
      else s += static_cast<char>(ids[i]);
    return s;
  }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return 0; }
  int32_t pad_id() const override { return 0; }
  int32_t vocab_size() const override { return 101; }
};

// What the stream gives out for each id of `text`'s bytes, and at the end.
std::vector<std::string> stream_bytes(const std::string& text, const std::vector<std::string>& stops,
                                      bool* stopped = nullptr) {
  const ByteTokenizer tok;
  TextStream stream(tok, stops);
  std::vector<std::string> out;
  for (unsigned char c : text) out.push_back(stream.push(c));
  out.push_back(stream.finish());
  if (stopped) *stopped = stream.stopped();
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(text_stream_gives_out_whole_characters) {
  // "é" is two bytes, "😀" four: nothing of either before its last byte, and each once the next
  // decode agrees (one id later).
  const std::vector<std::string> out = stream_bytes("a\xC3\xA9\xF0\x9F\x98\x80", {});
  const std::vector<std::string> expected = {"", "a", "", "\xC3\xA9", "", "", "", "\xF0\x9F\x98\x80"};
  BOOST_TEST(out == expected, boost::test_tools::per_element());
  // A tokenizer that decodes a split character to U+FFFD: held back until the rest comes.
  const SplitCharTokenizer split;
  TextStream stream(split);
  BOOST_TEST(stream.push('x') == "");
  BOOST_TEST(stream.push(99) == "x");
  BOOST_TEST(stream.push(100) == "");
  BOOST_TEST(stream.push(99) == "\xE2\x82\xAC");
  BOOST_TEST(stream.finish() == "\xEF\xBF\xBD");  // at the end, what the tokenizer made of it
  BOOST_TEST(stream.text() == "x\xE2\x82\xAC\xEF\xBF\xBD");
}

namespace {

// As a byte-fallback decoder: ids 0-255 are byte tokens, whose run (up to another id) decodes as its
// bytes when they are valid UTF-8 and to one U+FFFD a byte otherwise; id 256 is " the".
class ByteRunTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string&) const override { return {}; }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s, run;
    auto flush = [&] {
      s += valid_utf8(run) ? run : [&] {
        std::string r;
        for (size_t i = 0; i < run.size(); ++i) r += "\xEF\xBF\xBD";
        return r;
      }();
      run.clear();
    };
    for (int32_t id : ids)
      if (id < 256) run += static_cast<char>(id);
      else flush(), s += " the";
    flush();
    return s;
  }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return 257; }
  int32_t pad_id() const override { return 257; }
  int32_t vocab_size() const override { return 258; }

 private:
  static bool valid_utf8(const std::string& t) {
    for (size_t i = 0; i < t.size();) {
      const unsigned char c = static_cast<unsigned char>(t[i]);
      const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
      if (n == 0 || i + n > t.size()) return false;
      for (size_t k = 1; k < n; ++k)
        if ((static_cast<unsigned char>(t[i + k]) & 0xC0) != 0x80) return false;
      i += n;
    }
    return true;
  }
};

}  // namespace

// A run of byte tokens whose decode turns back to U+FFFD when a lead byte follows a whole character
// ("é", then the first byte of "€"): the stream gives out what the final decode has, nothing of the
// "é" that did not last, and its pieces add up to the whole decode.
BOOST_AUTO_TEST_CASE(text_stream_waits_for_byte_runs_that_a_later_byte_changes) {
  const ByteRunTokenizer tok;
  for (const std::vector<int32_t>& ids : {std::vector<int32_t>{256, 0xC3, 0xA9, 0xE2, 256},
                                          std::vector<int32_t>{256, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 256},
                                          std::vector<int32_t>{0xE4, 0xB8, 0xAD, 0xE6, 0x96, 0x87, 256}}) {
    TextStream stream(tok);
    std::string all;
    for (int32_t id : ids) all += stream.push(id);
    all += stream.finish();
    BOOST_TEST(all == tok.decode(ids));
    BOOST_TEST(stream.text() == tok.decode(ids));
  }
}

BOOST_AUTO_TEST_CASE(text_stream_stops_at_a_stop_string_and_never_gives_it_out) {
  bool stopped = false;
  const std::vector<std::string> out = stream_bytes("blue<|im_end|>\nmore", {"<|im_end|>"}, &stopped);
  std::string all;
  for (const std::string& piece : out) all += piece;
  BOOST_TEST(all == "blue");
  BOOST_TEST(stopped);
  // The start of a stop string is held back, and given out once it is not one.
  const std::vector<std::string> near = stream_bytes("a<|x", {"<|im_end|>"}, &stopped);
  const std::vector<std::string> expected = {"", "a", "", "", "<|x"};
  BOOST_TEST(near == expected, boost::test_tools::per_element());
  BOOST_TEST(!stopped);
  // Held back at the end: given out by finish.
  const std::vector<std::string> end = stream_bytes("ok<|im", {"<|im_end|>"}, &stopped);
  BOOST_TEST(end.back() == "<|im");
  BOOST_TEST(!stopped);
}
