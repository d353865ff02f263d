// `shardlm generate MODEL`: try a model as users do right after training. The model (a checkpoint,
// a run or checkpoint folder, or a Hugging Face model folder with an optional PEFT adapter) is loaded
// sharded over the ranks as training holds it, rank 0 continues one prompt (plain, or a chat turn
// rendered with the model's chat template) greedily or by sampling through the loop the SQuAD
// evaluation uses (src/train/generate.cpp), and prints the text as the tokens come.
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "../../core/input_file.hpp"
#include "../../data/chat.hpp"
#include "../../train/generate.hpp"
#include "../../train/generate_model.hpp"
#include "shardlm/config.hpp"
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"
#include "shardlm/dist.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

// transformers' GenerationConfig.top_k, which its generate(do_sample=True) applies unless told otherwise.
constexpr int kDefaultTopK = 50;

struct GenerateArgs {
  std::string model, adapter;
  std::string prompt, prompt_file, prompt_ids, system;
  bool has_prompt = false, chat = false;
  bool prompt_given = false;  // --prompt, even empty
  int max_new_tokens = 256;
  double temperature = 0, top_p = 1;
  int top_k = -1;  // -1: not given (50 when sampling, as transformers' GenerationConfig)
  uint64_t seed = 0;
  bool seed_given = false;
  std::string eos_ids;  // empty: the model's
  std::string output;   // a JSON file of the result; empty: none
  std::vector<std::string> overrides;
};

// `text` as a number of type T, all of it, in [lo, hi]; Error naming `flag` otherwise.
template <typename T>
T parse_number(const std::string& flag, const std::string& text, T lo, T hi, const char* expected) {
  size_t used = 0;
  long double v = 0;
  try {
    v = std::stold(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const bool whole = std::is_integral_v<T> ? v == static_cast<long double>(static_cast<long long>(v)) : true;
  SHARDLM_CHECK(used == text.size() && used > 0 && whole && v >= lo && v <= hi, flag, " = '", text, "': expected ",
                expected);
  return static_cast<T>(v);
}

// "1,2,3" (commas and/or spaces) as token ids >= 0.
std::vector<int32_t> parse_ids(const std::string& flag, const std::string& text) {
  std::vector<int32_t> ids;
  std::string item;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ',' || text[i] == ' ') {
      if (!item.empty())
        ids.push_back(parse_number<int32_t>(flag, item, 0, INT32_MAX, "token ids >= 0, separated by commas"));
      item.clear();
    } else {
      item += text[i];
    }
  }
  SHARDLM_CHECK(!ids.empty(), flag, " = '", text, "': expected token ids >= 0, separated by commas");
  return ids;
}

GenerateArgs parse_generate_args(const std::vector<std::string>& args) {
  GenerateArgs g;
  SHARDLM_CHECK(!args.empty(), "no model given: the first argument is a checkpoint, a run folder or a model folder");
  SHARDLM_CHECK(args[0].rfind("--", 0) != 0, "the first argument must be the model, not the option '", args[0], "'");
  g.model = args[0];
  int prompts = 0;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    std::string v;
    auto value = [&](const std::string& flag) {
      SHARDLM_CHECK(a != flag || i + 1 < args.size(), flag, " needs a value");
      return option_value(args, i, flag, v);
    };
    if (value("--adapter")) {
      g.adapter = v;
    } else if (value("--prompt")) {
      g.prompt = v, g.prompt_given = true, ++prompts;
    } else if (value("--prompt-file")) {
      g.prompt_file = v, ++prompts;
    } else if (value("--prompt-ids")) {
      g.prompt_ids = v, ++prompts;
      parse_ids("--prompt-ids", v);
    } else if (value("--system")) {
      g.system = v;
    } else if (a == "--chat") {
      g.chat = true;
    } else if (value("--max-new-tokens")) {
      g.max_new_tokens = parse_number<int>("--max-new-tokens", v, 1, 1 << 20, "a whole number >= 1");
    } else if (value("--temperature")) {
      g.temperature = parse_number<double>("--temperature", v, 0, 1e6, "a number >= 0 (0: greedy)");
    } else if (value("--top-p")) {
      g.top_p = parse_number<double>("--top-p", v, 0, 1, "a number in (0, 1]");
      SHARDLM_CHECK(g.top_p > 0, "--top-p = '", v, "': expected a number in (0, 1]");
    } else if (value("--top-k")) {
      g.top_k = parse_number<int>("--top-k", v, 0, INT32_MAX, "a whole number >= 0 (0: no cut)");
    } else if (value("--seed")) {
      g.seed = parse_number<uint64_t>("--seed", v, 0, static_cast<uint64_t>(1) << 53, "a whole number >= 0");
      g.seed_given = true;
    } else if (value("--eos-ids")) {
      g.eos_ids = v;
      parse_ids("--eos-ids", v);
    } else if (value("--output")) {
      g.output = v;
    } else if (deck_key_argument(args, i, g.overrides)) {
      // load_run_config_text checks the key and its value
    } else if (a.rfind("--", 0) == 0) {
      throw Error(concat("unknown or incomplete option '", a, "'"));
    } else {
      throw Error(concat("unexpected argument '", a, "' (one model; the prompt goes with --prompt)"));
    }
  }
  g.has_prompt = prompts > 0;
  SHARDLM_CHECK(prompts <= 1, "give one of --prompt, --prompt-file and --prompt-ids");
  SHARDLM_CHECK(g.prompt_ids.empty() || !g.chat, "--chat renders a text prompt with the chat template: it does not "
                "take --prompt-ids");
  SHARDLM_CHECK(g.system.empty() || g.chat, "--system is the system turn of a chat: give --chat too");
  SHARDLM_CHECK(g.top_p == 1 || g.temperature > 0, "--top-p restricts sampling: give --temperature > 0 too");
  SHARDLM_CHECK(g.top_k < 0 || g.temperature > 0, "--top-k restricts sampling: give --temperature > 0 too");
  SHARDLM_CHECK(!g.seed_given || g.temperature > 0, "--seed seeds sampling: give --temperature > 0 too (without it "
                "the answer is greedy and the same for every seed)");
  if (g.top_k < 0) g.top_k = g.temperature > 0 ? kDefaultTopK : 0;
  return g;
}

