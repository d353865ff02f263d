// A run's setup: the deck echoed and saved, tokenizer and data loaded, the engine built, the peak
// the MFU is measured against chosen, the run's shape and per-rank memory logged; then the weights
// and position it starts from.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "run_id.hpp"
#include "train_checkpoint.hpp"
#include "train_run.hpp"
#include "../data/chat.hpp"
#include "../dist/nccl_environment.hpp"
#include "../io/checkpoint_format.hpp"
#include "shardlm/optim.hpp"
#include "shardlm/device.hpp"
#include "shardlm/fsdp.hpp"
#include "shardlm/io.hpp"

namespace shardlm {

namespace {

// Resume needs the model and tokenizer a checkpoint was written for: Error naming the first key
// that differs.
// LoRA: the checkpoint's adapters must be those of this run's [lora] and have been trained on the same
// frozen base weights; "" when they are.
std::string lora_difference(const CheckpointMeta& meta, const TrainRun& run) {
  const ModelSection& model = run.cfg.model;
  if (meta.lora.empty() != !model.lora.enabled())
    return model.lora.enabled() ? "it holds a whole model, this run trains LoRA adapters ([lora])"
                                : "it holds LoRA adapters, this run trains the whole model (no [lora])";
  if (meta.lora.empty()) return "";
  const PeftAdapterConfig saved = peft_adapter_config_from_json(meta.lora, "its LoRA settings", model);
  std::string diff = lora_disagreement(model.lora, saved.lora, "the checkpoint", [](const std::string&) { return true; });
  // (The first look at the checkpoint comes before the base is loaded: run.base_checksum is known later.)
  if (diff.empty() && !meta.base_checksum.empty() && !run.base_checksum.empty() && meta.base_checksum != run.base_checksum)
    diff = concat("its adapters were trained on other base weights (checksum ", meta.base_checksum, " of ",
                  saved.base_model_name_or_path.empty() ? std::string("the seeded initialisation")
                                                        : saved.base_model_name_or_path,
                  "; this run's ", run.base_checksum, " of ",
                  model.dir.empty() ? std::string("the seeded initialisation") : model.dir, ")");
  return diff;
}

void check_same_model(const std::string& path, const CheckpointMeta& meta, const TrainRun& run) {
  std::string diff = model_config_difference(meta.model, run.cfg.model);
  if (diff.empty()) diff = tokenizer_difference(meta, run.cfg, run.tokenizer_hash);
  if (diff.empty()) diff = lora_difference(meta, run);
  SHARDLM_CHECK(diff.empty(), "checkpoint ", path, " holds another model than this run's: ", diff,
                " (resume needs the model and tokenizer it was written for; checkpoint.load_weights_only = true "
                "starts a new run from its weights)");
}

// The checkpoint's position in the epoch in steps of this run's global batch: the examples its
// steps took, divided by this batch, rounded down (checkpoint.allow_new_batch).
long resumed_epoch_step(const CheckpointMeta& meta, const TrainRun& run) {
  const long batch = run.cfg.train.batch_size;
  if (meta.global_batch <= 0 || meta.global_batch == batch) return meta.epoch_step;
  return meta.epoch_step * meta.global_batch / batch;
}

// The run's last step when it resumes `meta`: with another global batch (checkpoint.allow_new_batch), the
// checkpoint's steps and then what is left of the epochs in this run's batches, so that every example of the
// epoch in progress is still seen once and the schedule ends where the data does; train.max_steps caps it.
long resumed_total_steps(const CheckpointMeta& meta, const TrainRun& run) {
  const TrainSection& t = run.cfg.train;
  long total = run.steps_per_epoch * t.epochs;
  if (meta.global_batch > 0 && meta.global_batch != t.batch_size)
    total = meta.step + (t.epochs - meta.epoch) * run.steps_per_epoch - resumed_epoch_step(meta, run);
  return t.max_steps > 0 ? std::min<long>(total, t.max_steps) : total;
}

// The checkpoint against this deck and run, Error naming the file: its global batch, its position
// within this run's epochs, and (resume = auto) its run id. Errors saying "is inconsistent" or
// "belongs to another run" let resume = auto pass over it (checkpoint_unusable); another batch
// is the deck's choice and ends the run.
void check_resume_fits(const std::string& path, const CheckpointMeta& meta, const TrainRun& run) {
  const RunConfig& cfg = run.cfg;
  SHARDLM_CHECK(meta.global_batch <= 0 || meta.global_batch == cfg.train.batch_size || cfg.checkpoint.allow_new_batch,
                "checkpoint ", path, " was written with a global batch of ", meta.global_batch,
                ", this run's train.batch_size is ", cfg.train.batch_size,
                ": its steps and position in the data would mean other examples (checkpoint.allow_new_batch = true "
                "resumes it with the new batch)");
  const std::string at = concat("checkpoint ", path, " is inconsistent with this run: ");
  // A finished run of a longer deck is left to say "nothing to do".
  SHARDLM_CHECK(meta.epoch < cfg.train.epochs || meta.step >= run.total_steps, at, "epoch ", meta.epoch,
                " is past train.epochs = ", cfg.train.epochs, " while step ", meta.step, " is before the run's last, ",
                run.total_steps);
  SHARDLM_CHECK(resumed_epoch_step(meta, run) <= run.steps_per_epoch, at, "epoch_step ", meta.epoch_step,
                " is past the ", run.steps_per_epoch, " steps of an epoch of ", run.train_set.size(),
                " examples in batches of ", cfg.train.batch_size);
  if (cfg.checkpoint.resume == ResumeFrom::Auto && !run.run_id.empty() && !meta.run_id.empty() &&
      meta.run_id != run.run_id)
    throw Error(concat("checkpoint ", path, " belongs to another run: its run id is ", meta.run_id, ", this run's is ",
                       run.run_id, " (", run_id_path(cfg.run.dir), "); checkpoint.resume = ", path,
                       " resumes it all the same"));
}

// What of the data differs from the checkpoint's run: the seed (which orders every epoch and picks the
// subsets), the training file and its subset size, or else the examples themselves (their hash).
// Resuming then continues the epoch in progress in another order (some of its examples seen twice,
// others never) or over other examples; said, not refused (a moved file, a deliberate change). Empty
// when nothing differs.
std::string resume_data_warning(const std::string& path, const CheckpointMeta& meta, const TrainRun& run) {
  const RunConfig& cfg = run.cfg;
  const std::map<std::string, std::string> deck = ini_values(meta.deck, "the checkpoint's deck");
  const auto was = [&](const std::string& key) {
    const auto it = deck.find(key);
    return it == deck.end() ? std::string() : it->second;
  };
  std::string diff;
  if (meta.seed != cfg.train.seed) diff += concat("train.seed ", meta.seed, " -> ", cfg.train.seed, "; ");
  if (!was("data.train_file").empty() && was("data.train_file") != cfg.data.train_file)
    diff += concat("data.train_file ", was("data.train_file"), " -> ", cfg.data.train_file, "; ");
  if (!was("data.train_size").empty() && was("data.train_size") != std::to_string(cfg.data.train_size))
    diff += concat("data.train_size ", was("data.train_size"), " -> ", cfg.data.train_size, "; ");
  if (diff.empty()) {
    // The same settings, other examples: the file changed since (or what shapes its examples).
    const std::string now = hex_digits(run.train_data_hash);
    if (meta.train_data_hash.empty() || meta.train_data_hash == now) return "";
    return concat("warning: checkpoint ", path, " was trained on other examples than ",
                  cfg.data.train_file.empty() ? std::string("the synthetic data") : cfg.data.train_file,
                  " gives now (its examples' hash ", meta.train_data_hash, ", now ", now,
                  "): the file changed since, or a setting that shapes its examples (data.max_length, the format's "
                  "keys); the rest of its epoch follows this run's order over these examples "
                  "(checkpoint.load_weights_only = true starts a new run from its weights instead)");
  }
  diff.resize(diff.size() - 2);
  return concat("warning: checkpoint ", path, " was trained on other data settings (", diff,
                "): the rest of its epoch follows this run's order, so some of its examples come twice and others "
                "not at all (checkpoint.load_weights_only = true starts a new run from its weights instead)");
}

std::vector<Example> load_dataset(const DataSection& data, const std::string& path, size_t limit,
                                  uint64_t seed, const Tokenizer& tok) {
  return load_examples(data.format, path, tok, dataset_options(data, limit, seed));
}

// A data file of the run; a chat file says once (rank 0) how many assistant turns take no loss, and any
// file how many of its samples have no target at all (cut before their trained part).
std::vector<Example> load_run_dataset(TrainRun& run, const std::string& path, size_t limit) {
  const RunConfig& cfg = run.cfg;
  std::vector<Example> examples;
  if (cfg.data.format != DataFormat::Chat) {
    examples = load_dataset(cfg.data, path, limit, cfg.train.seed, *run.tokenizer);
  } else {
    ChatLoad load = load_chat(cfg.data, cfg.model.dir, cfg.tokenizer_json(), path, *run.tokenizer,
                              dataset_options(cfg.data, limit, cfg.train.seed));
    const std::string warning = chat_alignment_warning(load, path);
    if (!warning.empty()) run.say(warning);
    examples = std::move(load.examples);
  }
  const size_t empty = static_cast<size_t>(std::count_if(examples.begin(), examples.end(), [](const Example& ex) {
    return std::none_of(ex.targets.begin(), ex.targets.end(), [](int32_t t) { return t >= 0; });
  }));
  if (empty > 0)
    run.say(concat("warning: ", path, ": ", empty, " of ", examples.size(),
                   " samples have no token that takes the loss (their trained part lies past data.max_length = ",
                   cfg.data.max_length, ", or they have none): they fill batches but teach nothing, and a step of "
                   "only such samples reports loss 0; raise data.max_length (shardlm preprocess shows the samples)"));
  return examples;
}

// How many segments metrics.jsonl already holds (one 'setup' record each): a resume appends the
// next. Lines that are not whole records (a crash mid-write) are not counted.
int segments_in(const std::filesystem::path& metrics) {
  std::error_code ec;
  if (!std::filesystem::exists(metrics, ec)) return 0;
  const std::unique_ptr<std::istream> file = open_input_file(metrics.string(), "metrics file", kMaxDataFileBytes);
  std::istream& in = *file;
  int setups = 0;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("type", "") == "setup") ++setups;
  }
  return setups;
}

