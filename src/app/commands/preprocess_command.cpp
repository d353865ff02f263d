// `shardlm preprocess DECK`: what training will see, without training. Each sample's text, token
// ids and loss mask as JSON lines (--out), a summary, and a terminal view that marks the trained
// spans; for chat data the spans are the assistant turns the chat template's prefixes delimit.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "../../data/chat.hpp"
#include "shardlm/config.hpp"
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

namespace {

struct PreprocessArgs {
  std::string deck;
  std::string out;
  size_t limit = 0;  // 0: every record
  bool eval = false;
  std::vector<std::string> overrides;
};

PreprocessArgs parse_args(const std::vector<std::string>& args) {
  PreprocessArgs p;
  p.deck = parse_deck_arguments(args, p.overrides, [&](DeckArgument& a) {
    std::string v;
    if (a.value("--out", v)) {
      p.out = v;
    } else if (a.value("--limit", v)) {
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      SHARDLM_CHECK(!v.empty() && *end == '\0' && n > 0, "--limit must be a whole number > 0, not '", v, "'");
      p.limit = static_cast<size_t>(n);
    } else if (a.arg() == "--eval") {
      p.eval = true;
    } else {
      return false;
    }
    return true;
  });
  return p;
}

// A sample as preprocess shows it: text, ids and a 0/1 per token; `spans` are the trained bytes of
// `text` where they are known exactly (chat, not cut), else empty.
struct Shown {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  std::vector<std::pair<size_t, size_t>> spans;
  bool cut = false;
  size_t misaligned_turns = 0;
};

// The records training takes (data.train_size / eval_size: the run's seeded subset, in file order), the
// first `limit` of them (0: all).
std::vector<Shown> chat_samples(const RunConfig& cfg, const std::string& path, const Tokenizer& tok, size_t subset,
                                size_t limit) {
  const ChatTemplate tmpl = find_chat_template(cfg.data.chat_template, cfg.model.dir, cfg.tokenizer_json());
  const std::vector<Conversation> all = read_conversations(path, cfg.data.chat_format);
  std::vector<Shown> out;
  for (size_t index : subset_indices(all.size(), dataset_options(cfg.data, subset, cfg.train.seed))) {
    if (limit > 0 && out.size() >= limit) break;
    const Conversation& c = all[index];
    ChatSample s = make_chat_sample(c, tmpl, tok, cfg.data.train_on_prompt, cfg.data.max_length);
    out.push_back({std::move(s.text), std::move(s.ids), std::move(s.trained),
                   cfg.data.train_on_prompt || s.cut ? std::vector<std::pair<size_t, size_t>>{} : std::move(s.spans), s.cut,
                   s.misaligned_turns});
  }
  return out;
}

// The other formats through their loaders: token j is trained when position j - 1 predicts it. Without a
// subset the loader reads only the first `limit` records.
std::vector<Shown> loader_samples(const RunConfig& cfg, const std::string& path, const Tokenizer& tok, size_t subset,
                                  size_t limit) {
  DatasetOptions opt = dataset_options(cfg.data, subset, cfg.train.seed);
  if (subset == 0) opt.limit = limit;
  std::vector<Shown> out;
  for (const Example& ex : load_examples(cfg.data.format, path, tok, opt)) {
    if (limit > 0 && out.size() >= limit) break;
    Shown s;
    s.cut = ex.cut;
    s.ids = ex.tokens;
    s.text = tok.decode(ex.tokens);
    s.trained.assign(ex.tokens.size(), 0);
    for (size_t t = 0; t + 1 < ex.tokens.size(); ++t) s.trained[t + 1] = ex.targets[t] >= 0;
    out.push_back(std::move(s));
  }
  return out;
}

void write_lines(const std::vector<Shown>& samples, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  SHARDLM_CHECK(out, "cannot write --out file '", path, "'");
  for (const Shown& s : samples) {
    nlohmann::json line = {{"text", s.text}, {"input_ids", s.ids}, {"loss_mask", s.trained}};
    out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  SHARDLM_CHECK(out.flush(), "cannot write --out file '", path, "'");
}

// The text with its trained parts marked: green on a terminal, else between [[ and ]]. Without
// exact byte spans, runs of tokens are decoded (special tokens then do not show).
std::string marked(const Shown& s, const Tokenizer& tok, bool color) {
  const std::string on = color ? "\x1b[1;32m" : "[[", off = color ? "\x1b[0m" : "]]";
  std::string out;
  if (!s.spans.empty() || s.ids.empty()) {
    size_t at = 0;
    for (const auto& [b, e] : s.spans) {
      out += s.text.substr(at, b - at) + on + s.text.substr(b, e - b) + off;
      at = e;
    }
    return out + s.text.substr(at);
  }
  for (size_t t = 0; t < s.ids.size();) {
    size_t u = t;
    while (u < s.ids.size() && s.trained[u] == s.trained[t]) ++u;
    const std::string piece = tok.decode(std::vector<int32_t>(s.ids.begin() + static_cast<std::ptrdiff_t>(t),
                                                              s.ids.begin() + static_cast<std::ptrdiff_t>(u)));
    out += s.trained[t] ? on + piece + off : piece;
    t = u;
  }
  return out;
}

std::string summary(const std::vector<Shown>& samples, const std::string& path, int max_length) {
  size_t tokens = 0, trained = 0, cut = 0, misaligned = 0;
  for (const Shown& s : samples) {
    tokens += s.ids.size();
    for (uint8_t m : s.trained) trained += m;
    cut += s.cut;
    misaligned += s.misaligned_turns;
  }
  const double share = tokens ? 100.0 * static_cast<double>(trained) / static_cast<double>(tokens) : 0.0;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.1f%%", share);
  std::string line = concat(path, ": ", samples.size(), " samples, ", tokens, " tokens, ", trained, " trained (", pct,
                            "), ", cut, " cut at data.max_length = ", max_length);
  if (misaligned > 0) line += concat(", ", misaligned, " assistant turns without loss (prefixes do not line up)");
  return line + "\n";
}

int run(const PreprocessArgs& args) {
  // One process, no mpirun: the deck's ranks_per_node (emulated nodes of the job's ranks) means nothing here,
  // and a world size of 1 would fail its divisibility check.
  std::vector<std::string> overrides;
  for (const std::string& o : args.overrides)
    if (o.rfind("--dist.ranks_per_node=", 0) != 0) overrides.push_back(o);
  overrides.push_back("--dist.ranks_per_node=0");
  const RunConfig cfg = load_run_config(args.deck, overrides, 1);
  const std::string path = args.eval ? cfg.data.eval_file : cfg.data.train_file;
  SHARDLM_CHECK(!path.empty(), args.eval ? "--eval: the deck has no data.eval_file" : "the deck has no data.train_file");
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(cfg.tokenizer_json());
  const size_t view_limit = args.out.empty() && args.limit == 0 ? 3 : args.limit;
  const size_t subset = args.eval ? cfg.data.eval_size : cfg.data.train_size;
  const std::vector<Shown> samples = cfg.data.format == DataFormat::Chat
                                         ? chat_samples(cfg, path, *tok, subset, view_limit)
                                         : loader_samples(cfg, path, *tok, subset, view_limit);
  if (!args.out.empty()) {
    write_lines(samples, args.out);
  } else {
    const bool color = isatty(STDOUT_FILENO) != 0;
    for (size_t i = 0; i < samples.size(); ++i)
      std::printf("--- sample %zu (%zu tokens%s) ---\n%s\n", i + 1, samples[i].ids.size(),
                  samples[i].cut ? ", cut" : "", marked(samples[i], *tok, color).c_str());
  }
  std::fputs(summary(samples, path, cfg.data.max_length).c_str(), args.out.empty() ? stdout : stderr);
  return 0;
}

}  // namespace

int command_preprocess(const std::vector<std::string>& args) {
  return run_parsed_command("preprocess", args, parse_args, run);
}

}  // namespace shardlm