// The prompt's text: --prompt (even empty), else --prompt-file (read by rank 0; "-": standard input), else
// standard input, less one final newline. Every rank gets it.
std::string prompt_text(const GenerateArgs& g, MPI_Comm comm) {
  if (!g.prompt_file.empty() || !g.prompt_given) {
    std::string text;
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    run_collectively(comm, [&] {
      if (rank != 0) return;
      if (!g.prompt_file.empty() && g.prompt_file != "-")
        text = read_input_file(g.prompt_file, "prompt file", kMaxDataFileBytes);
      else
        text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
      // A prompt typed, piped or saved by an editor ends with the line's newline, which is not part of it: the
      // same prompt however it is passed.
      if (!text.empty() && text.back() == '\n') text.pop_back();
    });
    broadcast_string(text, comm);
    return text;
  }
  return g.prompt;
}

// What the model folder says of generating.
struct ModelGeneration {
  std::vector<int32_t> eos_ids;
  std::string note;  // the settings of its generation_config.json that shardlm does not take, said; empty: none
};

// The settings of generation_config.json `j` (from `file`) that transformers' generate() applies by default and
// shardlm generate does not: sampling (do_sample and its temperature, top_p, top_k) and repetition_penalty.
std::string untaken_generation_settings(const nlohmann::json& j, const std::string& file) {
  std::string said;
  if (j.value("do_sample", false) == true) {
    std::string how;
    for (const char* key : {"temperature", "top_p", "top_k"})
      if (j.contains(key) && j[key].is_number()) how += concat(how.empty() ? "" : ", ", key, " ", j[key].dump());
    said = concat("sampling (do_sample", how.empty() ? "" : ": " + how, "); shardlm generate is greedy unless "
                  "--temperature is given (--top-p, --top-k then apply)");
  }
  if (j.contains("repetition_penalty") && j["repetition_penalty"].is_number() &&
      j["repetition_penalty"].get<double>() != 1.0)
    said += concat(said.empty() ? "" : "; ", "repetition_penalty ", j["repetition_penalty"].dump(),
                   ", which shardlm generate does not apply");
  return said.empty() ? "" : concat("note: ", file, " asks for ", said, " (it takes eos_token_id from the file)");
}