// The examples' tokens and targets, in the order loaded: two ranks' sets, or a run's and its
// checkpoint's, are told apart by it.
ckpt::Fnv1a examples_hash(const std::vector<Example>& examples) {
  ckpt::Fnv1a hash;
  for (const Example& e : examples) {
    hash.add(e.tokens.size());
    for (int32_t t : e.tokens) hash.add(static_cast<uint32_t>(t));
    for (int32_t t : e.targets) hash.add(static_cast<uint32_t>(t));
  }
  return hash;
}

// Output folders checked and locked, an earlier run found (rank 0), tokenizer and data (every rank).
void load_inputs(TrainRun& run) {
  const RunConfig& cfg = run.cfg;
  run.resume_path = resolve_resume(cfg.checkpoint.resume, cfg.checkpoint.resume_path, cfg.checkpoint_dir());
  if (run.rank == 0) {
    // Every output folder is checked before step 1, not when the first checkpoint is due.
    check_output_folders(cfg);
    run.lock = RunFolderLock(cfg.run.dir, cfg.checkpoint_dir());
    // Nothing of an earlier run is touched here: open_run_outputs sets it aside once every check passed.
    run.replacement = claim_run_folder(cfg, run.resume_path);
    // A resumed run continues the run's file as its next segment (segment 1 at least, also when it
    // starts a new file from another run's checkpoint); loading weights only starts a new run.
    const bool continues = !run.resume_path.empty() && !cfg.checkpoint.load_weights_only;
    // A fresh run is a new run id, written by open_run_outputs once the earlier run is set aside; a resume
    // keeps the folder's (none: load_start settles it).
    if (continues) {
      run.run_id = read_run_id(cfg.run.dir);
      // A folder with neither an id nor an earlier run's records is a new run's: it takes an id of its own, so that
      // resume = auto passes over another run's checkpoints in a shared checkpoint.dir and a checkpoint named in
      // checkpoint.resume stays the other run's. (No id but records: a folder from before ids were kept.)
      if (run.run_id.empty() && !holds_run_records(cfg.run.dir)) run.run_id = new_run_id();
      run.segment = std::max(1, segments_in(std::filesystem::path(cfg.run.dir) / "metrics.jsonl"));
    } else {
      run.run_id = new_run_id();
    }
  }
  // A deck has resolved "auto" already; a RunConfig built in code may still hold it.
  run.tokenizer = make_tokenizer(cfg.tokenizer_json());
  run.tokenizer_hash = tokenizer_hash(cfg.tokenizer_json());
  SHARDLM_CHECK(run.tokenizer->vocab_size() <= cfg.model.vocab_size, "data.tokenizer ", tokenizer_text(cfg.data),
                " has ", run.tokenizer->vocab_size(), " tokens, more than the model's vocab_size ",
                cfg.model.vocab_size);
  // A smoke run without its data file trains on synthetic text (RunConfig::notes said so).
  run.train_set = cfg.run.smoke && cfg.data.train_file.empty()
                      ? synthetic_examples(cfg.data.train_size, cfg.data.max_length, *run.tokenizer, cfg.train.seed)
                      : load_run_dataset(run, cfg.data.train_file, cfg.data.train_size);
  if (!cfg.data.eval_file.empty()) {
    run.eval_set = load_run_dataset(run, cfg.data.eval_file, cfg.data.eval_size);
    if (run.generate_answers)
      run.questions =
          load_squad_questions(cfg.data.eval_file, dataset_options(cfg.data, cfg.data.eval_size, cfg.train.seed));
  }
  run.train_data_hash = examples_hash(run.train_set).value();
  SHARDLM_CHECK(run.train_set.size() >= static_cast<size_t>(cfg.train.batch_size), "train.batch_size = ",
                cfg.train.batch_size, " is larger than the training set (", run.train_set.size(), " examples in ",
                cfg.data.train_file, ")");
}

