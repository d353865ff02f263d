// Greedy generation with a key/value cache: the cached rows of block_decode equal the full forward
// (BLOOM, Llama, Qwen2, Qwen3); greedy_generate on the sharded model equals transformers' generate() on the
// tiny parity models (tests/fixtures/hf/generate_reference.json, make_generate_fixtures.py;
// qwen2_generate_reference.json, make_qwen2_fixtures.py; qwen3_generate_reference.json, make_qwen3_fixtures.py;
// mistral_generate_reference.json, make_mistral_fixtures.py; phi3_generate_reference.json, make_phi3_fixtures.py),
// batched or one prompt at a time, on any number of ranks, with ranks that have nothing to decode.
#define BOOST_TEST_MODULE test_generate
#include "mpi_fixture.hpp"

#include <boost/test/data/test_case.hpp>

#include <fstream>

#include <nlohmann/json.hpp>

#include "cpu_model_test_support.hpp"
#include "engine.hpp"
#include "generate.hpp"
#include "train_checkpoint.hpp"

using namespace shardlm;
using namespace model_test;
namespace data = boost::unit_test::data;

namespace {

const std::string kFixtures = SHARDLM_SOURCE_DIR "/tests/fixtures/hf";

// Final hidden states of B sequences of T tokens, by block_forward over the whole sequences and by
// block_decode in pieces: each sequence's first `prefill` tokens in one call (all sequences
// together), then one token per sequence per call. They must agree to fp32 rounding.
void check_decode_matches_forward(const ModelConfig& cfg) {
  const int B = 3, T = 11, prefill = 4, H = cfg.hidden_size;
  const TinyModel m = make_model(cfg, 5);
  std::mt19937 rng(9);
  const Batch batch = make_batch(B, T, cfg.vocab_size, 0.0, rng);
  std::unique_ptr<CpuModel> net = make_cpu_model(cfg, B, T);
  std::vector<float> forward_h;
  model_loss(*net, m, batch, &forward_h);

  net->decode_begin(B, T, B * prefill);
  std::vector<float> decoded(static_cast<size_t>(B) * T * H);
  auto run = [&](const std::vector<int>& slots, const std::vector<int>& positions) {
    const int n = static_cast<int>(slots.size());
    std::vector<float> h(static_cast<size_t>(n) * H), next(h.size());
    for (int r = 0; r < n; ++r)
      net->embed_forward(m.params[0].data(), &batch.tokens[slots[r] * T + positions[r]], 1, 1, h.data() + r * H);
    for (int l = 0; l < cfg.num_layers; ++l) {
      net->block_decode(l, m.params[1 + l].data(), h.data(), next.data(), n, slots.data(), positions.data());
      h.swap(next);
    }
    for (int r = 0; r < n; ++r)
      std::copy(h.begin() + r * H, h.begin() + (r + 1) * H,
                decoded.begin() + (static_cast<size_t>(slots[r]) * T + positions[r]) * H);
  };
  std::vector<int> slots, positions;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < prefill; ++t) slots.push_back(b), positions.push_back(t);
  run(slots, positions);
  for (int t = prefill; t < T; ++t) run({0, 1, 2}, {t, t, t});
  net->decode_end();

  std::vector<double> reference(forward_h.begin(), forward_h.end());
  BOOST_TEST(max_relative_error(decoded, reference) < 1e-5);
}

// A row outside the cache is an error naming it, not a write out of bounds.
void check_bad_rows(const ModelConfig& cfg) {
  const TinyModel m = make_model(cfg, 5);
  std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 1, 4);
  net->decode_begin(2, 4, 2);
  std::vector<float> h(2 * cfg.hidden_size), out(h.size());
  const int slots[2] = {0, 2}, positions[2] = {0, 0};
  BOOST_CHECK_EXCEPTION(net->block_decode(0, m.params[1].data(), h.data(), out.data(), 2, slots, positions), Error,
                        [](const Error& e) { return std::string(e.what()).find("slot 2") != std::string::npos; });
  const int slots2[1] = {0}, far[1] = {4};
  BOOST_CHECK_THROW(net->block_decode(0, m.params[1].data(), h.data(), out.data(), 1, slots2, far), Error);
  net->decode_end();
}

struct Case {
  std::vector<int32_t> prompt, expected;  // expected: the new ids, EOS left out
};