// The ids that end an answer by the model folder's own word, as transformers' generate() takes them: the
// eos_token_id (a number or a list) of `dir`'s generation_config.json, or without that file of its config.json
// (GenerationConfig.from_model_config), of its text_config where the top level has none (Gemma 3's multimodal
// checkpoints). None without a folder or an eos_token_id. A file that is not JSON, or ids that are not integers
// >= 0, are an Error naming the file.
ModelGeneration model_generation(const std::string& dir) {
  if (dir.empty()) return {};
  std::error_code ec;
  const fs::path generation = fs::path(dir) / "generation_config.json";
  const bool from_generation_config = fs::is_regular_file(generation, ec);
  const std::string file = from_generation_config ? generation.string() : (fs::path(dir) / "config.json").string();
  if (!fs::is_regular_file(file, ec)) return {};
  nlohmann::json j;
  try {
    j = parse_json_bounded(read_input_file(file, "the model's eos_token_id", kMaxDeckBytes), file);
  } catch (const nlohmann::json::exception& e) {
    throw Error(concat(file, " is not valid JSON: ", e.what()));
  }
  SHARDLM_CHECK(j.is_object(), file, " must hold a JSON object");
  ModelGeneration out;
  if (from_generation_config) out.note = untaken_generation_settings(j, file);
  auto eos_of = [](const nlohmann::json& config) {
    const auto it = config.find("eos_token_id");
    return it == config.end() || it->is_null() ? nullptr : &*it;
  };
  const nlohmann::json* eos = eos_of(j);
  std::string key = "eos_token_id";
  if (!eos && !from_generation_config && j.contains("text_config") && j["text_config"].is_object()) {
    eos = eos_of(j["text_config"]);
    key = "text_config.eos_token_id";
  }
  if (!eos) return out;
  for (const nlohmann::json& id : eos->is_array() ? *eos : nlohmann::json::array({*eos})) {
    SHARDLM_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= INT32_MAX, file, ": '",
                  key, "' must be a token id or a list of them (integers >= 0), holds ", clip_for_message(id.dump()));
    out.eos_ids.push_back(id.get<int32_t>());
  }
  return out;
}

// The prompt's ids, the ids and strings that end the answer, and what the model folder asks that is not done.
struct Prompt {
  std::vector<int32_t> ids;
  std::vector<int32_t> stop_ids;
  std::vector<std::string> stop_strings;
  std::string note;
};

// `ids_only`: the model has no tokenizer (GenerationModel::ids_only), whose EOS is then no stop.
Prompt make_prompt(const GenerateArgs& g, const RunConfig& cfg, const Tokenizer& tok, const std::string& text,
                   bool ids_only) {
  Prompt p;
  const int vocab = cfg.model.vocab_size;
  auto add_stop = [&](int32_t id) {
    if (id >= 0 && std::find(p.stop_ids.begin(), p.stop_ids.end(), id) == p.stop_ids.end()) p.stop_ids.push_back(id);
  };
  if (!ids_only) add_stop(tok.eos_id());
  const ModelGeneration folder = model_generation(cfg.model.dir);
  p.note = folder.note;
  for (int32_t id : folder.eos_ids) add_stop(id);
  if (!g.prompt_ids.empty()) {
    p.ids = parse_ids("--prompt-ids", g.prompt_ids);
  } else {
    SHARDLM_CHECK(tok.vocab_size() <= vocab, "the tokenizer (data.tokenizer = ", tokenizer_text(cfg.data), ") has ",
                  tok.vocab_size(), " tokens, more than the model's vocab_size ", vocab);
    if (g.chat) {
      ChatTemplate tmpl = [&] {
        try {
          return find_chat_template(cfg.data.chat_template, cfg.model.dir, cfg.tokenizer_json());
        } catch (const Error& e) {
          throw Error(concat("--chat: ", e.what()));
        }
      }();
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (!g.system.empty()) messages.push_back({{"role", "system"}, {"content", g.system}});
      messages.push_back({{"role", "user"}, {"content", text}});
      // As training tokenizes a rendering: the template writes its own BOS, special tokens are matched.
      p.ids = tok.encode(tmpl.render(messages, true));
      // The end of the assistant's turn: one token (Qwen's <|im_end|>, Llama 3's <|eot_id|>), or text.
      if (const std::string& eot = tmpl.eos_token(); !eot.empty()) {
        const std::vector<int32_t> eot_ids = tok.encode(eot);
        if (eot_ids.size() == 1) add_stop(eot_ids[0]);
        else p.stop_strings.push_back(eot);
      }
    } else {
      // As training's [BOS] text: the BOS first when the tokenizer has one.
      if (tok.bos_id() >= 0) p.ids.push_back(tok.bos_id());
      const std::vector<int32_t> body = tok.encode(text);
      p.ids.insert(p.ids.end(), body.begin(), body.end());
    }
  }
  // --eos-ids replaces every stop: ids and the chat template's end-of-turn text alike.
  if (!g.eos_ids.empty()) {
    p.stop_ids = parse_ids("--eos-ids", g.eos_ids);
    p.stop_strings.clear();
  }
  SHARDLM_CHECK(!p.ids.empty(), "the prompt is empty (and the tokenizer has no BOS to start from)");
  for (int32_t id : p.ids)
    SHARDLM_CHECK(id < vocab, "the prompt has token id ", id, ", outside the model's vocabulary of ", vocab);
  return p;
}