// Every rank loads the deck's inputs itself: agreed here that they are the same on every rank. A data file that
// differs between nodes (a node-local copy, a file replaced while the job started) or a rank started with
// other options would otherwise train each rank on other examples and hang where their step counts part.
void check_same_inputs(const TrainRun& run) {
  struct Seen {
    uint64_t deck, tokenizer, train, eval, train_contents, eval_contents;
  };
  ckpt::Fnv1a deck, tokenizer;
  deck.add_bytes(resolved_deck_ini(run.cfg));
  tokenizer.add_bytes(run.tokenizer_hash);
  const Seen mine{deck.value(),          tokenizer.value(),
                  run.train_set.size(),  run.eval_set.size(),
                  run.train_data_hash, examples_hash(run.eval_set).value()};
  constexpr int kWords = sizeof(Seen) / sizeof(uint64_t);
  std::vector<Seen> all(static_cast<size_t>(run.world));
  MPI_Allgather(&mine, kWords, MPI_UINT64_T, all.data(), kWords, MPI_UINT64_T, run.comm);
  const RunConfig& cfg = run.cfg;
  const Seen& first = all[0];
  for (int r = 1; r < run.world; ++r) {
    const Seen& other = all[static_cast<size_t>(r)];
    std::string what;
    if (other.deck != first.deck) what = "another resolved deck (other options on its command line?)";
    else if (other.tokenizer != first.tokenizer) what = concat("another tokenizer from ", tokenizer_text(cfg.data));
    else if (other.train != first.train)
      what = concat(other.train, " training examples from ", cfg.data.train_file, " where rank 0 loaded ", first.train);
    else if (other.eval != first.eval)
      what = concat(other.eval, " evaluation examples from ", cfg.data.eval_file, " where rank 0 loaded ", first.eval);
    else if (other.train_contents != first.train_contents)
      what = concat("as many examples as rank 0 but other tokens from ", cfg.data.train_file);
    else if (other.eval_contents != first.eval_contents)
      what = concat("as many evaluation examples as rank 0 but other tokens from ", cfg.data.eval_file);
    if (!what.empty())
      throw AgreedError(concat("rank ", r, " loaded other inputs than rank 0: ", what,
                               ". Every rank reads the deck's files itself, so they must be the same on every node "
                               "(a node-local copy or a file changed while the job started differs)"));
  }
}