struct GenerateReference {
  int32_t eos = 0;
  int max_new_tokens = 0;
  std::vector<Case> cases;
};

// The fixture `name` of tests/fixtures/hf/<file>.
GenerateReference read_reference(const std::string& file, const std::string& name) {
  std::ifstream in(kFixtures + "/" + file);
  BOOST_REQUIRE_MESSAGE(in.good(), "cannot read tests/fixtures/hf/" << file
                                      << " (a fixture not made yet is made by its make_*_fixtures.py there)");
  const nlohmann::json j = nlohmann::json::parse(in).at(name);
  GenerateReference r;
  r.eos = j.at("eos_id").get<int32_t>();
  r.max_new_tokens = j.at("max_new_tokens").get<int>();
  for (const nlohmann::json& c : j.at("cases")) {
    Case k;
    k.prompt = c.at("prompt").get<std::vector<int32_t>>();
    k.expected = c.at("generated").get<std::vector<int32_t>>();
    if (!k.expected.empty() && k.expected.back() == r.eos) k.expected.pop_back();
    r.cases.push_back(std::move(k));
  }
  return r;
}

// The fixture model in a FULL_SHARD CPU engine on the world, each rank loading its slices.
std::unique_ptr<FsdpEngine> load_engine(const std::string& name, int max_len) {
  RunConfig cfg;
  HfModelDir dir(kFixtures + "/" + name);
  static_cast<ModelConfig&>(cfg.model) = dir.config();
  cfg.model.dir = kFixtures + "/" + name;
  cfg.fsdp.strategy = ShardingStrategy::FullShard;
  cfg.data.max_length = max_len;
  const Topology topo = make_topology(MPI_COMM_WORLD, 0);
  std::unique_ptr<FsdpEngine> engine = make_engine(cfg, MPI_COMM_WORLD, topo, 2);
  load_pretrained(cfg.model.dir, engine->checkpoint_state(), MPI_COMM_WORLD);
  engine->checkpoint_loaded();
  return engine;
}

// Prompt i goes to rank i % world (or, with `only_rank_0`, every prompt to rank 0); each rank
// decodes its prompts `batch` at a time. Every continuation must equal transformers' generate().
// `crossing` (LongRoPE's original context, 0: none): a continuation whose steps feed that position is compared
// up to the token before that step's.
void check_generate(const std::string& name, size_t batch, bool only_rank_0,
                    const std::string& file = "generate_reference.json", int crossing = 0) {
  const GenerateReference ref = read_reference(file, name);
  const int rank = world_rank(), world = world_size();
  std::unique_ptr<FsdpEngine> engine = load_engine(name, 16);
  std::vector<size_t> mine;
  for (size_t i = 0; i < ref.cases.size(); ++i)
    if (only_rank_0 ? rank == 0 : static_cast<int>(i % world) == rank) mine.push_back(i);
  // Every rank makes the same number of calls: the engine gathers each unit in every step.
  const size_t most = only_rank_0 ? ref.cases.size() : (ref.cases.size() + world - 1) / world;
  for (size_t at = 0; at < most; at += batch) {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<size_t> which;
    for (size_t k = at; k < std::min(at + batch, mine.size()); ++k) {
      prompts.push_back(ref.cases[mine[k]].prompt);
      which.push_back(mine[k]);
    }
    const std::vector<std::vector<int32_t>> out =
        greedy_generate(*engine, prompts, ref.max_new_tokens, ref.eos, MPI_COMM_WORLD);
    BOOST_REQUIRE_EQUAL(out.size(), prompts.size());
    for (size_t k = 0; k < out.size(); ++k) {
      std::vector<int32_t> got = out[k], want = ref.cases[which[k]].expected;
      // LongRoPE's crossing (see phi3_generation_equals_transformers): the tokens before that step's.
      const int prompt = static_cast<int>(ref.cases[which[k]].prompt.size());
      if (crossing > 0 && prompt <= crossing && prompt + static_cast<int>(want.size()) > crossing + 1) {
        want.resize(static_cast<size_t>(crossing - prompt + 1));
        got.resize(std::min(got.size(), want.size()));
      }
      BOOST_TEST(got == want, boost::test_tools::per_element());
    }
  }
}

}  // namespace

// Mistral's sliding window (3 keys) in the cache's attention too: prompts of 4 and 7 decoded positions.
BOOST_DATA_TEST_CASE(decode_rows_equal_the_forward, data::make(tiny_families()), cfg) {
  check_decode_matches_forward(cfg);
}