// --output's file can be written (its folder exists and takes a file; it is no folder itself): checked before
// the model loads, so that a wrong path does not cost the load and the generation.
void check_output_file(const std::string& path) {
  std::error_code ec;
  SHARDLM_CHECK(!fs::is_directory(path, ec), "generate --output '", path, "' is a folder: name a file");
  const fs::path folder = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  SHARDLM_CHECK(fs::is_directory(folder, ec), "generate --output '", path, "': its folder ", folder.string(),
                " does not exist");
  check_writable_folder(folder.string(), "generate --output's folder");
}

const char* finish_name(FinishReason f) { return f == FinishReason::Length ? "length" : "stop"; }

}  // namespace

int command_generate(const std::vector<std::string>& args) {
  if (const std::string problem = mpi_command_usage_problem("generate", args); !problem.empty()) {
    log_info(usage_error("generate", problem));
    return 2;
  }
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const GenerateArgs g = parse_generate_args(args);
  if (!g.output.empty()) run_collectively(comm, [&] { if (rank == 0) check_output_file(g.output); });
  Timer load_timer;
  GenerationModel model = load_generation_model(g.model, g.adapter, g.overrides, g.prompt_ids.empty(), comm);
  const RunConfig& cfg = model.cfg;
  std::unique_ptr<Tokenizer> tok;
  run_collectively(comm, [&] { tok = make_tokenizer(cfg.tokenizer_json()); });
  const std::string text = g.prompt_ids.empty() ? prompt_text(g, comm) : "";
  Prompt prompt;
  run_collectively(comm, [&] { prompt = make_prompt(g, cfg, *tok, text, model.ids_only); });

  GenerateOptions options;
  options.max_new_tokens = g.max_new_tokens;
  options.stop_ids = prompt.stop_ids;
  options.sampling = {g.temperature, g.top_p, g.seed, g.top_k};
  if (rank == 0) {
    if (!prompt.note.empty()) std::fprintf(stderr, "shardlm generate: %s\n", prompt.note.c_str());
    std::string stops;
    for (int32_t id : prompt.stop_ids) stops += (stops.empty() ? "stop ids " : ", ") + std::to_string(id);
    for (const std::string& text : prompt.stop_strings)
      stops += concat(stops.empty() ? "" : ", ", "stop text ", nlohmann::json(text).dump());
    std::fprintf(stderr, "shardlm generate: %s on %d rank(s), %s, loaded in %.1f s; %zu prompt tokens, %s, %s\n",
                 model.description.c_str(), world,
                 backend_name(cfg.run.backend), load_timer.seconds(), prompt.ids.size(),
                 options.sampling.greedy()
                     ? "greedy"
                     : concat("sampled (temperature ", g.temperature, ", top-k ", g.top_k, ", top-p ", g.top_p,
                              ", seed ", g.seed, ")").c_str(),
                 stops.empty() ? "no stop ids" : stops.c_str());
  }

  // Rank 0 decodes; the others hold their shards and join every step's gathers.
  TextStream stream(*tok, prompt.stop_strings);
  std::string answer;
  const std::vector<std::vector<int32_t>> prompts = rank == 0 ? std::vector<std::vector<int32_t>>{prompt.ids}
                                                              : std::vector<std::vector<int32_t>>{};
  Timer timer;
  const std::vector<Generated> out = generate(*model.engine, prompts, options, comm, [&](size_t, int32_t id) {
    // Without a tokenizer the ids themselves, separated by spaces.
    const std::string piece =
        model.ids_only ? (answer.empty() ? "" : " ") + std::to_string(id) : stream.push(id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    answer += piece;
    return !stream.stopped();
  });
  const double seconds = mpi_max(comm, timer.seconds());
  run_collectively(comm, [&] {
    if (rank != 0) return;
    const std::string rest = stream.finish();
    answer += rest;
    std::printf("%s\n", rest.c_str());
    std::fflush(stdout);
    const Generated& result = out.front();
    std::fprintf(stderr, "shardlm generate: %zu tokens in %.2f s (%.1f tokens/s), finish: %s\n", result.ids.size(),
                 seconds, seconds > 0 ? result.ids.size() / seconds : 0.0, finish_name(result.finish));
    if (g.output.empty()) return;
    const nlohmann::json record = {{"prompt_ids", prompt.ids},
                                   {"generated_ids", result.ids},
                                   {"text", model.ids_only ? answer : stream.text()},
                                   {"finish_reason", finish_name(result.finish)}};
    replace_file(g.output, record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                 "generate --output");
  });
  return 0;
}

std::string generate_usage_problem(const std::vector<std::string>& args) {
  return parse_problem([&] { parse_generate_args(args); });
}

}  // namespace shardlm