void report_memory(TrainRun& run) {
  const FsdpEngine& engine = *run.engine;
  MPI_Comm comm = run.comm;
  const bool echo = run.echo;
  const int rank = run.rank, world = run.world;
  const FsdpMemory m = engine.memory();
  // The memory record's fields, in the table's column order (the last is not a column).
  const NamedValues mine = {{"master_shard_bytes", double(m.master_shard)}, {"grad_shard_bytes", double(m.grad_shard)},
                            {"optimizer_bytes", double(engine.optimizer_bytes())}, {"full_param_bytes", double(m.full_params)},
                            {"full_grad_bytes", double(m.full_grads)},           {"activation_bytes", double(m.activations)},
                            {"comm_staging_bytes", double(m.comm_staging)}};
  const std::vector<NamedValues> all = gather_on_root(comm, mine);
  if (rank != 0) return;
  const double model_bytes = static_cast<double>(m.model_params) * sizeof(float);
  if (echo) {
    log_info(concat("model: ", m.model_params, " parameters (", format_bytes(size_t(model_bytes)),
                    " fp32); per-rank state:"));
    log_info("  rank   master-shard     grad-shard      optimizer    full-params     full-grads    activations");
  }
  auto right = [](const std::string& t, size_t width) { return std::string(t.size() < width ? width - t.size() : 0, ' ') + t; };
  for (int r = 0; r < world; ++r) {
    nlohmann::json rec = {{"type", "memory"}, {"rank", r}};
    std::string line = "  " + right(std::to_string(r), 4);
    for (size_t k = 0; k < all[r].size(); ++k) {
      const auto& [name, bytes] = all[r][k];
      rec[name] = bytes;
      if (k + 1 < all[r].size()) line += " " + right(format_bytes(size_t(bytes)), 14);
    }
    if (echo) log_info(line);
    rec["model_bytes"] = model_bytes;
    rec["sharded_state_fraction"] = (rec["master_shard_bytes"].get<double>() + rec["optimizer_bytes"].get<double>()) /
                                    (3.0 * model_bytes);
    run.record(rec);
  }
}

