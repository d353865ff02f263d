// data: tokenizers (bytes; Hugging Face tokenizer.json), dataset readers (SQuAD v1.1 JSON, JSONL
// text, chess moves), SQuAD v1.1 exact match and F1, batching and the distributed sampler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "shardlm/config.hpp"

namespace shardlm {

// What the dataset loaders, the trainer and generation need of a tokenizer.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text to ids, without special tokens (the loaders place BOS and EOS themselves).
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // Ids to text, special tokens dropped.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int32_t bos_id() const = 0;  // -1: sequences start without one
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;  // fills micro-batches; never takes a loss
  virtual int32_t vocab_size() const = 0;
};

// Byte-level tokenizer: ids 0..255 are the bytes, then the special tokens.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  static constexpr int32_t kPad = 258;
  int32_t vocab_size() const override { return 259; }
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;  // special tokens are dropped
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  int32_t pad_id() const override { return kPad; }
  // The special tokens' names in the files below (shardlm's own encode never produces them).
  static constexpr const char* kBosText = "<|bos|>";
  static constexpr const char* kEosText = "<|eos|>";
  static constexpr const char* kPadText = "<|pad|>";
  // The tokenizer as transformers' PreTrainedTokenizerFast reads it, by file name: tokenizer.json
  // (byte-level BPE without merges: byte b is id b; BOS first, as in training),
  // tokenizer_config.json and special_tokens_map.json.
  static std::map<std::string, std::string> hf_files(int model_max_length);
};

// One training sequence. targets[t] is the token position t must predict (tokens[t + 1] where a
// loss is taken), -1 elsewhere; tokens and targets have the same length.
struct Example {
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
  bool cut = false;  // the record was longer than max_length and lost tokens (shardlm preprocess counts them)
};

struct DatasetOptions {
  int max_length = 512;   // tokens per sequence after truncation
  size_t limit = 0;       // keep the first `limit` records after the seeded shuffle (0 = all)
  uint64_t seed = 0;      // order of the subset selection
  bool shuffle_subset = false;
};

// SQuAD v1.1 JSON ({"data":[{"paragraphs":[{"context","qas":[{"question","answers":[{"text"}]}]}]}]}).
// Each question becomes "Question: {q} Context: {c} Answer: {answer}" + EOS, tokenized whole, the
// loss taken on the tokens that overlap the answer and EOS; the context (never the question or the
// answer) is cut by whole characters to fit.
// Throws Error naming the file (and record) on malformed input.
std::vector<Example> load_squad(const std::string& path, const Tokenizer& tok,
                                const DatasetOptions& opt);

// One SQuAD question as the metrics see it: its id and every reference answer, in file order.
struct SquadQuestion {
  std::string id;
  std::vector<std::string> answers;
};

// The questions of a SQuAD file in the order and subset load_squad gives its examples for the
// same options (question i is example i), each with all its answers. Every question needs a
// string 'id'. Throws Error naming the file and record on malformed input.
std::vector<SquadQuestion> load_squad_questions(const std::string& path, const DatasetOptions& opt);

// SQuAD v1.1 metrics, as the official evaluate-v1.1.py defines them. Normalisation: Python's
// lower(), removal of string.punctuation (ASCII only: curly quotes and dashes stay), removal of
// the whole words a/an/the, whitespace collapsed; squad_answer_tokens splits the result.
std::string squad_normalize_answer(const std::string& text);
std::vector<std::string> squad_answer_tokens(const std::string& text);
double squad_exact_match(const std::string& prediction, const std::string& reference);  // 0 or 1
double squad_f1(const std::string& prediction, const std::string& reference);  // token-bag F1 in [0, 1]
// The best score over the references (0 when there are none).
double squad_best_exact_match(const std::string& prediction, const std::vector<std::string>& references);
double squad_best_f1(const std::string& prediction, const std::vector<std::string>& references);

struct SquadScores {
  double exact_match = 0;  // percent over all questions, as the official script reports it
  double f1 = 0;           // percent
  size_t questions = 0;
  size_t answered = 0;     // questions with a prediction; the others score 0
};

// A predictions file as the official evaluate-v1.1.py reads it (and runs write
// RUN_DIR/predictions.json): one JSON object of question id -> predicted answer. Error naming the
// file (and id) otherwise.
std::unordered_map<std::string, std::string> read_squad_predictions(const std::string& path);

