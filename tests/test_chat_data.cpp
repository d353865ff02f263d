#define BOOST_TEST_MODULE test_chat_data
#include <boost/test/unit_test.hpp>

// Tests of data.format = chat: the three record forms give the same conversations, bad records
// and refusing templates end with one message naming the file and line, the trained bytes are
// exactly the assistant spans that the fixtures' prefix renderings (tests/fixtures/chat) delimit,
// prefixes that do not line up are counted, and special tokens stay single tokens.
#include <filesystem>
#include <fstream>

#include "commands.hpp"
#include "chat.hpp"
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"
#include "temp_dir.hpp"
#include "test_support.hpp"

using namespace shardlm;
using Json = nlohmann::ordered_json;

namespace {

const std::string kChat = SHARDLM_SOURCE_DIR "/tests/fixtures/chat/";

const Json& cases() {
  static const Json all = Json::parse(read_text_file(kChat + "cases.json"));
  return all;
}

// The renderings transformers made (expected.json) when present, else jinja2's.
Json expected() {
  const std::string file = std::filesystem::exists(kChat + "expected.json") ? "expected.json" : "expected_jinja2.json";
  return Json::parse(read_text_file(kChat + file));
}

ChatTemplate fixture_template(const std::string& name) {
  const Json tokens = Json::parse(read_text_file(kChat + "templates/tokens.json"))[name];
  auto token = [&](const char* key) { return tokens[key].is_null() ? std::string() : tokens[key].get<std::string>(); };
  return ChatTemplate::from_text(read_text_file(kChat + "templates/" + name + ".jinja"), name, token("bos_token"),
                                 token("eos_token"));
}

Conversation conversation(const std::string& name) {
  for (const Json& c : cases()["conversations"])
    if (c["name"] == name) return {c["messages"], "cases.json " + name};
  BOOST_FAIL("no conversation " + name);
  return {};
}

// The trained bytes of a byte-tokenizer sample as [begin, end) runs of its text.
std::vector<std::pair<size_t, size_t>> trained_runs(const ChatSample& s) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t t = 0; t < s.trained.size(); ++t) {
    if (!s.trained[t]) continue;
    if (!runs.empty() && runs.back().second == t) ++runs.back().second;
    else runs.emplace_back(t, t + 1);
  }
  return runs;
}

}  // namespace

BOOST_AUTO_TEST_CASE(three_forms_give_the_same_conversations) {
  TempDir dir("chat_forms");
  const std::string messages = dir.write("m.jsonl",
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\n\nthere"}, {"role": "assistant", "content": "Hello"}]})" "\n\n"
      R"({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})" "\n");
  const std::string sharegpt = dir.write("s.jsonl",
      R"({"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi\n\nthere"}, {"from": "gpt", "value": "Hello"}]})" "\n"
      R"({"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]})" "\n");
  const std::string alpaca_json = dir.write("a.json",
      R"([{"instruction": "Hi", "input": "there", "output": "Hello", "system": "Be brief."},
          {"instruction": "2+2?", "input": "", "output": "4"}])");
  const std::string alpaca_lines = dir.write("a.jsonl",
      R"({"instruction": "Hi", "input": "there", "output": "Hello", "system": "Be brief."})" "\n"
      R"({"instruction": "2+2?", "output": "4"})" "\n");
  const std::vector<Conversation> reference = read_conversations(messages, ChatFormat::Messages);
  BOOST_REQUIRE_EQUAL(reference.size(), 2u);
  BOOST_TEST(reference[0].where == messages + ":1");
  BOOST_TEST(reference[1].where == messages + ":3");
  for (const auto& [path, format] : std::vector<std::pair<std::string, ChatFormat>>{
           {messages, ChatFormat::Auto}, {sharegpt, ChatFormat::Sharegpt}, {sharegpt, ChatFormat::Auto},
           {alpaca_json, ChatFormat::Alpaca}, {alpaca_lines, ChatFormat::Auto}}) {
    const std::vector<Conversation> got = read_conversations(path, format);
    BOOST_REQUIRE_EQUAL(got.size(), 2u);
    for (size_t i = 0; i < 2; ++i) BOOST_TEST(got[i].messages.dump() == reference[i].messages.dump(), path);
  }
  BOOST_TEST(read_conversations(alpaca_json, ChatFormat::Auto)[1].where == alpaca_json + ": record 2");
}