// The run's shape: world and groups, data and batch, as log lines and the setup record.
void report_shape(TrainRun& run) {
  const RunConfig& cfg = run.cfg;
  for (const std::string& note : cfg.notes) run.say(note);
  for (const std::string& warning : inert_key_warnings(cfg, run.topo.num_nodes)) run.say(warning);
  ProcessGroups& groups = run.engine->groups();
  run.say(concat("world ", run.world, " rank(s) on ", run.topo.num_nodes, run.topo.emulated ? " emulated" : "",
                 " node(s); ", strategy_name(cfg.fsdp.strategy), ": shard group ", groups.shard->size(),
                 ", replicate group ", groups.replicate->size(), "; param ", dtype_name(cfg.fsdp.param_dtype),
                 ", reduce ", dtype_name(cfg.fsdp.reduce_dtype)));
  if (cfg.run.backend == BackendKind::Cuda && gpus_shared())
    run.say("ranks share GPUs (SHARDLM_SHARE_GPUS=1, fewer GPUs than ranks on a host): NCCL joins every rank through "
            "its network transport, as separate nodes, and the copy-engine paths are off; values and memory per rank "
            "as on one GPU a rank, speed not");
  // NCCL's symmetric windows, where the engine got them (dist.gather_copy_engine, dist.symmetric_reductions,
  // dist.copy_engine_reductions).
  std::vector<std::string> windows;
  if (groups.shard_gather && groups.shard_gather->windows() > 0) windows.push_back("all-gathers on the copy engines");
  if (run.engine->options().copy_engine_reductions)
    windows.push_back("the blocks' reduce-scatters as copy-engine exchanges and a sum");
  else if (groups.shard->windows() > 0)
    windows.push_back("the blocks' reduce-scatters in symmetric windows");
  std::string line;
  for (const std::string& w : windows) line += (line.empty() ? "nccl: " : "; ") + w;
  if (!line.empty()) run.say(line);
  const int multiple = run.engine->length_multiple();
  run.say(concat("attention: ", run.engine->attention_description(),
                 multiple > 1 ? concat("; micro-batches padded to a multiple of ", multiple, " tokens") : ""));
  if (const std::string fp8 = run.engine->fp8_description(); !fp8.empty()) run.say("fp8: " + fp8);
  run.say(run.peak.line);
  // Which optimizer runs where and, on the host, with which instructions and how many threads (engine_factory's
  // count; the 8-bit AdamW's blocks are plain C++).
  const std::string optimizer = cfg.train.optim == Optim::AdamWTorch ? "AdamW" : "8-bit AdamW (adamw_8bit)";
  const bool simd = cfg.train.optim == Optim::AdamWTorch;
  if (run.engine->backend().host_memory() || cfg.fsdp.cpu_offload)
    run.say(concat("optimizer: ", optimizer, " on the host (", simd ? host_simd_name(host_simd_best()) : "scalar", ", ",
                   cpu_default_threads(run.topo.host_ranks), " thread(s) per rank)",
                   cfg.fsdp.cpu_offload ? "; " + run.engine->offload_description() : ""));
  else
    run.say(concat("optimizer: ", optimizer, " on the GPU"));
  run.say(concat("data: ", run.train_set.size(), " train / ", run.eval_set.size(), " eval examples; global batch ",
                 cfg.train.batch_size, " = micro-batch ", run.micro, " x ", run.accum, " accumulation x ", run.world,
                 " ranks", cfg.data.packing ? concat(" (packed: rows of ", cfg.data.max_length, " tokens, ", run.micro,
                                                     " a micro-batch; the micro-steps per step vary)")
                                              : "",
                 "; ", run.steps_per_epoch, " steps/epoch, ", run.total_steps, " steps"));
  // Padding among the positions the first epoch computes, with and without packing (rank 0 alone).
  const PaddingShare pad = run.rank == 0 ? epoch_padding_share(run) : PaddingShare{};
  auto format_percent = [](double share) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f%%", 100.0 * share);
    return std::string(text);
  };
  const bool packing = cfg.data.packing;
  run.say(concat("padding: ", format_percent(packing ? pad.packed_share() : pad.unpacked_share()),
                 " of the positions computed in ", packing ? pad.packed_micro_batches : pad.unpacked_micro_batches,
                 " micro-batches an epoch", packing ? " with packing (without: " : " (with data.packing = true: ",
                 format_percent(packing ? pad.unpacked_share() : pad.packed_share()), " in ",
                 packing ? pad.unpacked_micro_batches : pad.packed_micro_batches, ")"));
  nlohmann::json setup = {{"type", "setup"}, {"world_size", run.world}, {"num_nodes", run.topo.num_nodes},
                          {"strategy", strategy_name(cfg.fsdp.strategy)}, {"shard_group_size", groups.shard->size()},
                          {"replicate_group_size", groups.replicate->size()}, {"grad_accum", run.accum},
                          {"attention", run.engine->attention_description()}, {"peak_tflops", run.peak.tflops},
                          {"peak_tflops_source", run.peak.source},
                          {"packing", cfg.data.packing}, {"padding_share", pad.unpacked_share()},
                          {"packed_padding_share", pad.packed_share()},
                          {"micro_batches_per_epoch", pad.unpacked_micro_batches},
                          {"packed_micro_batches_per_epoch", pad.packed_micro_batches},
                          {"steps_per_epoch", run.steps_per_epoch}, {"total_steps", run.total_steps},
                          {"warmup_steps", resolved_warmup_steps(cfg.train.warmup_steps, cfg.train.warmup_ratio,
                                                                 run.total_steps)}};
  if (cfg.fsdp.cpu_offload && cfg.run.backend == BackendKind::Cuda) {
    setup["offload_root_update"] = offload_root_update_name(run.engine->options().offload_root_update);
    // The root's master and moments kept on the GPU (fsdp.offload_resident_gib), in bytes.
    setup["offload_resident_bytes"] = run.engine->buffer_plan().offload_resident_bytes();
  }
  if (run.resume_step >= 0) setup["resumed_from_step"] = run.resume_step;
  run.record(setup);
}

}  // namespace

TrainRun::TrainRun(const RunConfig& config, MPI_Comm communicator, const TrainOptions& options)
    : cfg(config),
      comm(communicator),
      rank(rank_of(communicator)),
      world(size_of(communicator)),
      echo(options.echo && rank == 0),
      progress(echo, echo && output_is_terminal(), 0, 0),
      generate_answers(config.data.format == DataFormat::Squad && config.eval.generate != EvalGenerate::None) {}

std::vector<std::string> inert_key_warnings(const RunConfig& cfg, int num_nodes) {
  std::vector<std::string> warnings;
  if (cfg.run.backend == BackendKind::Cpu) {
    if (cfg.fsdp.cpu_offload)
      warnings.push_back("warning: fsdp.cpu_offload = true does nothing on the CPU backend (its state is in host "
                         "memory and AdamW runs on the CPU already)");
    if (cfg.fsdp.activation_checkpointing)
      warnings.push_back("warning: fsdp.activation_checkpointing = true does nothing on the CPU backend (it keeps "
                         "every activation and recomputes none)");
    // The CUDA backend's own choices (the deck's `cuda` keys), set away from their defaults: the CPU backend runs
    // synchronously (no prefetch, one gathered block at a time, MPI without a timeout or streams), its attention
    // loops and a 128-token LM head. Offload's and FP8's keys are refused on the CPU, and the two above said apart.
    std::string cuda_only;
    for (const std::string& key_value :
         cuda_only_settings(cfg, {"fsdp.cpu_offload", "fsdp.activation_checkpointing", "fsdp.offload_dir",
                                  "fsdp.offload_accumulate", "fsdp.offload_root_update", "fsdp.offload_resident_gib",
                                  "model.fp8_linear", "model.fp8_keep_weights"}))
      cuda_only += (cuda_only.empty() ? "" : ", ") + key_value;
    if (!cuda_only.empty())
      warnings.push_back(concat("warning: ", cuda_only, " ", cuda_only.find(',') == std::string::npos ? "does" : "do",
                                " nothing on the CPU backend (they choose how the CUDA backend schedules and computes)"));
  }
  if (cfg.model.fp8_keep_weights && !model_family(cfg.model.arch).keeps_fp8_weights)
    warnings.push_back(concat("warning: model.fp8_keep_weights = true does nothing for model.arch = ", cfg.model.arch,
                              " (its blocks' backward quantizes the weights again; the Llama-style families keep "
                              "them)"));
  const ShardingStrategy s = cfg.fsdp.strategy;
  if (num_nodes == 1 && (s == ShardingStrategy::HybridShard || s == ShardingStrategy::HybridShardZero2))
    warnings.push_back(concat("warning: fsdp.strategy = ", strategy_name(s), " on one node is ",
                              s == ShardingStrategy::HybridShard ? "FULL_SHARD" : "SHARD_GRAD_OP",
                              " (one shard group of every rank, nothing to replicate across nodes; "
                              "dist.ranks_per_node emulates smaller nodes)"));
  return warnings;
}