// Scores predictions keyed by question id against every question.
SquadScores squad_scores(const std::vector<SquadQuestion>& questions,
                         const std::unordered_map<std::string, std::string>& predictions);

// JSON lines with {"text": ...} (loss on every next token) or {"prompt": ..., "completion": ...}
// (loss on the completion and EOS only), truncated to max_length.
std::vector<Example> load_jsonl(const std::string& path, const Tokenizer& tok,
                                const DatasetOptions& opt);

// [BOS] text [EOS] with a loss on every next token, cut to max_length tokens (its end goes).
Example next_token_example(const std::vector<int32_t>& text, const Tokenizer& tok, int max_length);

// `count` next-token examples of made-up words, the same for a seed (smoke runs without their data file).
std::vector<Example> synthetic_examples(size_t count, int max_length, const Tokenizer& tok, uint64_t seed);

// Chess games as sequences of UCI moves (e2e4, e7e8q), one game per line: JSON lines with a
// "moves" field (any letter case, as laion/strategic_game_chess's "Moves"; a list of move
// strings or one space-separated string; other fields such as "Termination" and "Result" are
// ignored) or, when the first non-blank line does not start with '{', plain text of
// space-separated moves. The text a game trains on is its moves joined by single spaces,
// "e2e4 e7e5 g1f3", as [BOS] text [EOS] with a loss on every next token, cut to max_length.
// A malformed move is an Error naming the file, line and move.
std::vector<Example> load_chess(const std::string& path, const Tokenizer& tok,
                                const DatasetOptions& opt);
// Whether `move` is UCI long algebraic notation in lower case: from and to squares (a1..h8) that
// differ, then optionally a promotion piece (q, r, b or n), allowed only on a pawn's last step
// (7th to 8th rank or 2nd to 1st, to the same or a neighbouring file).
bool is_uci_move(const std::string& move);

// The loader of a deck's data.format: load_squad, load_jsonl or load_chess.
std::vector<Example> load_examples(DataFormat format, const std::string& path,
                                   const Tokenizer& tok, const DatasetOptions& opt);

// A permutation of 0..n-1 drawn by Fisher-Yates from std::mt19937_64(seed) with unbiased bounded
// draws, so it is the same on every standard library (std::shuffle is not). Used for the seeded
// subset selection of the loaders and the epoch orders of the sampler.
std::vector<size_t> seeded_permutation(size_t n, uint64_t seed);

// The options a run loads a data file with: the deck's max_length, and (limit > 0: data.train_size or
// eval_size) a seeded subset of that many records drawn with train.seed.
DatasetOptions dataset_options(const DataSection& data, size_t limit, uint64_t seed);
// The subset rule of DatasetOptions shared by the loaders: with limit > 0, keep `limit` examples,
// the first ones or (shuffle_subset) those seeded_permutation(n, seed) puts first, in file order.
std::vector<Example> select_subset(std::vector<Example> all, const DatasetOptions& opt);
// The indices (ascending) of the n records select_subset keeps.
std::vector<size_t> subset_indices(size_t n, const DatasetOptions& opt);

// A micro-batch padded to its longest row (padding never takes a loss).
struct MicroBatch {
  int batch = 0;
  int seq = 0;
  std::vector<int32_t> tokens;   // batch * seq
  std::vector<int32_t> targets;  // batch * seq, -1 where no loss
  int64_t target_count = 0;      // positions with a target
  // Packed rows (data.packing): for each position, where its sample starts in its row, so a token
  // attends only to its own sample and its position is t - starts[t]. Empty: one sample per row.
  std::vector<int32_t> starts;   // batch * seq, or empty
};

// The padded length is rounded up to a multiple of `length_multiple`, at most `max_seq` (0: no
// bound): the extra positions are padding at the end of each row, which a causal model's other
// positions never see, so only the shapes the model meets change (UnitModel::length_multiple).
MicroBatch make_micro_batch(const std::vector<Example>& data, const std::vector<size_t>& indices,
                            int32_t pad_id, int length_multiple = 1, int max_seq = 0);

// Number of loss positions over the given examples.
int64_t count_targets(const std::vector<Example>& data, const std::vector<size_t>& indices);

