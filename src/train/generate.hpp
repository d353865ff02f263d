// Generation on the FsdpEngine (the model as it trains, still sharded), greedy or sampled, and the
// SQuAD evaluation built on it: each rank decodes its share of the eval set. `shardlm generate`
// runs the same loop.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine.hpp"

namespace shardlm {

// This rank's contiguous share of an eval set of n examples, cut into batches of `micro`; every
// rank gets the same number of batches (empty ones where its share is shorter) so the collectives
// inside the engine line up.
std::vector<std::vector<size_t>> eval_micro_batches(size_t n, int rank, int world, int micro);

// How each new token is chosen: the argmax of its logits (temperature 0), or a draw from
// softmax(logits / temperature) restricted first to the top_k most likely tokens (those tied with the
// k-th as well; 0: no cut), then to the smallest set of the most likely left whose probabilities
// reach top_p (nucleus sampling; 1: no cut), as transformers' generate(do_sample) with its
// TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper, in that order.
struct Sampling {
  double temperature = 0;
  double top_p = 1;
  uint64_t seed = 0;
  int top_k = 0;
  bool greedy() const { return temperature <= 0; }
};

// The token drawn for the `step`-th new token (from 0) of prompt `prompt` from its fp32 logits over
// `vocab` ids: a pure function of (seed, prompt, step, logits), so every rank, batch and run with the
// seed draws the same. NaN logits never win; a row of nothing else gives its argmax's rule (id 0).
int32_t sample_token(const float* logits, int vocab, const Sampling& sampling, uint64_t prompt, uint64_t step);

struct GenerateOptions {
  int max_new_tokens = 0;
  std::vector<int32_t> stop_ids;  // a sequence ends at the first of these (EOS, end of turn); left out
  Sampling sampling;
};

enum class FinishReason { Stop, Length, Caller };  // a stop id, max_new_tokens, on_token said so

struct Generated {
  std::vector<int32_t> ids;  // the new tokens, the stop id left out
  FinishReason finish = FinishReason::Length;
};

// Called with each new token of prompt i (stop ids excluded) as soon as it is chosen: streaming,
// stop strings. False ends prompt i after this token.
using TokenCallback = std::function<bool(size_t prompt, int32_t token)>;

// Continues each prompt (non-empty token ids) until a stop id, max_new_tokens or on_token says so,
// with a key/value cache: one step for all prompt tokens, then one row per unfinished sequence per
// step. Every rank of `comm` calls it together (an empty `prompts` is fine): the ranks agree before
// each step whether any of them still decodes, so the collectives inside the engine line up.
std::vector<Generated> generate(FsdpEngine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                const GenerateOptions& options, MPI_Comm comm, const TokenCallback& on_token = {});

// generate() with the argmax until eos_id or max_new_tokens: the ids of each prompt, EOS left out.
std::vector<std::vector<int32_t>> greedy_generate(FsdpEngine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                  int max_new_tokens, int32_t eos_id, MPI_Comm comm);

// The prompt of an example whose loss is on a completion: its tokens up to and including the last
// one before the first target (the position that predicts the completion's first token).
// Empty when the example has no target.
std::vector<int32_t> completion_prompt(const Example& example);

struct SquadGeneration {
  double exact_match = 0, f1 = 0;  // percent over the questions, as the official script reports them
  size_t questions = 0;
  double runtime = 0;              // seconds, every rank's generation included
  std::vector<std::pair<std::string, std::string>> predictions;  // (id, text) on rank 0, eval-set order
};

// Greedy answers for the eval set (example i is question i), `batch` prompts at a time per rank,
// scored with the SQuAD v1.1 exact match and F1 against every reference answer; the same result
// on every rank, the predictions gathered on rank 0.
SquadGeneration squad_generate(FsdpEngine& engine, const std::vector<Example>& eval_set,
                               const std::vector<SquadQuestion>& questions, const Tokenizer& tokenizer, int batch,
                               int max_new_tokens, MPI_Comm comm);

}  // namespace shardlm