std::unique_ptr<TrainRun> setup_run(const RunConfig& cfg, MPI_Comm comm, const TrainOptions& options) {
  auto run = std::make_unique<TrainRun>(cfg, comm, options);
  memory_reset_peak();
  if (run->echo) log_info(resolved_deck_ini(cfg));
  // Setup that can fail (run directory, data files): agreed on by every rank before any collective.
  run_collectively(comm, [&] { load_inputs(*run); });
  check_same_inputs(*run);
  broadcast_string(run->run_id, comm);
  run_collectively(comm, [&] { run->topo = make_topology(comm, cfg.dist.ranks_per_node); });
  // Ranks sharing a host split its cores between their BLAS threads.
  cpu_set_threads(cpu_default_threads(run->topo.host_ranks));

  run->micro = cfg.train.micro_batch_size;
  run->accum = cfg.grad_accum(run->world);
  run->sampler.emplace(run->train_set.size(), static_cast<size_t>(cfg.train.batch_size), cfg.train.seed,
                       cfg.train.shuffle);
  run->steps_per_epoch = static_cast<long>(run->sampler->steps_per_epoch());
  run->total_steps = run->steps_per_epoch * cfg.train.epochs;
  if (cfg.train.max_steps > 0) run->total_steps = std::min<long>(run->total_steps, cfg.train.max_steps);
  if (!run->resume_path.empty() && !cfg.checkpoint.load_weights_only) {
    // The checkpoint's step, read by rank 0 before any engine is built: a finished run of this
    // model stops here, once its checksums say the final checkpoint is intact. A damaged,
    // inconsistent or another run's one is left to load_start, which skips it under resume = auto
    // and resumes from the newest usable one.
    run_collectively(comm, [&] {
      if (run->rank != 0) return;
      try {
        CheckpointReader reader(run->resume_path);
        reader.require_intact();
        const CheckpointMeta& meta = reader.meta();
        check_same_model(run->resume_path, meta, *run);
        check_resume_fits(run->resume_path, meta, *run);
        if (const std::string w = resume_data_warning(run->resume_path, meta, *run); !w.empty()) log_info(w);
        run->resume_step = meta.step;
        run->total_steps = resumed_total_steps(meta, *run);
        if (meta.step >= run->total_steps) {
          const std::vector<std::string> damage = reader.verify();
          if (!damage.empty()) throw Error(damage.front());
        }
      } catch (const Error& e) {
        if (cfg.checkpoint.resume != ResumeFrom::Auto || !checkpoint_unusable(e.what())) throw;
        run->resume_step = -1;
      }
    });
    broadcast_value(run->resume_step, comm);
    broadcast_value(run->total_steps, comm);
    if (run->resume_step >= run->total_steps) {
      run->finished = true;
      return run;
    }
  }
  const Timer built;
  run->engine = make_engine_collectively(cfg, comm, run->topo, run->micro);
  const ModelConfig& mc = cfg.model;
  const FsdpMemory mem = run->engine->memory();
  // Building a large model takes a while (its initial values are drawn on the host, its buffers allocated):
  // said when it is long enough to notice.
  if (const double s = built.seconds(); s >= 5) {
    char text[96];
    std::snprintf(text, sizeof(text), "model built in %.1f s (%zu parameters)", s, mem.model_params);
    run->say(text);
  }
  // The attention's products are over the query width, heads x head_dim (hidden_size but for Qwen3's own head_dim).
  run->flops_per_token = model_flops_per_token(mem.model_params, mem.trainable_params, mc.num_layers,
                                               mc.num_heads * mc.head_dim(), cfg.data.max_length);
  // Every rank reads SHARDLM_GPU_PEAKS, so a malformed file ends them all with its message.
  run_collectively(comm, [&] {
    const char* peaks_file = std::getenv("SHARDLM_GPU_PEAKS");
    const Backend& backend = run->engine->backend();
    run->peak = resolve_mfu_peak(cfg.run.peak_tflops, backend.kind(), backend.device_name(), cfg.fsdp.param_dtype,
                                 peaks_file ? peaks_file : "");
  });

  report_shape(*run);
  report_memory(*run);
  return run;
}

