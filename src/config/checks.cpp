// Checks that involve more than one key, or the world size the run is launched with.
#include "config_internal.hpp"

namespace shardlm::config_detail {

// The byte tokenizer's vocabulary: 256 byte values plus its special tokens.
static constexpr int kByteVocab = 259;

void check_run_config(const RunConfig& cfg, int world_size) {
  const ModelConfig& m = cfg.model;
  if (m.head_size == 0 && m.hidden_size % m.num_heads != 0)
    bad_value("model.num_heads", std::to_string(m.num_heads),
              concat("hidden_size (", m.hidden_size, ") is not divisible by it"));
  const ModelFamily& family = model_family(m.arch);
  if (m.head_size != 0 && !family.grouped_query)
    bad_value("model.head_dim", std::to_string(m.head_size), concat("applies to the Llama-style families, not ", m.arch));
  if (family.grouped_query && m.num_heads % m.kv_heads() != 0)
    bad_value("model.num_kv_heads", std::to_string(m.num_kv_heads),
              concat("num_heads (", m.num_heads, ") is not divisible by it"));
  if (family.rotary && m.head_dim() % 2 != 0)
    bad_value("model.num_heads", std::to_string(m.num_heads),
              concat("gives an odd head dimension ", m.head_dim(), "; rotary embeddings need an even one"));
  if (cfg.data.tokenizer != TokenizerSource::File && cfg.model.dir.empty() && m.vocab_size < kByteVocab)
    bad_value("model.vocab_size", std::to_string(m.vocab_size),
              concat("must be >= ", kByteVocab, ", the byte tokenizer's vocabulary size"));

  SHARDLM_CHECK(world_size >= 1, "world size must be >= 1 (got ", world_size, ")");
  const TrainSection& t = cfg.train;
  // Product in 64 bits: a huge micro_batch_size x world size must not wrap to a divisor.
  long long per_step = static_cast<long long>(world_size) * t.micro_batch_size;
  if (t.batch_size % per_step != 0) {
    // The fix: a batch the ranks split into whole micro-batches, or (when the ranks split the batch
    // evenly) the largest micro-batch that divides each rank's share.
    std::string fix = concat("set train.batch_size to a multiple of ", per_step);
    if (t.batch_size % world_size == 0) {
      int micro = t.micro_batch_size;
      const int share = t.batch_size / world_size;
      while (share % micro != 0) --micro;
      fix += concat(", or train.micro_batch_size to ", micro);
    }
    throw Error(concat("train.batch_size = ", t.batch_size, " is not divisible by micro_batch_size (",
                       t.micro_batch_size, ") x world size (", world_size, "): ", fix));
  }

  int rpn = cfg.dist.ranks_per_node;
  if (rpn > 0 && world_size % rpn != 0)
    bad_value("dist.ranks_per_node", std::to_string(rpn),
              concat("world size ", world_size, " is not divisible by it"));

  if (!cfg.fsdp.offload_dir.empty() && !cfg.fsdp.cpu_offload)
    bad_value("fsdp.offload_dir", "'" + cfg.fsdp.offload_dir + "'",
              "keeps the host AdamW's moments of an offloaded run: set fsdp.cpu_offload = true, or leave it empty");
  if (cfg.fsdp.offload_accumulate == OffloadAccumulate::Device && !cfg.fsdp.cpu_offload)
    bad_value("fsdp.offload_accumulate", "device",
              "says where an offloaded run sums its micro-steps' gradients: set fsdp.cpu_offload = true, or use host");
  if (cfg.fsdp.offload_root_update == OffloadRootUpdate::Device && !cfg.fsdp.cpu_offload)
    bad_value("fsdp.offload_root_update", "device",
              "says where an offloaded run updates its root unit: set fsdp.cpu_offload = true, or use auto");
  if (cfg.fsdp.offload_resident_gib > 0 && (!cfg.fsdp.cpu_offload || cfg.fsdp.offload_root_update == OffloadRootUpdate::Host ||
                                            !cfg.fsdp.offload_dir.empty()))
    bad_value("fsdp.offload_resident_gib", format_double(cfg.fsdp.offload_resident_gib),
              "keeps part of the root unit's optimizer state on the GPU when an offloaded run updates the root "
              "there: set fsdp.cpu_offload = true, fsdp.offload_root_update = auto or device and no "
              "fsdp.offload_dir, or use 0");
  if (cfg.fsdp.offload_root_update == OffloadRootUpdate::Device && !cfg.fsdp.offload_dir.empty())
    bad_value("fsdp.offload_root_update", "device",
              "streams the root's moments from host memory, and fsdp.offload_dir keeps them in files: leave "
              "fsdp.offload_dir empty, or use auto (which then updates the root on the host)");
}

}  // namespace shardlm::config_detail
