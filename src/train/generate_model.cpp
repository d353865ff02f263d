// load_generation_model: the deck of a checkpoint or a model folder, the engine over the world and
// the weights (whole, or LoRA's frozen base and adapters) for `shardlm generate`.
#include "generate_model.hpp"

#include <filesystem>
#include <sstream>

#include "engine.hpp"
#include "shardlm/device.hpp"
#include "shardlm/dist.hpp"
#include "shardlm/io.hpp"
#include "train_checkpoint.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

// A deck as INI text from "section.key" -> value.
std::string deck_text(const std::map<std::string, std::string>& values) {
  std::ostringstream out;
  std::string section;
  for (const auto& [name, value] : values) {
    const size_t dot = name.find('.');
    if (name.substr(0, dot) != section) out << '[' << (section = name.substr(0, dot)) << "]\n";
    out << name.substr(dot + 1) << " = " << value << '\n';
  }
  return out.str();
}

// What the checkpoint says of itself, read on rank 0 and given to every rank.
struct CheckpointFacts {
  std::string deck, lora, base_checksum;
  long step = 0;
};

CheckpointFacts read_checkpoint_facts(const std::string& path, MPI_Comm comm) {
  const int rank = rank_of(comm);
  CheckpointFacts facts;
  run_collectively(comm, [&] {
    if (rank != 0) return;
    CheckpointReader reader(path);
    reader.require_intact();
    facts.deck = reader.meta().deck;
    facts.lora = reader.meta().lora;
    facts.base_checksum = reader.meta().base_checksum;
    facts.step = reader.meta().step;
    SHARDLM_CHECK(!facts.deck.empty(), "checkpoint ", path, " keeps no deck: it cannot say which model and tokenizer "
                  "it was trained with");
  });
  broadcast_string(facts.deck, comm);
  broadcast_string(facts.lora, comm);
  broadcast_string(facts.base_checksum, comm);
  broadcast_value(facts.step, comm);
  return facts;
}

// Whether the command line's deck overrides set `key` ("--section.key=value" or "--section.key value").
bool overrides_set(const std::vector<std::string>& overrides, const std::string& key) {
  for (const std::string& o : overrides)
    if (o == "--" + key || o.rfind("--" + key + "=", 0) == 0) return true;
  return false;
}

}  // namespace

std::string generation_source_kind(const std::string& path, std::string* checkpoint) {
  std::error_code ec;
  SHARDLM_CHECK(fs::exists(path, ec), "MODEL '", path, "' does not exist");
  if (fs::is_regular_file(path, ec)) {
    *checkpoint = path;
    return "checkpoint";
  }
  const fs::path dir(path);
  if (fs::is_regular_file(dir / "config.json", ec)) return "model";
  // A checkpoint folder, or a run folder (run_checkpoint_folder).
  if (fs::exists(dir / "latest", ec) || fs::exists(fs::path(run_checkpoint_folder(path)) / "latest", ec)) {
    *checkpoint = resolve_checkpoint_path(path, "shardlm generate MODEL");
    return "checkpoint";
  }
  throw Error(concat("MODEL '", path, "' is neither a checkpoint (.h5, or a folder with a 'latest' file), "
                     "a run folder with checkpoints, nor a Hugging Face model folder (config.json)"));
}