namespace {

// The checkpoint a resumed run starts from. With resume = auto a newest checkpoint that is damaged,
// inconsistent or another run's (or a missing latest pointer) is skipped with a warning naming it
// and why, and the newest usable one is used: a requeued job neither fails for good nor silently
// starts afresh. Sets run.resume_path to it.
CheckpointMeta load_resume_checkpoint(TrainRun& run) {
  const RunConfig& cfg = run.cfg;
  std::vector<std::string> candidates{run.resume_path};
  if (cfg.checkpoint.resume == ResumeFrom::Auto) {
    std::string note;
    candidates = resume_candidates(cfg.checkpoint_dir(), &note);
    if (!note.empty()) run.say(concat("warning: ", note));
  }
  size_t foreign = 0;  // candidates skipped as another run's
  for (size_t i = 0; i < candidates.size(); ++i) {
    try {
      const bool weights_only = cfg.checkpoint.load_weights_only;
      CheckpointMeta meta = load_checkpoint(
          candidates[i], run.engine->checkpoint_state(), run.comm,
          [&](const CheckpointMeta& m) {
            if (weights_only) return;
            check_same_model(candidates[i], m, run);
            check_resume_fits(candidates[i], m, run);
          },
          weights_only);
      run.resume_path = candidates[i];
      return meta;
    } catch (const AgreedError& e) {
      if (cfg.checkpoint.resume != ResumeFrom::Auto || !checkpoint_unusable(e.what())) throw;
      if (checkpoint_of_another_run(e.what())) ++foreign;
      // (checkpoint.resume = none alone would not do: the folder still holds the checkpoints, see claim_run_folder.)
      if (i + 1 == candidates.size() && foreign == candidates.size())
        throw AgreedError(concat(e.what(), "; ", cfg.checkpoint_dir(), " holds no checkpoint of this run (run id ",
                                 run.run_id, "), only another run's: name one in checkpoint.resume to continue from "
                                 "it, or choose another checkpoint.dir for a new run"));
      if (i + 1 == candidates.size())
        throw AgreedError(concat(e.what(), "; no usable checkpoint is left in ", cfg.checkpoint_dir(),
                                 " (to start afresh: run.overwrite = true with checkpoint.resume = none replaces "
                                 "them, or choose another run.dir)"));
      // Every such message names the file.
      run.say(concat("warning: skipping ", checkpoint_damaged(e.what()) ? "a damaged checkpoint" : "a checkpoint",
                     ": ", e.what(), "; trying ", candidates[i + 1]));
    }
  }
  throw AgreedError(concat("checkpoint.resume: no checkpoint in ", cfg.checkpoint_dir()));
}

// After a resume: a run folder with no run id yet (made before they were kept) takes the
// checkpoint's, or a new one; a run resumed from another run's checkpoint (an explicit
// checkpoint.resume) keeps its own and says so.
void settle_run_id(TrainRun& run, const CheckpointMeta& meta) {
  if (run.run_id.empty()) {
    std::string id = meta.run_id.empty() ? new_run_id() : meta.run_id;
    broadcast_string(id, run.comm);  // rank 0's new id, if it made one
    run.run_id = id;
    run_collectively(run.comm, [&] {
      if (run.rank == 0) write_run_id(run.cfg.run.dir, run.run_id);
    });
    run.say(concat("run id ", run.run_id, meta.run_id.empty() ? " (new" : " (the checkpoint's", ": ",
                   run_id_path(run.cfg.run.dir), " had none)"));
  } else if (!meta.run_id.empty() && meta.run_id != run.run_id) {
    run.say(concat("note: ", run.resume_path, " is another run's checkpoint (run id ", meta.run_id,
                   "); this run keeps its id ", run.run_id, " (", run_id_path(run.cfg.run.dir), ")"));
  }
  if (meta.run_id.empty())
    run.say(concat("warning: ", run.resume_path, " was written before checkpoints kept their run id, global batch and "
                   "contents checksum: it could not be checked to be this run's (", run.run_id, ")"));
}

}  // namespace

void open_run_outputs(TrainRun& run) {
  run_collectively(run.comm, [&] {
    if (run.rank != 0) return;
    const RunConfig& cfg = run.cfg;
    const std::filesystem::path dir(cfg.run.dir), deck = dir / "deck.resolved.ini", metrics = dir / "metrics.jsonl";
    const bool fresh = run.resume_path.empty() || cfg.checkpoint.load_weights_only;
    const std::string aside = run.replacement.set_aside({deck, metrics, run_id_path(cfg.run.dir)});
    if (!aside.empty()) run.say(aside);
    // A resumed run's folder may hold the .tmp of a job killed mid-write: never latest's successor.
    const std::string unfinished = remove_unfinished_checkpoints(cfg.checkpoint_dir());
    if (!unfinished.empty()) run.say(unfinished);
    // A fresh run's (the earlier run's id went with it), or a new folder's resuming a checkpoint (load_inputs).
    if (fresh || (!run.run_id.empty() && read_run_id(cfg.run.dir).empty())) write_run_id(cfg.run.dir, run.run_id);
    replace_file(deck.string(), resolved_deck_ini(cfg), "resolved deck");
    run.metrics = MetricsWriter(metrics.string(), !run.resume_path.empty() && !cfg.checkpoint.load_weights_only);
    run.outputs_open = true;
    for (nlohmann::json& j : run.pending_records) run.metrics.write(j);
    run.pending_records.clear();
    // A new events file per start, a resume's beside the earlier ones (TensorBoard reads them as one run).
    if (cfg.run.tensorboard) run.tensorboard = std::make_unique<TensorBoardWriter>((dir / "tensorboard").string());
  });
}