BOOST_AUTO_TEST_CASE(rows_outside_the_cache_are_errors) {
  for (const ModelConfig& cfg : tiny_families()) BOOST_TEST_CONTEXT(cfg.arch) { check_bad_rows(cfg); }
}

BOOST_AUTO_TEST_CASE(bloom_generation_equals_transformers) {
  check_generate("tiny_bloom", 1, false);
  check_generate("tiny_bloom", 3, false);
}

BOOST_AUTO_TEST_CASE(llama_generation_equals_transformers) {
  check_generate("tiny_llama", 1, false);
  check_generate("tiny_llama", 4, false);
}

BOOST_AUTO_TEST_CASE(qwen2_generation_equals_transformers) {
  check_generate("tiny_qwen2", 1, false, "qwen2_generate_reference.json");
  check_generate("tiny_qwen2", 3, false, "qwen2_generate_reference.json");
}

BOOST_AUTO_TEST_CASE(qwen3_generation_equals_transformers) {
  check_generate("tiny_qwen3", 1, false, "qwen3_generate_reference.json");
  check_generate("tiny_qwen3", 3, false, "qwen3_generate_reference.json");
}

// Prompts of up to 12 tokens and 12 new ones, past the window of 4 (make_mistral_fixtures.py; the
// fixture is made on a machine with transformers).
BOOST_AUTO_TEST_CASE(mistral_generation_equals_transformers) {
  check_generate("tiny_mistral", 1, false, "mistral_generate_reference.json");
  check_generate("tiny_mistral", 3, false, "mistral_generate_reference.json");
}

// Gemma 3: the local layers' window (4) and rope base in the cache's decoding, prompts past the window.
BOOST_AUTO_TEST_CASE(gemma3_generation_equals_transformers) {
  check_generate("tiny_gemma3", 1, false, "gemma3_generate_reference.json");
  check_generate("tiny_gemma3", 3, false, "gemma3_generate_reference.json");
}

// Phi-3 (make_phi3_fixtures.py): prompts of 1 to 12 tokens and up to 12 new ones against LongRoPE's original
// context of 8: prompts of 9 and 12 tokens are prefilled with the long factors, those of 1 and 5 never leave
// the short ones, and all four continuations equal transformers'. Prompts of 3 and 7 cross: the step that feeds
// position 8 re-feeds the whole sequence with the long factors (transformers' Phi3ForCausalLM drops its cache
// there), and their tokens up to that step equal transformers'. That step's own token differs: the fixture
// was recorded with eager attention, whose mask for that recomputation is built for one query (the cache
// position) and broadcast over all nine, so with the window of 6 every query attends every key alike,
// future ones included; shardlm recomputes causally, as transformers' sdpa attention does where the window
// does not cut (huggingface.md). One prompt at a time and three to a step.
BOOST_AUTO_TEST_CASE(phi3_generation_equals_transformers) {
  check_generate("tiny_phi3", 1, false, "phi3_generate_reference.json", 8);
  check_generate("tiny_phi3", 3, false, "phi3_generate_reference.json", 8);
}

BOOST_AUTO_TEST_CASE(ranks_without_prompts_still_take_part) {
  check_generate("tiny_llama", 6, true);
  check_generate("tiny_bloom", 2, true);
}

BOOST_AUTO_TEST_CASE(completion_prompt_ends_before_the_answer) {
  Example ex;
  ex.tokens = {5, 6, 7, 8, 9};
  ex.targets = {-1, -1, 8, 9, -1};
  BOOST_TEST(completion_prompt(ex) == (std::vector<int32_t>{5, 6, 7}), boost::test_tools::per_element());
  ex.targets.assign(5, -1);
  BOOST_TEST(completion_prompt(ex).empty());
}

BOOST_AUTO_TEST_CASE(eval_shares_have_the_same_number_of_batches) {
  for (int world : {1, 2, 3, 4})
    for (size_t n : {0u, 1u, 5u, 9u}) {
      size_t seen = 0, rounds = 0;
      for (int r = 0; r < world; ++r) {
        const auto batches = eval_micro_batches(n, r, world, 2);
        if (r == 0) rounds = batches.size();
        BOOST_TEST(batches.size() == rounds);
        for (const auto& b : batches) seen += b.size();
      }
      BOOST_TEST(seen == n);
    }
}

