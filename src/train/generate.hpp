// Greedy generation on the FsdpEngine (the model as it trains, still sharded) and the SQuAD
// evaluation built on it: each rank decodes its share of the eval set.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine.hpp"

namespace shardlm {

// This rank's contiguous share of an eval set of n examples, cut into batches of `micro`; every
// rank gets the same number of batches (empty ones where its share is shorter) so the collectives
// inside the engine line up.
std::vector<std::vector<size_t>> eval_micro_batches(size_t n, int rank, int world, int micro);

// Continues each prompt (non-empty token ids) with the argmax token until eos_id or
// max_new_tokens, with a key/value cache: one step for all prompt tokens, then one row per
// unfinished sequence per step. Returns the generated ids, EOS left out. Every rank of `comm`
// calls it together (an empty `prompts` is fine): the ranks agree before each step whether any of
// them still decodes, so the collectives inside the engine line up.
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