GenerationModel load_generation_model(const std::string& path, const std::string& adapter,
                                      const std::vector<std::string>& overrides, bool text_prompt, MPI_Comm comm) {
  const int world = size_of(comm);
  GenerationModel g;
  std::string kind;
  run_collectively(comm, [&] { kind = generation_source_kind(path, &g.checkpoint); });
  CheckpointFacts facts;
  std::map<std::string, std::string> deck;
  if (kind == "checkpoint") {
    run_collectively(comm, [&] {
      SHARDLM_CHECK(adapter.empty(), "--adapter: ", path, " is a checkpoint, which holds its own "
                    "weights (a LoRA run's checkpoint its adapters); --adapter goes with a model folder");
    });
    facts = read_checkpoint_facts(g.checkpoint, comm);
    run_collectively(comm, [&] { deck = ini_values(facts.deck, concat("the deck of checkpoint ", g.checkpoint)); });
    // Checkpoints of model.dir runs written before the resolved deck kept the shape as comments: the folder's
    // config.json gives it, as in training.
    if (!deck["model.dir"].empty())
      for (auto it = deck.begin(); it != deck.end();)
        it = is_model_shape_key(it->first) ? deck.erase(it) : std::next(it);
    // The weights come from the checkpoint: a run's own start (its adapter) and position do not apply.
    deck["model.adapter"] = "";
    deck["checkpoint.resume"] = "none";
    deck["dist.ranks_per_node"] = "0";
  } else {
    deck["model.dir"] = fs::absolute(path).lexically_normal().string();
    // A folder without a tokenizer takes ids only (--prompt-ids): the byte tokenizer would encode a text prompt
    // and decode the answer in another vocabulary than the model's, in silence.
    std::error_code ec;
    if (!fs::exists(fs::path(path) / "tokenizer.json", ec) && !overrides_set(overrides, "data.tokenizer")) {
      run_collectively(comm, [&] {
        SHARDLM_CHECK(!text_prompt, missing_tokenizer_message(deck["model.dir"]),
                      " (--data.tokenizer=PATH), or give the prompt as token ids with --prompt-ids");
      });
      deck["data.tokenizer"] = "byte";
      g.ids_only = true;
    }
    if (!adapter.empty()) deck["model.adapter"] = fs::absolute(adapter).lexically_normal().string();
  }
  // One sequence a rank at a time; any world divides that batch.
  deck["train.batch_size"] = std::to_string(world);
  deck["train.micro_batch_size"] = "1";
  const std::string where = kind == "checkpoint" ? concat("the deck of checkpoint ", g.checkpoint) : path;
  run_collectively(comm, [&] {
    g.cfg = load_run_config_text(deck_text(deck), where, fs::current_path().string(), overrides, world, false);
  });
  const RunConfig& cfg = g.cfg;
  run_collectively(comm, [&] {
    if (kind == "checkpoint")
      SHARDLM_CHECK(facts.lora.empty() != cfg.model.lora.enabled(), "checkpoint ", g.checkpoint,
                    facts.lora.empty() ? " holds a whole model, but the overrides ask for LoRA adapters"
                                       : " holds LoRA adapters, but the overrides leave [lora] off");
    else
      SHARDLM_CHECK(!cfg.model.lora.enabled() || !cfg.model.adapter.empty(), "[lora] is set but no --adapter is "
                    "given: the adapters would be untrained (give --adapter DIR, a PEFT adapter folder)");
  });

  const Topology topo = [&] {
    Topology t;
    run_collectively(comm, [&] { t = make_topology(comm, cfg.dist.ranks_per_node); });
    return t;
  }();
  cpu_set_threads(cpu_default_threads(topo.host_ranks));
  g.engine = make_engine_collectively(cfg, comm, topo, 1);
  FsdpEngine& engine = *g.engine;
  if (engine.lora() && !cfg.model.dir.empty()) load_frozen_base(engine, cfg.model.dir, cfg.train.seed, comm);
  if (kind == "checkpoint") {
    if (engine.lora() && !facts.base_checksum.empty()) {
      // The base's checksum is of its values in the compute dtype: comparable on the run's backend and dtype.
      const std::string sum = frozen_base_checksum(engine, comm);
      const std::map<std::string, std::string> run = ini_values(facts.deck, where);
      const bool same_compute = run.count("run.backend") && run.at("run.backend") == backend_name(cfg.run.backend) &&
                                run.count("fsdp.param_dtype") && run.at("fsdp.param_dtype") == dtype_name(cfg.fsdp.param_dtype);
      if (same_compute && sum != facts.base_checksum)
        throw AgreedError(concat("checkpoint ", g.checkpoint, ": its adapters were trained on other base weights "
                                 "(checksum ", facts.base_checksum, ") than those of ",
                                 cfg.model.dir.empty() ? std::string("the seeded initialisation") : cfg.model.dir, " (",
                                 sum, ")"));
    }
    load_checkpoint(
        g.checkpoint, engine.checkpoint_state(), comm,
        [&](const CheckpointMeta& meta) {
          const std::string diff = model_config_difference(meta.model, cfg.model);
          SHARDLM_CHECK(diff.empty(), "checkpoint ", g.checkpoint, " holds another model than its deck now describes: ",
                        diff);
        },
        true);
    engine.checkpoint_loaded();
    g.description = concat("checkpoint ", g.checkpoint, " (step ", facts.step, engine.lora() ? ", LoRA adapters on " : "",
                           engine.lora() ? (cfg.model.dir.empty() ? std::string("the seeded base") : cfg.model.dir) : "",
                           ")");
  } else if (engine.lora()) {
    load_peft_adapter_slices(engine, cfg.model.adapter, cfg.model, comm);
    g.description = concat(cfg.model.dir, " with the adapter ", cfg.model.adapter);
  } else {
    load_pretrained(cfg.model.dir, engine.checkpoint_state(), comm);
    engine.checkpoint_loaded();
    g.description = cfg.model.dir;
  }
  return g;
}

}  // namespace shardlm
