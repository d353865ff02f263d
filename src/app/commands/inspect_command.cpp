// `shardlm inspect CKPT`: what a checkpoint holds (run position, model, strategy, tensors and norms).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <map>

#include "commands.hpp"
#include "shardlm/data.hpp"
#include "shardlm/dist.hpp"
#include "shardlm/io.hpp"

namespace shardlm {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string names_text(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return names.empty() ? "none" : s;
}

// The optimizer vectors stored beside param: one line when every unit holds the same, else per unit.
void print_optimizer_state(const std::vector<CheckpointUnitState>& units) {
  const auto differs = [&](const CheckpointUnitState& u) { return u.optimizer != units.front().optimizer; };
  if (!units.empty() && std::none_of(units.begin(), units.end(), differs)) {
    std::printf("optimizer    state %s (fp32, beside each unit's param)\n", names_text(units.front().optimizer).c_str());
    return;
  }
  for (const CheckpointUnitState& u : units)
    std::printf("optimizer    %s: state %s\n", u.unit.c_str(), names_text(u.optimizer).c_str());
}

// A number of the [train] section of the resolved deck the checkpoint stores (its key names are
// unique over the sections); -1 when absent.
long train_key(const std::string& deck, const std::string& key) {
  const size_t at = deck.find("\n" + key + " = ", deck.find("\n[train]\n"));
  return at == std::string::npos ? -1 : std::atol(deck.c_str() + at + key.size() + 4);
}

// The checkpoint's position as the log counts it: epochs done, e.g. "epoch 10.00" after ten epochs
// (the file's `epoch` is 0-based and `epoch_step` counts into it). Steps per epoch come from the
// epochs already done, else from total_steps when train.max_steps did not cap it.
std::string position_text(const CheckpointMeta& m) {
  long per_epoch = 0;
  if (m.epoch > 0) {
    per_epoch = (m.step - m.epoch_step) / m.epoch;
  } else {
    const long epochs = train_key(m.deck, "epochs"), max_steps = train_key(m.deck, "max_steps");
    if (epochs > 0 && (max_steps <= 0 || m.total_steps < max_steps)) per_epoch = m.total_steps / epochs;
  }
  if (per_epoch <= 0) return concat(m.epoch_step, " steps into epoch ", m.epoch + 1, ", counted from 1");
  char text[64];
  std::snprintf(text, sizeof text, "epoch %.2f, as the log counts epochs done",
                static_cast<double>(m.step) / static_cast<double>(per_epoch));
  return text;
}

void print_checkpoint(const std::string& path) {
  CheckpointReader reader(path);
  const CheckpointMeta& m = reader.meta();
  std::printf("checkpoint   %s\n", path.c_str());
  std::printf("format       %d (written by shardlm %s)\n", m.format_version, m.version.c_str());
  std::printf("step         %ld (%s; optimizer step %ld)\n", m.step, position_text(m).c_str(), m.optimizer_steps);
  std::printf("schedule     %s, lr %g, warmup %ld, total %ld steps; seed %llu\n", m.lr_schedule.c_str(), m.base_lr,
              m.warmup_steps, m.total_steps, static_cast<unsigned long long>(m.seed));
  std::printf("layout       %s on %d rank(s), shard group %d\n", m.strategy.c_str(), m.world_size, m.shard_group_size);
  std::printf("model        %s: vocab %d, hidden %d, layers %d, heads %d", m.model.arch.c_str(), m.model.vocab_size,
              m.model.hidden_size, m.model.num_layers, m.model.num_heads);
  if (model_family(m.model.arch).grouped_query)
    std::printf(", kv heads %d, intermediate %d%s", m.model.kv_heads(), m.model.ffn_size(),
                m.model.tie_word_embeddings ? ", tied head" : "");
  std::printf("\n");
  print_optimizer_state(reader.unit_states());
  std::printf("\n%-48s %-16s %12s %14s %14s\n", "tensor", "shape", "numel", "l2 norm", "max |x|");
  size_t total = 0;
  for (const CheckpointTensor& t : reader.tensors()) {
    std::vector<float> v = reader.read(t);
    double sq = 0, mx = 0;
    for (float x : v) {
      sq += static_cast<double>(x) * x;
      mx = std::max(mx, static_cast<double>(std::fabs(x)));
    }
    total += t.numel;
    std::printf("%-48s %-16s %12zu %14.6g %14.6g\n", t.name.c_str(), shape_text(t.shape).c_str(), t.numel,
                std::sqrt(sq), mx);
  }
  std::printf("\n%zu tensors, %zu parameters\n", reader.tensors().size(), total);
}

// A serial command: rank 0 does the work, the others only agree on the outcome.
void on_rank0(MPI_Comm comm, const std::function<void()>& work) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  run_collectively(comm, [&] {
    if (rank == 0) work();
  });
}

}  // namespace

int command_inspect(const std::vector<std::string>& args) {
  const bool verify = !args.empty() && args[0] == "--verify";
  if (args.size() != (verify ? 2u : 1u)) {
    log_info("usage: shardlm inspect [--verify] CHECKPOINT   (a .h5 file, or a checkpoint folder: its latest; --help)");
    return 2;
  }
  const std::string spec = args.back();
  if (!verify) {
    on_rank0(MPI_COMM_WORLD, [&] { print_checkpoint(resolve_checkpoint_path(spec, "shardlm inspect CHECKPOINT")); });
    return 0;
  }
  // --verify: every dataset's checksum; the damage is the agreed error, so the exit code is 1.
  on_rank0(MPI_COMM_WORLD, [&] {
    const std::string path = resolve_checkpoint_path(spec, "shardlm inspect CHECKPOINT");
    CheckpointReader reader(path);
    const std::vector<std::string> damage = reader.verify();
    if (!damage.empty()) {
      std::string text = damage.front();
      for (size_t i = 1; i < damage.size(); ++i) text += "\n  " + damage[i];
      throw Error(concat(text, damage.size() > 1 ? concat("\n  (", damage.size(), " damaged datasets)") : ""));
    }
    size_t datasets = 0;
    for (const CheckpointUnitState& u : reader.unit_states()) datasets += 1 + u.optimizer.size();
    std::printf("%s: intact (%zu datasets, every checksum verified)\n", path.c_str(), datasets);
  });
  return 0;
}

// A run with the byte tokenizer names its special tokens in the exported config.json.
std::map<std::string, int> byte_tokenizer_ids(const std::string& deck) {
  if (deck.find("\ntokenizer = byte\n") == std::string::npos) return {};
  return {{"bos_token_id", ByteTokenizer::kBos}, {"eos_token_id", ByteTokenizer::kEos},
          {"pad_token_id", ByteTokenizer::kPad}};
}

int command_export(const std::vector<std::string>& args) {
  if (args.size() != 2) {
    log_info("usage: shardlm export CHECKPOINT DIR   (Hugging Face config.json + safetensors; --help)");
    return 2;
  }
  on_rank0(MPI_COMM_WORLD, [&] {
    const std::string path = resolve_checkpoint_path(args[0], "shardlm export CHECKPOINT");
    CheckpointReader reader(path);
    export_hf_model(args[1], reader.meta().model, reader.tensors(),
                    [&](const CheckpointTensor& t) { return reader.read(t); }, byte_tokenizer_ids(reader.meta().deck));
    std::printf("exported %s (step %ld) to %s\n", path.c_str(), reader.meta().step, args[1].c_str());
  });
  return 0;
}

}  // namespace shardlm