BOOST_AUTO_TEST_CASE(bad_records_name_file_line_and_field) {
  TempDir dir("chat_bad");
  auto first_error = [&](const std::string& text, ChatFormat format = ChatFormat::Auto) {
    const std::string path = dir.write("bad.jsonl", text);
    return error_of([&] { read_conversations(path, format); });
  };
  const std::string ok = R"({"messages": [{"role": "user", "content": "a"}]})" "\n";
  const std::string path = (dir.root / "bad.jsonl").string();
  BOOST_TEST(first_error(ok + R"({"text": "plain"})") ==
             path + ":2: a chat record needs 'messages' (OpenAI), 'conversations' (ShareGPT) or 'instruction' (alpaca); this one has none");
  BOOST_TEST(first_error(ok + R"({"messages": [{"role": "user"}]})") == path + ":2: messages[0] has no 'content'");
  BOOST_TEST(first_error(R"({"messages": [{"role": "user", "content": 3}]})") ==
             path + ":1: messages[0].content must be a string, not 3");
  BOOST_TEST(first_error(R"({"messages": []})") == path + ":1: 'messages' must be a non-empty list of messages");
  BOOST_TEST(first_error(R"({"conversations": [{"from": "tool", "value": "x"}]})") ==
             path + ":1: conversations[0].from = 'tool' is not system, human or gpt");
  BOOST_TEST(first_error(R"({"instruction": "x"})") == path + ":1: record has no 'output'");
  BOOST_TEST(first_error(ok, ChatFormat::Sharegpt) ==
             path + ":1: no 'conversations' (data.chat_format says this file holds them)");
  BOOST_TEST(first_error("{not json").find(path + ":1: not valid JSON") == 0);
  // A depth bomb is refused at 64 levels (it overflowed the stack copying the record), in a line or a JSON array.
  const std::string deep = std::string(20000, '[') + std::string(20000, ']');
  BOOST_TEST(first_error(ok + R"({"messages": [{"role": "user", "content": "a"}], "meta": )" + deep + "}") ==
             path + ":2: nests deeper than 64 levels");
  BOOST_TEST(contains(first_error("[" + deep + "]"), "nests deeper than 64 levels"));
}

// For every fixture template and conversation the template accepts: the text is the full
// rendering, and the trained bytes are the spans between the prefix renderings.
BOOST_AUTO_TEST_CASE(trained_bytes_are_the_assistant_spans) {
  const Json exp = expected()["templates"];
  const ByteTokenizer bytes;
  size_t checked = 0;
  for (const auto& [name, per_case] : exp.items()) {
    const ChatTemplate tmpl = fixture_template(name);
    for (const Json& c : cases()["conversations"]) {
      const Json& prefixes = per_case[c["name"].get<std::string>()];
      const Json& full = prefixes.back()["plain"];
      const Conversation conv{c["messages"], "case"};
      if (full.contains("error")) {
        BOOST_TEST(error_of([&] { make_chat_sample(conv, tmpl, bytes, false, 1 << 20); }).find(full["error"].get<std::string>()) != std::string::npos);
        continue;
      }
      const ChatSample s = make_chat_sample(conv, tmpl, bytes, false, 1 << 20);
      BOOST_TEST(s.text == full["text"].get<std::string>(), name << " " << c["name"]);
      std::vector<std::pair<size_t, size_t>> spans;
      const std::string text = full["text"];
      for (size_t i = 0; i < c["messages"].size(); ++i) {
        if (c["messages"][i]["role"] != "assistant" || i == 0) continue;
        const Json &gen = prefixes[i - 1]["gen"], &through = prefixes[i]["plain"];
        if (gen.contains("error") || through.contains("error")) continue;
        const std::string g = gen["text"], t = through["text"];
        if (text.compare(0, g.size(), g) != 0 || text.compare(0, t.size(), t) != 0) continue;  // misaligned
        spans.emplace_back(g.size(), t.size());
      }
      std::vector<std::pair<size_t, size_t>> runs = trained_runs(s);
      if (name == "phi-3-mini-instruct") continue;  // its turns end before the eos_token of the last: below
      BOOST_TEST((runs == spans), name << " " << c["name"] << ": " << runs.size() << " runs, " << spans.size() << " spans");
      ++checked;
    }
  }
  BOOST_TEST(checked > 20u);
}

