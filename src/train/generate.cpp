// Generation over the engine's key/value cache (greedy or sampled), and SQuAD exact match / F1 from it.
#include "generate.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include <nlohmann/json.hpp>

#include "shardlm/core.hpp"
#include "shardlm/dist.hpp"

namespace shardlm {

std::vector<std::vector<size_t>> eval_micro_batches(size_t n, int rank, int world, int micro) {
  const size_t share = (n + world - 1) / world;
  const size_t begin = std::min(n, share * rank), end = std::min(n, begin + share);
  const size_t rounds = (share + micro - 1) / micro;
  std::vector<std::vector<size_t>> out(rounds);
  for (size_t r = 0; r < rounds; ++r)
    for (size_t i = begin + r * micro; i < std::min(end, begin + (r + 1) * micro); ++i) out[r].push_back(i);
  return out;
}

int32_t sample_token(const float* logits, int vocab, const Sampling& sampling, uint64_t prompt, uint64_t step) {
  SHARDLM_CHECK(vocab >= 1, "sample_token: no logits");
  // The argmax rule of the engine's greedy head: the lowest id on ties, NaN never wins.
  int32_t best = 0;
  for (int v = 1; v < vocab; ++v)
    if (logits[v] > logits[best] || std::isnan(logits[best])) best = v;
  if (sampling.greedy() || std::isnan(logits[best])) return best;
  // Probabilities up to a factor, in double: exp((l - max) / T).
  std::vector<double> p(vocab);
  double total = 0;
  for (int v = 0; v < vocab; ++v) {
    p[v] = std::isnan(logits[v]) ? 0.0 : std::exp((static_cast<double>(logits[v]) - logits[best]) / sampling.temperature);
    total += p[v];
  }
  // top_k: the tokens less likely than the k-th most likely are out (its ties stay in).
  if (sampling.top_k > 0 && sampling.top_k < vocab) {
    std::vector<double> sorted(p);
    std::nth_element(sorted.begin(), sorted.begin() + (sampling.top_k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[static_cast<size_t>(sampling.top_k - 1)];
    total = 0;
    for (double& q : p) {
      if (q < kth) q = 0;
      total += q;
    }
  }
  // The tokens in the order the draw walks them: by id, or with top_p < 1 the most likely first
  // (ties by id), cut after the first whose running sum reaches top_p of the total.
  std::vector<int32_t> order(vocab);
  for (int v = 0; v < vocab; ++v) order[v] = v;
  if (sampling.top_p < 1) {
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    double running = 0;
    size_t keep = 0;
    while (keep < order.size() && (keep == 0 || running < sampling.top_p * total)) running += p[order[keep++]];
    order.resize(keep);
    total = running;
  }
  // A uniform draw in [0, 1) from the counter (seed, prompt, step): 53 random bits.
  const uint64_t bits = mix64(mix64(mix64(sampling.seed) ^ prompt) ^ (step * 0xd1b54a32d192ed03ULL));
  const double target = static_cast<double>(bits >> 11) * 0x1.0p-53 * total;
  double running = 0;
  for (int32_t v : order) {
    running += p[v];
    if (target < running) return v;
  }
  // Rounding left the target at the very end: the last token that can be drawn.
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    if (p[*it] > 0) return *it;
  return best;
}

std::vector<Generated> generate(FsdpEngine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                const GenerateOptions& options, MPI_Comm comm, const TokenCallback& on_token) {
  const int max_new_tokens = options.max_new_tokens;
  SHARDLM_CHECK(max_new_tokens >= 1, "generate: max_new_tokens must be >= 1, not ", max_new_tokens);
  const Sampling& sampling = options.sampling;
  const int slots = static_cast<int>(prompts.size());
  size_t prompt_rows = 0, longest = 0;
  for (const std::vector<int32_t>& p : prompts) {
    SHARDLM_CHECK(!p.empty(), "generate: an empty prompt has no position to continue from");
    prompt_rows += p.size();
    longest = std::max(longest, p.size());
  }
  const int max_len = static_cast<int>(longest) + max_new_tokens;
  // LongRoPE (Phi-3): the step that first feeds position original_max_position_embeddings of a sequence
  // prefilled within it re-feeds the whole sequence, so that every cached key and value is recomputed with the
  // long factors, as transformers' Phi3ForCausalLM.prepare_inputs_for_generation drops its cache there.
  const LongRope& longrope = engine.model_config().longrope;
  const int refill = longrope.enabled() ? longrope.original_max_position_embeddings : -1;
  size_t refill_rows = 0;  // what the steps that re-feed may need at most
  for (const std::vector<int32_t>& p : prompts)
    refill_rows += refill >= static_cast<int>(p.size()) && refill <= static_cast<int>(p.size()) + max_new_tokens - 2
                       ? static_cast<size_t>(refill) + 1
                       : 1;
  // A rank without prompts still sizes a (one-slot) cache: engines may refuse empty ones.
  engine.decode_begin(std::max(slots, 1), max_len,
                      static_cast<int>(std::max<size_t>({prompt_rows, refill_rows, size_t(slots), 1})));
  const int vocab = engine.vocab_size();
  std::vector<float> logits(sampling.greedy() ? 0 : static_cast<size_t>(std::max(slots, 1)) * vocab);
  std::vector<Generated> out(slots);
  std::vector<int32_t> next;
  // One step of the engine; for sampling the logits come back and each active slot draws its token.
  auto step = [&](const std::vector<int32_t>& tokens, const std::vector<int>& row_slot, const std::vector<int>& row_pos,
                  const std::vector<int>& logit_rows, const std::vector<int>& active) {
    const int m = static_cast<int>(logit_rows.size());
    next.assign(m, 0);
    if (sampling.greedy()) {
      engine.decode_step(tokens.data(), row_slot.data(), row_pos.data(), static_cast<int>(tokens.size()),
                         logit_rows.data(), m, next.data());
      return;
    }
    engine.decode_step(tokens.data(), row_slot.data(), row_pos.data(), static_cast<int>(tokens.size()),
                       logit_rows.data(), m, nullptr, logits.data());
    for (int i = 0; i < m; ++i)
      next[i] = sample_token(logits.data() + static_cast<size_t>(i) * vocab, vocab, sampling,
                             static_cast<uint64_t>(active[i]), out[active[i]].ids.size());
  };

  // The prefill: every prompt token is a row; each prompt's last row gives its first new token.
  std::vector<int32_t> tokens;
  std::vector<int> row_slot, row_pos, logit_rows;
  std::vector<int> active;  // the slots whose token in `next` is new
  for (int s = 0; s < slots; ++s) {
    for (size_t t = 0; t < prompts[s].size(); ++t) {
      tokens.push_back(prompts[s][t]);
      row_slot.push_back(s);
      row_pos.push_back(static_cast<int>(t));
    }
    logit_rows.push_back(static_cast<int>(tokens.size()) - 1);
    active.push_back(s);
  }
  step(tokens, row_slot, row_pos, logit_rows, active);

  while (true) {
    // Take in the tokens just produced; a sequence ends at a stop id, max_new_tokens or the caller's word.
    std::vector<int> still;
    for (size_t i = 0; i < active.size(); ++i) {
      const int s = active[i];
      Generated& g = out[s];
      if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next[i]) != options.stop_ids.end()) {
        g.finish = FinishReason::Stop;
        continue;
      }
      g.ids.push_back(next[i]);
      if (on_token && !on_token(static_cast<size_t>(s), next[i])) g.finish = FinishReason::Caller;
      else if (static_cast<int>(g.ids.size()) >= max_new_tokens) g.finish = FinishReason::Length;
      else still.push_back(s);
    }
    active = still;
    // Every rank runs the same number of steps: the engine gathers each unit in every step.
    if (!any_rank(comm, !active.empty())) break;
    tokens.clear(), row_slot.clear(), row_pos.clear(), logit_rows.clear();
    for (int s : active) {
      const int position = static_cast<int>(prompts[s].size() + out[s].ids.size()) - 1;
      const int first = position == refill ? 0 : position;  // LongRoPE's crossing: the whole sequence again
      for (int t = first; t <= position; ++t) {
        const size_t prompt = prompts[s].size();
        tokens.push_back(t < static_cast<int>(prompt) ? prompts[s][t] : out[s].ids[t - prompt]);
        row_slot.push_back(s);
        row_pos.push_back(t);
      }
      logit_rows.push_back(static_cast<int>(tokens.size()) - 1);
    }
    step(tokens, row_slot, row_pos, logit_rows, active);
  }
  engine.decode_end();
  return out;
}

std::vector<std::vector<int32_t>> greedy_generate(FsdpEngine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                  int max_new_tokens, int32_t eos_id, MPI_Comm comm) {
  GenerateOptions options;
  options.max_new_tokens = max_new_tokens;
  options.stop_ids = {eos_id};
  std::vector<std::vector<int32_t>> ids;
  for (Generated& g : generate(engine, prompts, options, comm)) ids.push_back(std::move(g.ids));
  return ids;
}

std::vector<int32_t> completion_prompt(const Example& example) {
  for (size_t i = 0; i < example.targets.size(); ++i)
    if (example.targets[i] >= 0) return {example.tokens.begin(), example.tokens.begin() + static_cast<long>(i) + 1};
  return {};
}

namespace {

// Every rank's (id, text) pairs on rank 0, in rank order (each rank's share is contiguous).
std::vector<std::pair<std::string, std::string>> gather_predictions(
    const std::vector<std::pair<std::string, std::string>>& mine, MPI_Comm comm) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [id, text] : mine) j.push_back({id, text});
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& share :
       gather_on_root(comm, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)))
    for (const nlohmann::json& p : nlohmann::json::parse(share))
      out.emplace_back(p[0].get<std::string>(), p[1].get<std::string>());
  return out;
}

}  // namespace