TrainPosition load_start(TrainRun& run) {
  const RunConfig& cfg = run.cfg;
  TrainPosition pos;
  const bool fp16 = cfg.fsdp.param_dtype == DType::F16 || cfg.fsdp.reduce_dtype == DType::F16;
  pos.scaling = cfg.train.loss_scale > 0 || fp16;
  pos.loss_scale.value = pos.scaling ? (cfg.train.loss_scale > 0 ? cfg.train.loss_scale : 65536.0) : 1.0;
  FsdpEngine& model = *run.engine;
  // LoRA: the frozen base comes from model.dir (or stays the seeded initialisation) whether the run
  // resumes or not; checkpoints hold the adapters only.
  if (model.lora() && !cfg.model.dir.empty()) {
    const PretrainedLoad load = load_frozen_base(model, cfg.model.dir, cfg.train.seed, run.comm);
    run.say(concat("loaded the frozen base weights from ", cfg.model.dir, ": ", format_bytes(load.bytes_total),
                   " read by ", run.world, " rank(s) in ", load.seconds, " s"));
    run.record({{"type", "pretrained"}, {"dir", cfg.model.dir}, {"bytes", load.bytes_total},
                {"max_rank_bytes", load.bytes_max_rank}, {"seconds", load.seconds}, {"frozen", true}});
    if (run.resume_path.empty() && !cfg.model.lora.modules_to_save.empty()) {
      // The modules trained whole (lora.modules_to_save) start as the base's: the trainable root's slices.
      std::vector<UnitState> states = model.checkpoint_state();
      for (size_t u = 1; u < states.size(); ++u) states[u].count = 0;  // the blocks' adapters are not the model's
      load_pretrained(cfg.model.dir, states, run.comm);
      model.checkpoint_loaded();
      std::string names;
      for (const std::string& m : cfg.model.lora.modules_to_save) names += (names.empty() ? "" : ", ") + m;
      run.say(concat("loaded the modules trained whole (", names, ") from ", cfg.model.dir));
    }
  }
  if (model.lora()) run.base_checksum = frozen_base_checksum(model, run.comm);
  if (!run.resume_path.empty() && cfg.checkpoint.load_weights_only) {
    // Only the parameters: step, optimizer state, schedule and data position start afresh.
    const CheckpointMeta meta = load_resume_checkpoint(run);
    model.checkpoint_loaded();
    run.say(concat("loaded the weights of ", run.resume_path, " (step ", meta.step,
                   meta.run_id.empty() || meta.run_id == run.run_id ? "" : concat(" of run ", meta.run_id),
                   "; checkpoint.load_weights_only: a new run ", run.run_id,
                   " from step 0 with fresh optimizer state)"));
  } else if (!run.resume_path.empty()) {
    CheckpointMeta meta = load_resume_checkpoint(run);
    run.total_steps = resumed_total_steps(meta, run);  // (resume = auto may have taken an older one)
    model.set_optimizer_steps(meta.optimizer_steps);
    model.checkpoint_loaded();
    pos.step = meta.step;
    if (pos.scaling && meta.loss_scale > 0) pos.loss_scale.value = meta.loss_scale;
    pos.epoch = meta.epoch;
    pos.epoch_step = resumed_epoch_step(meta, run);
    run.say(concat("resumed from ", run.resume_path, ": step ", meta.step, ", epoch ", meta.epoch, " after ",
                   meta.epoch_step, " of its steps (written by ", meta.world_size, " rank(s), ", meta.strategy, ")"));
    settle_run_id(run, meta);
    if (pos.epoch_step != meta.epoch_step || (meta.global_batch > 0 && meta.global_batch != cfg.train.batch_size))
      run.say(concat("warning: checkpoint.allow_new_batch: ", run.resume_path, " was written with a global batch of ",
                     meta.global_batch, ", this run's is ", cfg.train.batch_size, ": its ", meta.epoch_step,
                     " steps of epoch ", meta.epoch, " are ", pos.epoch_step, " of this run's (",
                     meta.epoch_step * meta.global_batch, " examples, rounded down to whole batches)"));
    if (meta.tokenizer_hash.empty())
      run.say(concat("warning: ", run.resume_path, " was written before checkpoints kept their tokenizer's hash: "
                     "its tokenizer could not be compared with this run's (data.tokenizer = ",
                     tokenizer_text(cfg.data), ")"));
  } else if (!cfg.model.dir.empty() && !model.lora()) {
    const PretrainedLoad load = load_pretrained(cfg.model.dir, model.checkpoint_state(), run.comm);
    model.checkpoint_loaded();
    run.say(concat("loaded weights from ", cfg.model.dir, ": ", format_bytes(load.bytes_total), " read by ", run.world,
                   " rank(s) (at most ", format_bytes(load.bytes_max_rank), " by one) in ", load.seconds, " s"));
    run.record({{"type", "pretrained"}, {"dir", cfg.model.dir}, {"bytes", load.bytes_total},
                {"max_rank_bytes", load.bytes_max_rank}, {"seconds", load.seconds}});
  }
  if (run.resume_path.empty() && !cfg.model.adapter.empty()) {
    // A fresh run from a PEFT adapter.
    load_peft_adapter_slices(model, cfg.model.adapter, cfg.model, run.comm);
    run.say(concat("started from the adapter in ", cfg.model.adapter));
  }
  return pos;
}

}  // namespace shardlm