BOOST_AUTO_TEST_CASE(prefixes_that_do_not_line_up_are_counted) {
  const ByteTokenizer bytes;
  // Qwen3 drops an earlier turn's <think> block once a later user turn follows.
  const ChatSample thinking = make_chat_sample(conversation("thinking"), fixture_template("qwen3"), bytes, false, 1 << 20);
  BOOST_TEST(thinking.assistant_turns == 2u);
  BOOST_TEST(thinking.misaligned_turns == 1u);
  // Phi-3 ends a conversation with eos_token: a turn followed by more is trained through its <|end|>\n.
  const ChatSample phi = make_chat_sample(conversation("three_exchanges"), fixture_template("phi-3-mini-instruct"), bytes,
                                          false, 1 << 20);
  BOOST_TEST(phi.misaligned_turns == 0u);
  BOOST_REQUIRE_EQUAL(phi.spans.size(), 3u);
  BOOST_TEST(phi.text.substr(phi.spans[0].first, phi.spans[0].second - phi.spans[0].first) == "b<|end|>\n");
  BOOST_TEST(phi.text.substr(phi.spans[2].first) == "f<|end|>\n<|endoftext|>");
  // Mistral puts the system prompt into the last user turn only when the conversation ends there:
  // each turn's prompt has it, the whole conversation not.
  const ChatSample mistral = make_chat_sample(conversation("system_multi_turn"), fixture_template("mistral-7b-instruct-v0.3"),
                                              bytes, false, 1 << 20);
  BOOST_TEST(mistral.misaligned_turns == 2u);
  ChatLoad load;
  load.conversations = 3, load.assistant_turns = 5, load.misaligned_turns = 1, load.misaligned_conversations = 1;
  BOOST_TEST(chat_alignment_warning(load, "f.jsonl").find("in 1 of 3 conversations, 1 of 5 assistant turns take no loss") !=
             std::string::npos);
  BOOST_TEST(chat_alignment_warning(ChatLoad{}, "f.jsonl").empty());
}

BOOST_AUTO_TEST_CASE(refusals_name_the_record) {
  const std::string message = error_of([] {
    make_chat_sample(conversation("system_multi_turn"), fixture_template("gemma-2-it"), ByteTokenizer(), false, 1 << 20);
  });
  BOOST_TEST(message == "cases.json system_multi_turn: the chat template cannot render this conversation: gemma-2-it:1: "
                        "the template refuses the input: System role not supported");
}

BOOST_AUTO_TEST_CASE(train_on_prompt_and_max_length) {
  const ByteTokenizer bytes;
  const ChatTemplate tmpl = fixture_template("qwen2.5-instruct");
  const ChatSample all = make_chat_sample(conversation("one_turn"), tmpl, bytes, true, 1 << 20);
  BOOST_TEST(std::count(all.trained.begin(), all.trained.end(), 1) == static_cast<long>(all.ids.size()));
  const ChatSample cut = make_chat_sample(conversation("one_turn"), tmpl, bytes, false, 40);
  BOOST_TEST(cut.cut);
  BOOST_TEST(cut.ids.size() == 40u);
  const ChatSample s = make_chat_sample(conversation("one_turn"), tmpl, bytes, false, 1 << 20);
  const Example ex = chat_example(s);
  // Position t predicts token t + 1 exactly where that token is trained: "4<|im_end|>\n".
  std::string predicted;
  for (size_t t = 0; t < ex.targets.size(); ++t)
    if (ex.targets[t] >= 0) predicted.push_back(static_cast<char>(ex.targets[t]));
  BOOST_TEST(predicted == "4<|im_end|>\n");
}

// A byte-level BPE tokenizer with <|im_start|> and <|im_end|> as added tokens: the rendering keeps
// them one token each, adds no BOS, and the mask covers the assistant's tokens and <|im_end|>.
BOOST_AUTO_TEST_CASE(special_tokens_stay_single_tokens) {
  Json tokenizer = Json::parse(ByteTokenizer::hf_files(512).at("tokenizer.json"));
  int32_t next = 259;
  for (const char* content : {"<|im_start|>", "<|im_end|>"})
    tokenizer["added_tokens"].push_back({{"id", next++}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                         {"rstrip", false}, {"normalized", false}, {"special", true}});
  const HfTextTokenizer tok(HfTokenizer::from_json(tokenizer.dump(), "test tokenizer"));
  const ChatSample s = make_chat_sample(conversation("one_turn"), fixture_template("qwen2.5-instruct"), tok, false, 1 << 20);
  BOOST_TEST(s.ids.front() == 259);  // <|im_start|>, no BOS before it
  BOOST_TEST(std::count(s.ids.begin(), s.ids.end(), 259) == 3);
  BOOST_TEST(std::count(s.ids.begin(), s.ids.end(), 260) == 3);
  std::vector<int32_t> trained;
  for (size_t t = 0; t < s.ids.size(); ++t)
    if (s.trained[t]) trained.push_back(s.ids[t]);
  BOOST_TEST((trained == std::vector<int32_t>{'4', 260, '\n'}));
}