SquadGeneration squad_generate(FsdpEngine& engine, const std::vector<Example>& eval_set,
                               const std::vector<SquadQuestion>& questions, const Tokenizer& tokenizer, int batch,
                               int max_new_tokens, MPI_Comm comm) {
  SHARDLM_CHECK(questions.size() == eval_set.size(), "SQuAD evaluation: ", questions.size(), " questions for ",
                eval_set.size(), " eval examples");
  SHARDLM_CHECK(batch >= 1, "SQuAD evaluation: batch must be >= 1, not ", batch);
  const int rank = rank_of(comm), world = size_of(comm);
  Timer timer;
  double em = 0, f1 = 0;
  std::vector<std::pair<std::string, std::string>> mine;
  for (const std::vector<size_t>& indices : eval_micro_batches(eval_set.size(), rank, world, batch)) {
    std::vector<std::vector<int32_t>> prompts;
    for (size_t i : indices) {
      prompts.push_back(completion_prompt(eval_set[i]));
      SHARDLM_CHECK(!prompts.back().empty(), "SQuAD evaluation: eval example ", i, " has no answer tokens");
    }
    const std::vector<std::vector<int32_t>> answers =
        greedy_generate(engine, prompts, max_new_tokens, tokenizer.eos_id(), comm);
    for (size_t k = 0; k < indices.size(); ++k) {
      // The completion is " {answer}": the official normalisation drops the surrounding whitespace.
      const std::string text = tokenizer.decode(answers[k]);
      const SquadQuestion& q = questions[indices[k]];
      em += squad_best_exact_match(text, q.answers);
      f1 += squad_best_f1(text, q.answers);
      mine.emplace_back(q.id, text);
    }
  }
  SquadGeneration r;
  r.questions = eval_set.size();
  const double n = std::max<double>(1.0, static_cast<double>(r.questions));
  r.exact_match = 100.0 * mpi_sum(comm, em) / n;
  r.f1 = 100.0 * mpi_sum(comm, f1) / n;
  r.runtime = mpi_max(comm, timer.seconds());
  r.predictions = gather_predictions(mine, comm);
  return r;
}

}  // namespace shardlm