// Sequence packing (data.packing). The examples `indices` names, packed end to end into rows of at
// most `capacity` tokens by first-fit decreasing (longest first, ties in index order; the same on
// every rank): each row lists its examples in the order they sit in it.
using PackedRow = std::vector<size_t>;
std::vector<PackedRow> pack_rows(const std::vector<Example>& data, const std::vector<size_t>& indices, int capacity);
// A micro-batch of packed rows: each row its examples' tokens and targets end to end, padded (no
// loss) to the longest row rounded up as make_micro_batch does; `starts` marks where each sample
// begins (the padding after a row's last sample counts as a sample of its own, which nothing sees).
MicroBatch make_packed_micro_batch(const std::vector<Example>& data, const std::vector<PackedRow>& rows,
                                   int32_t pad_id, int length_multiple = 1, int max_seq = 0);

// One optimizer step's global batch packed into rows and dealt out: micro-step m of rank r gets
// rows [(m * world + r) * rows_per_micro, ... + rows_per_micro), the missing ones at the end empty,
// so every rank runs the same number of micro-steps (an empty micro-batch still takes part in the
// collectives, with no compute).
struct PackedStep {
  std::vector<PackedRow> rows;
  int micro_steps = 0;  // per rank
  // The rows of micro-step m of `rank` (fewer, or none, at the end).
  std::vector<PackedRow> micro_batch(int m, int rank, int world, int rows_per_micro) const;
};
PackedStep pack_step(const std::vector<Example>& data, const std::vector<size_t>& global, int capacity, int world,
                     int rows_per_micro);

// The share of padding among the token positions a run computes on, with and without packing.
struct PaddingShare {
  int64_t real = 0;      // tokens of the examples
  int64_t unpacked = 0;  // positions computed without packing (each micro-batch padded to its longest)
  int64_t packed = 0;    // positions computed with packing
  int64_t unpacked_micro_batches = 0, packed_micro_batches = 0;  // forward passes, over all ranks
  double unpacked_share() const { return unpacked > 0 ? 1.0 - static_cast<double>(real) / unpacked : 0.0; }
  double packed_share() const { return packed > 0 ? 1.0 - static_cast<double>(real) / packed : 0.0; }
};

// Splits each epoch's (seeded, optionally shuffled) order into global batches of a fixed size;
// the global batch of a step is the same whatever the world size, and each rank's micro-batches
// are contiguous pieces of it. The last incomplete global batch of an epoch is dropped.
// An epoch's order is computed once and kept until another epoch is asked for, so the steps and
// micro-batches of an epoch cost their own size, not the dataset's (thread-safe).
class DistributedSampler {
 public:
  DistributedSampler(size_t dataset_size, size_t global_batch, uint64_t seed, bool shuffle);
  size_t steps_per_epoch() const;
  std::vector<size_t> global_batch(size_t epoch, size_t step) const;
  // Indices of micro-batch `micro` (of size micro_size) of `rank` among `world` ranks.
  std::vector<size_t> micro_batch(size_t epoch, size_t step, int rank, int world, int micro,
                                  int micro_size) const;

 private:
  struct EpochOrder {
    size_t epoch = 0;
    std::vector<size_t> indices;  // every example once, in the epoch's order
  };
  std::shared_ptr<const EpochOrder> order(size_t epoch) const;
  size_t n_;
  size_t global_batch_;
  uint64_t seed_;
  bool shuffle_;
  mutable std::shared_ptr<const EpochOrder> last_order_;  // read and replaced with std::atomic_load/store
};

// A Hugging Face tokenizer read from tokenizer.json (the `tokenizers` library's format), giving the
// ids and text `tokenizers` gives: byte-level BPE (GPT-2, BLOOM, Llama 3: ByteLevel, Split and
// Sequence pre-tokenizers) and SentencePiece-style BPE with byte fallback (Llama 2, CodeLlama:
// Prepend/Replace normalizers, Metaspace). Added tokens are matched before pre-tokenization.
// Copies share one immutable model and one word cache; encode and decode are thread-safe.
class HfTokenizer {
 public:
  // Reads tokenizer.json and, when one lies beside it, tokenizer_config.json (bos/eos/pad names).
  // Throws Error naming the file and the JSON path of anything malformed or unsupported.
  static HfTokenizer from_file(const std::string& path);
  // The same from JSON text; `source` names it in errors; `config_json` may be empty.
  static HfTokenizer from_json(const std::string& tokenizer_json, const std::string& source,
                               const std::string& config_json = "");