// GPT-2's byte-level BPE with <|im_start|> and <|im_end|> as special added tokens, and a template whose
// generation prompt ends in "\n\n": the whole text splits it into two "Ċ" before the reply, the prompt
// alone into one "ĊĊ". Neither "Ċ" is the reply's. (They took the loss when a special token came
// before them: the text decoded so far skipped it and never matched the prompt's.) Plain-text
// markers in place of the special tokens give the same mask.
BOOST_AUTO_TEST_CASE(special_tokens_before_a_turn_leave_its_prompt_untrained) {
  const std::string dir = SHARDLM_SOURCE_DIR "/tests/fixtures/tokenizer/gpt2/";
  Json tokenizer = Json::parse(read_text_file(dir + "tokenizer.json"));
  int32_t next = 50257;
  for (const char* content : {"<|im_start|>", "<|im_end|>"})
    tokenizer["added_tokens"].push_back({{"id", next++}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                         {"rstrip", false}, {"normalized", false}, {"special", true}});
  const HfTextTokenizer tok(
      HfTokenizer::from_json(tokenizer.dump(), "gpt2 + chat tokens", read_text_file(dir + "tokenizer_config.json")));
  const Conversation conv{Json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])"),
                          "case"};
  for (const std::string start : {"<|im_start|>", "[start]"}) {
    const std::string end = start == "[start]" ? "[end]" : "<|im_end|>";
    const ChatTemplate tmpl = ChatTemplate::from_text(
        "{% for m in messages %}{{ '" + start + "' + m.role + ':\\n\\n' + m.content + '" + end + "' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '" + start + "assistant:\\n\\n' }}{% endif %}", "t.jinja");
    const ChatSample s = make_chat_sample(conv, tmpl, tok, false, 1 << 20);
    BOOST_TEST_CONTEXT(start) {
      const std::vector<int32_t> newline = tok.encode("\n");
      BOOST_TEST(std::count(s.ids.begin(), s.ids.end(), newline.at(0)) == 4);  // each "\n\n" split in two
      std::vector<int32_t> trained;
      for (size_t t = 0; t < s.ids.size(); ++t)
        if (s.trained[t]) trained.push_back(s.ids[t]);
      const std::vector<int32_t> want = tok.encode("Hello" + end);
      BOOST_TEST(trained == want, boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(where_the_template_comes_from) {
  TempDir dir("chat_template");
  const std::string model = (dir.root / "model").string();
  BOOST_TEST(error_of([&] { find_chat_template("", model, ""); }).find("data.format = chat needs a chat template") == 0);
  dir.write("model/tokenizer_config.json",
            R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"})");
  const Json messages = Json::parse(R"([{"role": "user", "content": "x"}])");
  BOOST_TEST(find_chat_template("", model, "").render(messages, false) == "<s>x</s>");
  dir.write("model/chat_template.jinja", "J{{ eos_token }}");
  BOOST_TEST(find_chat_template("", model, "").render(messages, false) == "J</s>");
  const std::string override_jinja = dir.write("o.jinja", "O{{ bos_token }}\n");
  BOOST_TEST(find_chat_template(override_jinja, model, "").render(messages, false) == "O<s>");
  const std::string config = dir.write("cfg/tokenizer_config.json",
                                       R"({"eos_token": "E", "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ eos_token }}"}]})");
  BOOST_TEST(find_chat_template(config, model, "").render(messages, false) == "DE");
  const std::string broken = dir.write("b.jinja", "line 1\n{{ x | nosuchfilter }}");
  BOOST_TEST(error_of([&] { find_chat_template(broken, "", ""); }) == broken + ":2: no filter named 'nosuchfilter'");
}

// `shardlm preprocess DECK --out FILE`: one JSON line per sample with the text, the ids and the
// mask training uses (input/demo.ini with chat data and the byte tokenizer).
BOOST_AUTO_TEST_CASE(preprocess_writes_what_training_sees) {
  TempDir dir("chat_preprocess");
  const std::string data = dir.write("chat.jsonl",
      R"({"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]})" "\n"
      R"({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]})" "\n");
  const std::string out = (dir.root / "samples.jsonl").string();
  const std::vector<std::string> args = {SHARDLM_SOURCE_DIR "/input/demo.ini", "--data.format=chat",
                                         "--data.train_file=" + data, "--data.eval_file=",
                                         "--data.chat_template=" + kChat + "templates/qwen2.5-instruct.jinja",
                                         "--out", out};
  BOOST_REQUIRE_EQUAL(command_preprocess(args), 0);
  std::ifstream in(out);
  std::string line;
  std::vector<Json> lines;
  while (std::getline(in, line)) lines.push_back(Json::parse(line));
  BOOST_REQUIRE_EQUAL(lines.size(), 2u);
  const ChatSample s = make_chat_sample(conversation("one_turn"), fixture_template("qwen2.5-instruct"), ByteTokenizer(),
                                        false, 256);
  BOOST_TEST(lines[0]["text"].get<std::string>() == s.text);
  BOOST_TEST(lines[0]["input_ids"].get<std::vector<int32_t>>() == s.ids);
  BOOST_TEST(lines[0]["loss_mask"].get<std::vector<int>>() == std::vector<int>(s.trained.begin(), s.trained.end()));
  BOOST_TEST(command_preprocess({SHARDLM_SOURCE_DIR "/input/demo.ini", "--limit", "zero"}) == 2);
  // A deck for emulated nodes (dist.ranks_per_node) runs in one process too: the key means nothing here.
  const std::string nodes = (dir.root / "nodes.jsonl").string();
  BOOST_TEST(command_preprocess({SHARDLM_SOURCE_DIR "/input/demo.ini", "--dist.ranks_per_node=2", "--limit", "1",
                                 "--out", nodes}) == 0);
  std::ifstream written(nodes);
  size_t count = 0;
  while (std::getline(written, line)) ++count;
  BOOST_TEST(count == 1u);
}

