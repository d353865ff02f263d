// `shardlm generate` under mpirun: greedy continuations of the tiny parity models equal
// transformers' generate() token for token (tests/fixtures/hf/*generate_reference.json) on 1 and 2
// ranks; sampling is reproducible for a seed, on any ranks, and differs from greedy; a checkpoint
// trained here on chat data answers its questions with the chat template applied (a byte tokenizer
// and a template override with its end-of-turn text); bad models, adapters, prompts and options end
// with one clear message.
#define BOOST_TEST_MODULE test_generate_command
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch_support.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kFixtures = SHARDLM_SOURCE_DIR "/tests/fixtures/hf";

fs::path scratch(const std::string& name) {
  fs::path dir = fs::path(SHARDLM_BINARY_DIR) / "test_runs" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

struct Result {
  std::vector<int32_t> ids;
  std::string text, finish;
};

// `shardlm generate ARGS --output F` on np ranks; the record it wrote.
Result generate(int np, const std::string& args, const fs::path& out) {
  fs::remove(out);
  const Outcome o = run_shardlm(np, "generate " + args + " --output " + out.string());
  BOOST_TEST_REQUIRE(o.exit_code == 0, "shardlm generate " << args << "\n" << o.output);
  const nlohmann::json j = nlohmann::json::parse(read_text_file(out.string()));
  return {j.at("generated_ids").get<std::vector<int32_t>>(), j.at("text").get<std::string>(),
          j.at("finish_reason").get<std::string>()};
}

// `shardlm ARGS` on np ranks ends with one error message that says must_contain.
void expect_error(int np, const std::string& args, const std::string& must_contain) {
  const Outcome o = run_shardlm(np, args);
  BOOST_TEST_CONTEXT("np " << np << ": shardlm " << args << "\n" << o.output) {
    BOOST_TEST(o.exit_code != 0);
    BOOST_TEST(count_of(o.output, "shardlm: error:") == 1u);  // one message, not one per rank
    BOOST_TEST(count_of(o.output, must_contain) == 1u);
  }
}

struct Case {
  std::vector<int32_t> prompt, generated;  // generated as transformers returned it (an EOS last, if it came)
};

struct Reference {
  int32_t eos = 0;
  int max_new_tokens = 0;
  std::vector<Case> cases;
};

Reference read_reference(const std::string& file, const std::string& model) {
  const nlohmann::json j = nlohmann::json::parse(read_text_file(kFixtures + "/" + file)).at(model);
  Reference r;
  r.eos = j.at("eos_id").get<int32_t>();
  r.max_new_tokens = j.at("max_new_tokens").get<int>();
  for (const nlohmann::json& c : j.at("cases"))
    r.cases.push_back({c.at("prompt").get<std::vector<int32_t>>(), c.at("generated").get<std::vector<int32_t>>()});
  return r;
}

// Every case of the model's reference (or the first `limit`) on np ranks: the same ids, the EOS a stop.
void check_against_transformers(const std::string& file, const std::string& model, int np, size_t limit = 100) {
  const Reference ref = read_reference(file, model);
  BOOST_TEST_REQUIRE(!ref.cases.empty());
  const fs::path out = scratch("generate_" + model + "_np" + std::to_string(np)) / "out.json";
  for (size_t i = 0; i < std::min(limit, ref.cases.size()); ++i) {
    const Case& c = ref.cases[i];
    const Result r = generate(np, kFixtures + "/" + model + " --prompt-ids " + ids_text(c.prompt) + " --eos-ids " +
                                      std::to_string(ref.eos) + " --max-new-tokens " +
                                      std::to_string(ref.max_new_tokens), out);
    std::vector<int32_t> expected = c.generated;
    const bool stopped = !expected.empty() && expected.back() == ref.eos;
    if (stopped) expected.pop_back();
    BOOST_TEST_CONTEXT(model << " case " << i << " on " << np << " rank(s)") {
      BOOST_TEST(r.ids == expected, boost::test_tools::per_element());
      BOOST_TEST(r.finish == (stopped ? "stop" : "length"));
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(greedy_generation_equals_transformers_on_one_and_two_ranks) {
  check_against_transformers("generate_reference.json", "tiny_bloom", 1);
  check_against_transformers("generate_reference.json", "tiny_llama", 1);
  check_against_transformers("qwen2_generate_reference.json", "tiny_qwen2", 1);
  check_against_transformers("qwen3_generate_reference.json", "tiny_qwen3", 1);
  // Sharded: each rank holds half of every unit, gathered for each step.
  check_against_transformers("generate_reference.json", "tiny_llama", 2);
  check_against_transformers("generate_reference.json", "tiny_bloom", 2, 2);
  check_against_transformers("qwen3_generate_reference.json", "tiny_qwen3", 2, 2);
}

BOOST_AUTO_TEST_CASE(sampling_is_reproducible_on_any_ranks_and_differs_from_greedy) {
  const Reference ref = read_reference("generate_reference.json", "tiny_llama");
  const fs::path out = scratch("generate_sampling") / "out.json";
  const std::string base = kFixtures + "/tiny_llama --prompt-ids " + ids_text(ref.cases[2].prompt) +
                           " --eos-ids " + std::to_string(ref.eos) + " --max-new-tokens 16";
  const Result greedy = generate(1, base, out);
  const Result a = generate(1, base + " --temperature 1 --seed 7", out);
  const Result again = generate(1, base + " --temperature 1 --seed 7", out);
  const Result two = generate(2, base + " --temperature 1 --seed 7", out);
  const Result other = generate(1, base + " --temperature 1 --seed 8", out);
  BOOST_TEST(a.ids == again.ids, boost::test_tools::per_element());
  BOOST_TEST(a.ids == two.ids, boost::test_tools::per_element());
  BOOST_TEST(a.ids != greedy.ids);
  BOOST_TEST(a.ids != other.ids);
  // A nucleus that holds only the most likely token is greedy decoding.
  const Result nucleus = generate(2, base + " --temperature 1 --top-p 1e-9 --seed 7", out);
  BOOST_TEST(nucleus.ids == greedy.ids, boost::test_tools::per_element());
  // So is a top-k of one; sampling keeps transformers' top-k of 50 unless told (--top-k 0: all 97 tokens).
  const Result top1 = generate(2, base + " --temperature 1 --top-k 1 --seed 7", out);
  BOOST_TEST(top1.ids == greedy.ids, boost::test_tools::per_element());
  const Result all = generate(1, base + " --temperature 1 --top-k 0 --seed 7", out);
  BOOST_TEST(all.ids != a.ids);
  BOOST_TEST(generate(1, base + " --temperature 1 --top-k 50 --seed 7", out).ids == a.ids,
             boost::test_tools::per_element());
}

// A generation_config.json that asks for sampling or a repetition penalty is said not to be followed (shardlm
// generate is greedy unless --temperature is given); --output's folder is checked before the model loads.
BOOST_AUTO_TEST_CASE(untaken_generation_settings_are_said_and_the_output_is_checked_first) {
  const fs::path dir = scratch("generate_settings");
  fs::remove_all(dir / "llama");
  fs::copy(kFixtures + "/tiny_llama", dir / "llama", fs::copy_options::recursive);
  std::ofstream(dir / "llama" / "generation_config.json")
      << R"({"eos_token_id": 2, "do_sample": true, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.05})";
  const Outcome o = run_shardlm(2, "generate " + (dir / "llama").string() + " --prompt-ids 90 --max-new-tokens 2");
  BOOST_TEST(o.exit_code == 0, o.output);
  BOOST_TEST(count_of(o.output, "generation_config.json asks for sampling (do_sample: temperature 0.6, top_p 0.9); "
                                "shardlm generate is greedy unless --temperature is given (--top-p, --top-k then "
                                "apply); repetition_penalty 1.05, which shardlm generate does not apply") == 1u,
             o.output);
  BOOST_TEST(contains(o.output, "greedy, stop ids 2\n"), o.output);
  const Outcome plain = run_shardlm(1, "generate " + kFixtures + "/tiny_llama --prompt-ids 90 --max-new-tokens 2");
  BOOST_TEST(!contains(plain.output, "asks for"), plain.output);
  for (int np : {1, 2}) {
    const std::string missing = (dir / "nowhere" / "out.json").string();
    expect_error(np, "generate " + kFixtures + "/tiny_llama --prompt-ids 90 --output " + missing,
                 "does not exist");
    const Outcome late = run_shardlm(np, "generate " + kFixtures + "/tiny_llama --prompt-ids 90 --output " + missing);
    BOOST_TEST(!contains(late.output, "loaded in"), late.output);  // refused before the model loads
    expect_error(np, "generate " + kFixtures + "/tiny_llama --prompt-ids 90 --output " + dir.string(), "is a folder");
  }
}

namespace {

// A tiny Llama with the byte tokenizer trained on four questions, each with its one-word answer, in
// ChatML through a tokenizer_config.json override whose eos_token is the end of turn.
const char* const kChatDeck = R"([model]
arch = llama
vocab_size = 259
hidden_size = 64
intermediate_size = 128
num_layers = 2
num_heads = 4
num_kv_heads = 2
rope_theta = 10000

[data]
format = chat
train_file = chat.jsonl
chat_template = tokenizer_config.json
tokenizer = byte
max_length = 128

[train]
epochs = 200
max_steps = 300
batch_size = 8
micro_batch_size = 2
lr = 3e-3
warmup_steps = 5
lr_schedule = constant_with_warmup
seed = 3
log_every = 50

[checkpoint]
at_end = true

[run]
dir = run
backend = cpu
tensorboard = false
)";

const std::vector<std::pair<std::string, std::string>> kAnswers = {
    {"sky", "blue"}, {"grass", "green"}, {"fire", "red"}, {"snow", "white"}};
const std::string kSystem = "Name the colour.";

// Trains the chat model once (2 ranks) and returns its run folder.
fs::path trained_chat_run() {
  static const fs::path run = [] {
    const fs::path dir = scratch("generate_chat");
    std::ofstream(dir / "tokenizer_config.json")
        << nlohmann::json{{"chat_template",
                           "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"},
                          {"eos_token", "<|im_end|>"}}
               .dump();
    {
      std::ofstream data(dir / "chat.jsonl");
      for (int copy = 0; copy < 8; ++copy)
        for (const auto& [question, answer] : kAnswers)
          data << nlohmann::json{{"messages",
                                  {{{"role", "system"}, {"content", kSystem}},
                                   {{"role", "user"}, {"content", question}},
                                   {{"role", "assistant"}, {"content", answer}}}}}
                      .dump()
               << "\n";
    }
    std::ofstream(dir / "chat.ini") << kChatDeck;
    const Outcome o = run_shardlm(2, "train " + (dir / "chat.ini").string() + " --run.dir=" + (dir / "run").string(),
                                  "", 600);
    BOOST_TEST_REQUIRE(o.exit_code == 0, o.output);
    return dir / "run";
  }();
  return run;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_trained_chat_checkpoint_answers_with_its_template) {
  const fs::path run = trained_chat_run();
  const fs::path out = run.parent_path() / "answer.json";
  for (int np : {1, 2})
    for (const auto& [question, answer] : kAnswers) {
      const Result r = generate(np, run.string() + " --chat --system '" + kSystem + "' --prompt " + question +
                                        " --max-new-tokens 40", out);
      BOOST_TEST_CONTEXT(question << " on " << np << " rank(s)") {
        // The end of turn is text to the byte tokenizer: the answer stops there, without it.
        BOOST_TEST(r.text == answer);
        BOOST_TEST(r.finish == "stop");
      }
    }
  // --eos-ids replaces the end of turn too: the answer runs on past it, which the text keeps.
  const Result past = generate(1, run.string() + " --chat --system '" + kSystem + "' --prompt sky --eos-ids 258"
                                  " --max-new-tokens 30", out);
  BOOST_TEST(past.text.rfind("blue<|im_end|>", 0) == 0, past.text);
  BOOST_TEST(past.finish == "length");
  // The checkpoint file and its folder are the run's latest too.
  const Result file = generate(1, (run / "checkpoints").string() + " --chat --system '" + kSystem + "' --prompt sky", out);
  BOOST_TEST(file.text == "blue");
}

// A prompt file and standard input are the same prompt: each drops one final newline (an editor's, a typed
// line's), no more.
BOOST_AUTO_TEST_CASE(a_prompt_file_and_standard_input_drop_one_final_newline) {
  const fs::path run = trained_chat_run();
  const fs::path dir = run.parent_path();
  const auto prompt_ids = [&](const std::string& prompt, const std::string& stdin_from) {
    const fs::path out = dir / "prompt.json";
    fs::remove(out);
    const Outcome o = run_shardlm(1, "generate " + run.string() + " " + prompt + " --max-new-tokens 1 --output " +
                                         out.string(), stdin_from);
    BOOST_TEST_REQUIRE(o.exit_code == 0, prompt << "\n" << o.output);
    return nlohmann::json::parse(read_text_file(out.string())).at("prompt_ids").get<std::vector<int32_t>>();
  };
  std::ofstream(dir / "line.txt") << "sky\n";
  std::ofstream(dir / "blank_line.txt") << "sky\n\n";
  const std::vector<int32_t> typed = prompt_ids("--prompt sky", "");
  BOOST_TEST(prompt_ids("--prompt-file " + (dir / "line.txt").string(), "") == typed, boost::test_tools::per_element());
  BOOST_TEST(prompt_ids("--prompt-file -", "printf 'sky\\n' |") == typed, boost::test_tools::per_element());
  BOOST_TEST(prompt_ids("", "printf 'sky\\n' |") == typed, boost::test_tools::per_element());
  // A blank line last is the prompt's: one newline of the two stays, from a file as from standard input.
  const std::vector<int32_t> blank = prompt_ids("--prompt-file " + (dir / "blank_line.txt").string(), "");
  BOOST_TEST(blank.size() == typed.size() + 1);
  BOOST_TEST(prompt_ids("--prompt-file -", "printf 'sky\\n\\n' |") == blank, boost::test_tools::per_element());
}

// A run that fine-tunes a model folder (here a tiny Llama exported from a demo run): its checkpoint generates,
// and its resolved deck, which shows the folder's shape as comments, runs again as it is.
BOOST_AUTO_TEST_CASE(a_model_dir_runs_checkpoint_generates_and_its_resolved_deck_runs_again) {
  const fs::path dir = scratch("generate_model_dir");
  const std::string demo = SHARDLM_SOURCE_DIR "/input/demo.ini";
  auto ok = [](const Outcome& o) { BOOST_TEST_REQUIRE(o.exit_code == 0, o.output); };
  ok(run_shardlm(1, "train " + demo + " --model.arch=llama --train.max_steps=1 --run.dir=" + (dir / "base_run").string()));
  ok(run_shardlm(1, "export " + (dir / "base_run" / "checkpoints").string() + " " + (dir / "base").string()));
  ok(run_shardlm(1, "train " + demo + " --model.dir=" + (dir / "base").string() + " --train.max_steps=1 --run.dir=" +
                        (dir / "run").string()));
  const Result r = generate(2, (dir / "run").string() + " --prompt-ids 1,2,3 --max-new-tokens 3", dir / "out.json");
  BOOST_TEST(!r.finish.empty());
  ok(run_shardlm(1, "train " + (dir / "run" / "deck.resolved.ini").string() + " --run.dir=" + (dir / "again").string()));
  // --prompt '' is the prompt (the BOS alone), not a cue to read standard input.
  const fs::path out = dir / "empty.json";
  ok(run_shardlm(1, "generate " + (dir / "run").string() + " --prompt '' --max-new-tokens 2 --output " + out.string(),
                 "echo text-on-stdin |"));
  const nlohmann::json j = nlohmann::json::parse(read_text_file(out.string()));
  BOOST_TEST(j.at("prompt_ids").size() <= 1u, j.dump());
}

BOOST_AUTO_TEST_CASE(bad_models_adapters_and_prompts_end_with_one_message) {
  const fs::path dir = scratch("generate_errors");
  const std::string llama = kFixtures + "/tiny_llama";
  for (int np : {1, 2}) {
    expect_error(np, "generate " + (dir / "nothing").string() + " --prompt-ids 1", "does not exist");
    expect_error(np, "generate " + dir.string() + " --prompt-ids 1", "is neither a checkpoint");
    expect_error(np, "generate " + llama + " --prompt-ids 1,500", "token id 500, outside the model's vocabulary of 97");
    // The byte tokenizer's 259 ids do not fit the fixture's 97.
    expect_error(np, "generate " + llama + " --data.tokenizer=byte --prompt hello", "more than the model's vocab_size 97");
    expect_error(np, "generate " + llama + " --adapter " SHARDLM_SOURCE_DIR "/tests/fixtures/peft/tiny_bloom_lora --prompt-ids 1",
                 "tiny_bloom_lora");
    expect_error(np, "generate " + llama + " --prompt-ids 1 --run.bakend=cpu", "run.backend");
  }
  std::ofstream(dir / "broken.h5") << "not an HDF5 file";
  expect_error(2, "generate " + (dir / "broken.h5").string() + " --prompt-ids 1", "broken.h5");
  const fs::path run = trained_chat_run();
  expect_error(2, "generate " + run.string() + " --adapter " + llama + " --prompt x", "--adapter goes with a model folder");
  // No template: none in the deck (overridden away), none beside a byte tokenizer.
  expect_error(2, "generate " + run.string() + " --chat --prompt sky --data.chat_template=", "needs a chat template");
  // Usage: before MPI starts, the command's own usage.
  for (const auto& [args, problem] :
       std::vector<std::pair<std::string, std::string>>{{"generate", "no model given"},
                                                        {"generate m --top-p 0.9", "give --temperature > 0 too"},
                                                        {"generate m --top-k 5", "give --temperature > 0 too"},
                                                        {"generate m --seed 3", "give --temperature > 0 too"},
                                                        {"generate m --temperature 1 --top-k -1", "--top-k = '-1'"},
                                                        {"generate m --temperature -1", "--temperature = '-1'"},
                                                        {"generate m --prompt a --prompt-ids 1", "give one of"},
                                                        {"generate m --system s --prompt a", "give --chat too"}}) {
    const Outcome o = run_shardlm(2, args);
    BOOST_TEST_CONTEXT(args << "\n" << o.output) {
      BOOST_TEST(o.exit_code != 0);
      BOOST_TEST(count_of(o.output, problem) == 1u);
      BOOST_TEST(count_of(o.output, "usage: [mpirun -np N] shardlm generate") == 1u);
    }
  }
}

namespace {

// A copy of the fixture folder `model` as `dir`, its config.json changed by `edit`.
fs::path edited_copy(const std::string& model, const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  fs::remove_all(dir);
  fs::copy(kFixtures + "/" + model, dir, fs::copy_options::recursive);
  nlohmann::json config = nlohmann::json::parse(read_text_file((dir / "config.json").string()));
  edit(config);
  std::ofstream(dir / "config.json") << config.dump(1);
  return dir;
}

}  // namespace

// Without generation_config.json, config.json's eos_token_id stops the answer, as transformers' generate() takes
// it (GenerationConfig.from_model_config): a number or a list, the text_config's of Gemma 3's multimodal
// checkpoints where the top level has none. A generation_config.json that is not JSON, or ids that are not
// integers, end with one message naming the file.
BOOST_AUTO_TEST_CASE(config_json_eos_stops_without_a_generation_config) {
  const fs::path dir = scratch("generate_config_eos");
  // The tiny Llama continues 90 with 73, 73, 73, 8 (docs/generate.md's example).
  for (const nlohmann::json& eos : {nlohmann::json(8), nlohmann::json::array({52, 8})}) {
    const fs::path model = edited_copy("tiny_llama", dir / "llama", [&](nlohmann::json& c) { c["eos_token_id"] = eos; });
    const Result r = generate(1, model.string() + " --prompt-ids 90 --max-new-tokens 12", dir / "out.json");
    BOOST_TEST_CONTEXT("eos_token_id " << eos.dump()) {
      BOOST_TEST(r.ids == (std::vector<int32_t>{73, 73, 73}), boost::test_tools::per_element());
      BOOST_TEST(r.finish == "stop");
    }
  }
  // The fixture's own eos_token_id 2; no tokenizer, so no byte EOS (257) beside it.
  const Outcome plain = run_shardlm(1, "generate " + kFixtures + "/tiny_llama --prompt-ids 90 --max-new-tokens 2");
  BOOST_TEST(plain.exit_code == 0, plain.output);
  BOOST_TEST(contains(plain.output, "greedy, stop ids 2\n"), plain.output);
  // Gemma 3's multimodal folder: its text_config's eos_token_id, the top level's where it has one.
  const fs::path gemma = edited_copy("tiny_gemma3_mm", dir / "gemma", [](nlohmann::json& c) {
    c["text_config"]["eos_token_id"] = 7;
  });
  fs::remove(gemma / "generation_config.json");
  const Outcome text_config = run_shardlm(1, "generate " + gemma.string() + " --prompt-ids 2 --max-new-tokens 2");
  BOOST_TEST(contains(text_config.output, "greedy, stop ids 7\n"), text_config.output);
  nlohmann::json config = nlohmann::json::parse(read_text_file((gemma / "config.json").string()));
  config["eos_token_id"] = {1, 106};
  std::ofstream(gemma / "config.json") << config.dump(1);
  const Outcome top = run_shardlm(1, "generate " + gemma.string() + " --prompt-ids 2 --max-new-tokens 2");
  BOOST_TEST(contains(top.output, "greedy, stop ids 1, 106\n"), top.output);
  // A generation_config.json there is read instead, and must be JSON.
  std::ofstream(gemma / "generation_config.json") << "{\"eos_token_id\": 1,";
  for (int np : {1, 2})
    expect_error(np, "generate " + gemma.string() + " --prompt-ids 2", "generation_config.json is not valid JSON");
  const fs::path text_ids = edited_copy("tiny_llama", dir / "text_ids", [](nlohmann::json& c) {
    c["eos_token_id"] = {2, "</s>"};
  });
  expect_error(2, "generate " + text_ids.string() + " --prompt-ids 2",
               "config.json: 'eos_token_id' must be a token id or a list of them (integers >= 0), holds \"</s>\"");
}

// A model folder without tokenizer.json takes token ids and gives token ids: a text prompt is refused as training
// refuses the folder (the byte tokenizer fits this vocabulary of 259, and read the text and wrote the answer in
// another vocabulary than the model's, in silence), and the byte tokenizer's EOS is no stop. A run trained with
// the byte tokenizer on purpose keeps it: its text in and out, its EOS a stop.
BOOST_AUTO_TEST_CASE(a_model_folder_without_a_tokenizer_takes_and_gives_ids) {
  const fs::path run = trained_chat_run();
  const fs::path dir = scratch("generate_no_tokenizer");
  const fs::path model = dir / "model";
  const Outcome exported = run_shardlm(1, "export " + (run / "checkpoints").string() + " " + model.string());
  BOOST_TEST_REQUIRE(exported.exit_code == 0, exported.output);
  fs::remove(model / "tokenizer.json");
  for (int np : {1, 2}) {
    expect_error(np, "generate " + model.string() + " --prompt sky", "or give the prompt as token ids with --prompt-ids");
    expect_error(np, "generate " + model.string() + " --prompt sky",
                 "data.tokenizer = auto: model.dir " + model.string() + " has no tokenizer.json");
  }
  // Ids in, ids out; the folder's own eos_token_id (257 in its config.json) still stops.
  const Result ids = generate(2, model.string() + " --prompt-ids 256,115,107,121 --max-new-tokens 4", dir / "out.json");
  std::string printed;
  for (int32_t id : ids.ids) printed += (printed.empty() ? "" : " ") + std::to_string(id);
  BOOST_TEST(ids.text == printed);
  const Outcome with_eos = run_shardlm(1, "generate " + model.string() + " --prompt-ids 256 --max-new-tokens 1");
  BOOST_TEST(contains(with_eos.output, "greedy, stop ids 257\n"), with_eos.output);
  fs::remove(model / "generation_config.json");
  nlohmann::json config = nlohmann::json::parse(read_text_file((model / "config.json").string()));
  config.erase("eos_token_id");
  std::ofstream(model / "config.json") << config.dump(1);
  const Outcome no_eos = run_shardlm(1, "generate " + model.string() + " --prompt-ids 256 --max-new-tokens 1");
  BOOST_TEST(contains(no_eos.output, "greedy, no stop ids\n"), no_eos.output);
  // The byte tokenizer asked for by name reads text.
  const Result byte = generate(1, model.string() + " --data.tokenizer=byte --prompt sky --max-new-tokens 2", dir / "b.json");
  BOOST_TEST((byte.ids.size() <= 2u && !byte.finish.empty()));
  // The run that trained it with the byte tokenizer: text, and the byte tokenizer's EOS a stop.
  const Outcome trained = run_shardlm(1, "generate " + run.string() + " --prompt sky --max-new-tokens 1");
  BOOST_TEST(trained.exit_code == 0, trained.output);
  BOOST_TEST(contains(trained.output, "greedy, stop ids 257\n"), trained.output);
}