  // `text` must be valid UTF-8 (Error otherwise). add_special_tokens applies the post-processor
  // (Llama's BOS, for one); special tokens written in the text are matched either way.
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens = true) const;
  // Unknown ids are skipped, as `tokenizers` does; invalid UTF-8 becomes U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  int32_t token_to_id(const std::string& token) const;  // -1 when absent
  std::string id_to_token(int32_t id) const;            // "" when absent
  bool is_special(int32_t id) const;                    // an added token marked special
  // From tokenizer_config.json when present, else from the post-processor and the usual names
  // (<s>, </s>, <pad>, <|endoftext|>, ...); -1 when unknown.
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  int32_t unk_id() const;
  // One past the largest id of the model's vocabulary and the added tokens: the embedding rows.
  int32_t vocab_size() const;

 private:
  struct Impl;  // src/data/hf_tokenizer.hpp
  explicit HfTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Converts a SentencePiece BPE model (tokenizer.model of Llama 2 and CodeLlama) into the
// tokenizer.json transformers' LlamaTokenizerFast writes for it (legacy: Prepend "▁" and Replace
// normalizers; merges ordered by the merged piece's score; BOS added by the post-processor).
// Throws Error naming the file if it is not a BPE SentencePiece model.
std::string sentencepiece_to_tokenizer_json(const std::string& model_path);

// An HfTokenizer as the loaders' Tokenizer: encode without the post-processor's special tokens,
// decode skipping special tokens; PAD is the tokenizer's, else EOS (padding takes no loss).
class HfTextTokenizer final : public Tokenizer {
 public:
  explicit HfTextTokenizer(HfTokenizer tok) : tok_(std::move(tok)) {}
  std::vector<int32_t> encode(const std::string& text) const override { return tok_.encode(text, false); }
  std::string decode(const std::vector<int32_t>& ids) const override { return tok_.decode(ids, true); }
  int32_t bos_id() const override { return tok_.bos_id(); }
  int32_t eos_id() const override { return tok_.eos_id(); }
  int32_t pad_id() const override { return tok_.pad_id() >= 0 ? tok_.pad_id() : tok_.eos_id(); }
  int32_t vocab_size() const override { return tok_.vocab_size(); }
  const HfTokenizer& hf() const { return tok_; }

 private:
  HfTokenizer tok_;
};

// The tokenizer.json file data.tokenizer names: the path, or a folder's tokenizer.json.
std::string tokenizer_file(const std::string& tokenizer_json);
// The tokenizer of a tokenizer.json file (or a folder holding one); empty: the byte tokenizer
// (RunConfig::tokenizer_json). Error naming the file when it cannot be read or has no EOS token.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& tokenizer_json);

// The text of a growing sequence of token ids, given out as the ids come (streaming generation):
// push returns the text that became final with the new id. Held back until later ids settle it: the
// end of a UTF-8 character split over tokens (an incomplete byte sequence, or the U+FFFD a tokenizer
// decodes it to), text that may begin a stop string, and text the decode of one more id changed
// (given out once two decodes in a row agree on it: a byte-fallback tokenizer decodes a run of byte
// tokens to U+FFFD per byte once it stops being valid UTF-8, so "é" can turn into two U+FFFD when
// a third byte comes). At a stop string the stream stops: that string and whatever follows are
// never given out.
class TextStream {
 public:
  explicit TextStream(const Tokenizer& tok, std::vector<std::string> stop_strings = {});
  std::string push(int32_t id);
  // At the end: the text still held back (a stop string never). Should a decode have changed text
  // already given out (which agreement makes rare), the rest from where they part.
  std::string finish();
  bool stopped() const { return stopped_; }
  // The whole text of the ids, up to the stop string: the decode, which the pieces given out add up to
  // unless a decode changed what was given.
  std::string text() const;

 private:
  const Tokenizer& tok_;
  std::vector<std::string> stop_strings_;
  std::vector<int32_t> ids_;
  std::string given_;     // the text given out
  std::string settled_;   // the settled text of the last push's decode
  std::string stop_text_;  // stopped: the text before the stop string
  bool stopped_ = false;
};

}  // namespace shardlm
