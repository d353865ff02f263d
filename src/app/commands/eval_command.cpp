// `shardlm eval --predictions FILE DATA`: SQuAD v1.1 exact match and F1 of a predictions file (the
// official evaluate-v1.1.py's input, or a run's predictions.json) against a SQuAD file, printed as
// that script prints them. It only reads files, so it runs without MPI.
#include <charconv>
#include <cmath>
#include <cstdio>

#include "commands.hpp"
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

namespace {

// A float as Python's repr writes it (json.dumps uses it): the shortest digits that read back,
// positional between 1e-4 and 1e16, else scientific; ".0" on whole numbers.
std::string python_float(double v) {
  char buf[64];
  const double a = std::fabs(v);
  const bool fixed = a == 0 || (a >= 1e-4 && a < 1e16);
  const auto result = std::to_chars(buf, buf + sizeof buf, v, fixed ? std::chars_format::fixed : std::chars_format::scientific);
  std::string s(buf, result.ptr);
  if (fixed && s.find('.') == std::string::npos) s += ".0";
  return s;
}

}  // namespace

int command_eval(const std::vector<std::string>& args) {
  std::string predictions_path;
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    if (option_value(args, i, "--predictions", predictions_path)) continue;
    if (args[i].rfind("--", 0) == 0) {
      std::fprintf(stderr, "shardlm: eval: unknown or incomplete option '%s'\n%s", args[i].c_str(),
                   command_help("eval").c_str());
      return 2;
    }
    positional.push_back(args[i]);
  }
  if (predictions_path.empty() || positional.size() != 1) {
    std::fprintf(stderr, "shardlm: eval: %s\n%s",
                 predictions_path.empty() ? "--predictions FILE is required" : "expected one DATA file",
                 command_help("eval").c_str());
    return 2;
  }
  try {
    const std::vector<SquadQuestion> questions = load_squad_questions(positional[0], DatasetOptions{});
    const std::unordered_map<std::string, std::string> predictions = read_squad_predictions(predictions_path);
    const SquadScores scores = squad_scores(questions, predictions);
    // The official script names each unanswered question on stderr; a run that scored a subset
    // leaves many, so the first few are named and the rest counted.
    size_t named = 0;
    for (const SquadQuestion& q : questions)
      if (!predictions.count(q.id) && named++ < 5)
        std::fprintf(stderr, "Unanswered question %s will receive score 0.\n", q.id.c_str());
    if (named > 5) std::fprintf(stderr, "... and %zu more unanswered questions.\n", named - 5);
    std::printf("{\"exact_match\": %s, \"f1\": %s}\n", python_float(scores.exact_match).c_str(),
                python_float(scores.f1).c_str());
    std::printf("exact match %.2f, F1 %.2f over %zu questions (%zu answered)\n", scores.exact_match, scores.f1,
                scores.questions, scores.answered);
  } catch (const Error& e) {
    std::fprintf(stderr, "shardlm: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace shardlm