// With data.train_size the run trains on a seeded subset: preprocess shows those records, as training
// loads them, and the loaders mark the samples that lost tokens to max_length.
BOOST_AUTO_TEST_CASE(preprocess_shows_the_runs_subset) {
  TempDir dir("subset_preprocess");
  const std::string out = (dir.root / "samples.jsonl").string();
  const std::string squad = SHARDLM_SOURCE_DIR "/input/data/demo_squad_train.json";
  BOOST_REQUIRE_EQUAL(command_preprocess({SHARDLM_SOURCE_DIR "/input/demo.ini", "--data.train_size=5", "--out", out}), 0);
  std::ifstream in(out);
  std::string line;
  std::vector<Json> lines;
  while (std::getline(in, line)) lines.push_back(Json::parse(line));
  DataSection data;
  data.max_length = 256;  // the demo deck's
  const std::vector<Example> trained = load_squad(squad, ByteTokenizer(), dataset_options(data, 5, 42));
  BOOST_REQUIRE_EQUAL(lines.size(), trained.size());
  BOOST_REQUIRE_EQUAL(trained.size(), 5u);
  for (size_t i = 0; i < trained.size(); ++i) BOOST_TEST(lines[i]["input_ids"].get<std::vector<int32_t>>() == trained[i].tokens);
  // The first five records are not the subset (it is drawn with train.seed).
  const std::vector<Example> first = load_squad(squad, ByteTokenizer(), [] { DatasetOptions o; o.max_length = 256; o.limit = 5; return o; }());
  bool same = true;
  for (size_t i = 0; i < first.size(); ++i) same = same && first[i].tokens == trained[i].tokens;
  BOOST_TEST(!same);
  data.max_length = 96;
  size_t cut = 0;
  for (const Example& ex : load_squad(squad, ByteTokenizer(), dataset_options(data, 0, 42))) cut += ex.cut;
  BOOST_TEST(cut > 0u);
  data.max_length = 4096;
  for (const Example& ex : load_squad(squad, ByteTokenizer(), dataset_options(data, 0, 42))) BOOST_TEST(!ex.cut);
}