BOOST_AUTO_TEST_CASE(greedy_sampling_is_the_argmax_and_nan_never_wins) {
  const float logits[5] = {0.5f, 2.0f, NAN, 2.0f, -1.0f};
  BOOST_TEST(sample_token(logits, 5, Sampling{}, 0, 0) == 1);  // ties: the lowest id
  const float nan_first[3] = {NAN, -3.0f, -2.0f};
  BOOST_TEST(sample_token(nan_first, 3, Sampling{}, 0, 0) == 2);
  for (uint64_t step = 0; step < 50; ++step) BOOST_TEST(sample_token(nan_first, 3, {1.0, 1.0, 5}, 0, step) != 0);
  // A nucleus of the most likely token only: its argmax, whatever the draw.
  for (uint64_t step = 0; step < 50; ++step) BOOST_TEST(sample_token(logits, 5, {1.0, 1e-9, 9}, 3, step) == 1);
}

BOOST_AUTO_TEST_CASE(sampling_draws_by_the_tempered_and_cut_probabilities) {
  const float logits[3] = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  const int draws = 40000;
  auto frequencies = [&](const Sampling& s) {
    std::vector<double> f(3, 0.0);
    for (int step = 0; step < draws; ++step) f[sample_token(logits, 3, s, 1, step)] += 1.0 / draws;
    return f;
  };
  const std::vector<double> plain = frequencies({1.0, 1.0, 11});
  const double p[3] = {0.5, 0.3, 0.2};
  for (int v = 0; v < 3; ++v) BOOST_TEST(plain[v] == p[v], boost::test_tools::tolerance(0.04));
  // Temperature 0.5 squares the probabilities: 0.25 : 0.09 : 0.04.
  const std::vector<double> cold = frequencies({0.5, 1.0, 11});
  const double q[3] = {0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38};
  for (int v = 0; v < 3; ++v) BOOST_TEST(cold[v] == q[v], boost::test_tools::tolerance(0.05));
  // top_p 0.6: 0.5 does not reach it, 0.5 + 0.3 does; the last token is out.
  const std::vector<double> cut = frequencies({1.0, 0.6, 11});
  BOOST_TEST(cut[2] == 0.0);
  BOOST_TEST(cut[0] == 0.625, boost::test_tools::tolerance(0.04));
  // top_k 2: the last token is out, the two left renormalized (0.625 : 0.375); top_k 1 is the argmax.
  const std::vector<double> top2 = frequencies({1.0, 1.0, 11, 2});
  BOOST_TEST(top2[2] == 0.0);
  BOOST_TEST(top2[0] == 0.625, boost::test_tools::tolerance(0.04));
  const auto tol = boost::test_tools::tolerance(1e-9);
  for (int v = 0; v < 3; ++v) BOOST_TEST(frequencies({1.0, 1.0, 11, 1})[v] == (v == 0 ? 1.0 : 0.0), tol);
  // top_k before top_p (transformers' order): of 0.625 : 0.375, top_p 0.6 keeps the first alone.
  BOOST_TEST(frequencies({1.0, 0.6, 11, 2})[0] == 1.0, tol);
  // Ties with the k-th stay in (TopKLogitsWarper cuts below the k-th value).
  const float tied[4] = {1.0f, 0.0f, 1.0f, 1.0f};
  std::vector<int> seen(4, 0);
  for (int step = 0; step < 400; ++step) ++seen[sample_token(tied, 4, {1.0, 1.0, 5, 2}, 0, step)];
  BOOST_TEST(seen[1] == 0);
  for (int v : {0, 2, 3}) BOOST_TEST(seen[v] > 0, "token " << v);  // three kept by top_k 2
  // The draw is a function of (seed, prompt, step): the same again, another for another seed or prompt.
  std::vector<int32_t> a, again, seed, prompt;
  for (int step = 0; step < 64; ++step) {
    a.push_back(sample_token(logits, 3, {1.0, 1.0, 11}, 0, step));
    again.push_back(sample_token(logits, 3, {1.0, 1.0, 11}, 0, step));
    seed.push_back(sample_token(logits, 3, {1.0, 1.0, 12}, 0, step));
    prompt.push_back(sample_token(logits, 3, {1.0, 1.0, 11}, 1, step));
  }
  BOOST_TEST(a == again, boost::test_tools::per_element());
  BOOST_TEST(a != seed);
  BOOST_TEST(a != prompt);
}
