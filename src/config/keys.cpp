// The table of deck keys: for each "section.key" its parser, its checks and its resolved text.
#include <filesystem>
#include <fstream>

#include "config_internal.hpp"

namespace shardlm::config_detail {

namespace fs = std::filesystem;

// Field accessor usable on a const or a mutable RunConfig.
#define SHARDLM_FIELD(path) [](auto& c) -> auto& { return c.path; }

template <typename F>
static KeySpec int_key(const char* name, F field, int min, const char* why_min,
                       const char* required = nullptr) {
  return {name, required,
          [=](RunConfig& c, const std::string& t, const std::string&) {
            field(c) = parse_int(name, t, min, why_min);
          },
          [=](const RunConfig& c) { return std::to_string(field(c)); }};
}

template <typename F>
static KeySpec unsigned_key(const char* name, F field) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string&) {
            field(c) = static_cast<std::remove_reference_t<decltype(field(c))>>(parse_unsigned(name, t));
          },
          [=](const RunConfig& c) { return std::to_string(field(c)); }};
}

// `why` returns the complaint for a parsed value, or nullptr when the value is fine.
template <typename F, typename Why>
static KeySpec double_key(const char* name, F field, Why why) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string&) {
            double v = parse_double(name, t);
            if (const char* w = why(v)) bad_value(name, t, w);
            field(c) = v;
          },
          [=](const RunConfig& c) { return format_double(field(c)); }};
}

template <typename F>
static KeySpec positive_float_key(const char* name, F field) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string&) {
            float v = parse_float(name, t);
            if (!(v > 0)) bad_value(name, t, "must be > 0");
            field(c) = v;
          },
          [=](const RunConfig& c) { return format_float(field(c)); }};
}

// A lowercase word out of a fixed list; the canonical spelling is the list's.
template <typename F>
static KeySpec choice_key(const char* name, F field, std::vector<std::string> choices) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string&) {
            std::string v = lower(trim(t));
            for (const std::string& ch : choices)
              if (v == ch) return void(field(c) = ch);
            bad_value(name, quoted(t), choice_list(choices));
          },
          [=](const RunConfig& c) { return field(c); }};
}

// A lowercase word naming one of `values` (their names as `value_name` spells them), stored as the enum.
template <typename F, typename E>
static KeySpec enum_key(const char* name, F field, std::vector<E> values, const char* (*value_name)(E)) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string&) {
            const std::string v = lower(trim(t));
            std::vector<std::string> names;
            for (E e : values) {
              if (v == value_name(e)) return void(field(c) = e);
              names.emplace_back(value_name(e));
            }
            bad_value(name, quoted(t), choice_list(names));
          },
          [=](const RunConfig& c) { return std::string(value_name(field(c))); }};
}

template <typename F>
static KeySpec dtype_key(const char* name, F field) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string&) {
            try {
              field(c) = parse_dtype(lower(trim(t)));
            } catch (const Error&) {
              bad_value(name, quoted(t), "must be fp32, bf16 or fp16");
            }
          },
          [=](const RunConfig& c) { return std::string(dtype_name(field(c))); }};
}

static KeySpec strategy_key(const char* name) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string&) {
            try {
              c.fsdp.strategy = parse_strategy(trim(t));
            } catch (const Error&) {
              bad_value(name, quoted(t), "must be FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, HYBRID_SHARD_ZERO2 or NO_SHARD");
            }
          },
          [](const RunConfig& c) { return std::string(strategy_name(c.fsdp.strategy)); }};
}

// A data file: stored absolute and normalised; it must exist and be readable now, so a typo
// fails at start-up on every rank rather than after the model is built.
static void check_data_file(const char* name, const std::string& text, const std::string& abs) {
  std::string where = text == abs ? "" : concat(" (looked for '", abs, "')");
  std::error_code ec;
  const fs::file_status st = fs::status(abs, ec);
  if (!fs::exists(st)) bad_value(name, quoted(text), "file not found" + where);
  if (fs::is_directory(st)) bad_value(name, quoted(text), "is a directory, not a file" + where);
  // Opening a pipe would wait for a writer, and a device need not end: neither is opened.
  const fs::file_type type = st.type();
  if (type != fs::file_type::regular)
    bad_value(name, quoted(text),
              concat("is ", type == fs::file_type::fifo ? "a pipe (FIFO)" : type == fs::file_type::socket ? "a socket"
                            : type == fs::file_type::character || type == fs::file_type::block ? "a device"
                                                                                                : "not a regular file",
                     ", not a regular file", where));
  std::ifstream f(abs, std::ios::binary);
  if (!f) bad_value(name, quoted(text), "file cannot be opened, check its permissions" + where);
}

template <typename F>
static KeySpec path_key(const char* name, F field, const char* required = nullptr) {
  return {name, required,
          [=](RunConfig& c, const std::string& t, const std::string& base_dir) {
            std::string v = trim(t);
            if (v.empty()) return void(field(c).clear());  // an empty eval_file means "no evaluation"
            fs::path p = fs::path(base_dir) / fs::path(v);  // an absolute v replaces base_dir
            std::string abs = fs::absolute(p).lexically_normal().string();
            check_data_file(name, v, abs);
            field(c) = abs;
          },
          [=](const RunConfig& c) { return field(c); }};
}

static KeySpec dir_key(const char* name) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string&) {
            std::string v = trim(t);
            if (v.empty()) bad_value(name, quoted(t), "must not be empty");
            c.run.dir = v;
          },
          [](const RunConfig& c) { return c.run.dir; }};
}

// Free text kept as written (trimmed); relative paths stay relative to the current folder.
template <typename F>
static KeySpec text_key(const char* name, F field) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string&) { field(c) = trim(t); },
          [=](const RunConfig& c) { return field(c); }};
}

template <typename F>
static KeySpec flag_key(const char* name, F field) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string&) { field(c) = parse_bool(name, t); },
          [=](const RunConfig& c) { return std::string(field(c) ? "true" : "false"); }};
}

// A folder of a known kind, relative to the deck's folder: it must hold each of `files` ("has no
// FILE (KIND is expected)" otherwise). model.dir: a Hugging Face model directory, whose config.json
// then gives the model's shape; model.adapter: a PEFT adapter directory.
template <typename F>
static KeySpec folder_key(const char* name, F field, std::vector<std::string> files, const char* kind) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string& base_dir) {
            std::string v = trim(t);
            if (v.empty()) return void(field(c).clear());
            const std::string abs = fs::absolute(fs::path(base_dir) / fs::path(v)).lexically_normal().string();
            std::error_code ec;
            if (!fs::is_directory(abs, ec)) bad_value(name, quoted(t), "is not a directory (" + abs + ")");
            for (const std::string& f : files)
              if (!fs::exists(fs::path(abs) / f, ec)) bad_value(name, quoted(t), concat("has no ", f, " (", kind, " is expected)"));
            field(c) = abs;
          },
          [=](const RunConfig& c) { return field(c); }};
}

// Comma-separated module names, kept as written until the model's family resolves them (lora.cpp).
template <typename F>
static KeySpec names_key(const char* name, F field) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string&) { field(c) = split_names(name, t); },
          [=](const RunConfig& c) { return join_names(field(c)); }};
}

// A key of [lora]: the resolved deck holds it only when LoRA is on (an absent [lora] is LoRA off).
static KeySpec lora_key(KeySpec k) {
  k.written = [](const RunConfig& c) { return c.model.lora.enabled(); };
  return k;
}

// "auto" (model.dir's tokenizer.json, else byte), "byte", or a tokenizer.json file or a folder
// holding one, relative to the deck's folder.
static KeySpec tokenizer_key(const char* name) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string& base_dir) {
            const std::string v = trim(t);
            const std::string l = lower(v);
            c.data.tokenizer_file.clear();
            if (l == "auto") return void(c.data.tokenizer = TokenizerSource::Auto);
            if (l == "byte") return void(c.data.tokenizer = TokenizerSource::Byte);
            if (v.empty()) bad_value(name, quoted(t), "must be auto, byte or a tokenizer.json path");
            fs::path p = fs::absolute(fs::path(base_dir) / fs::path(v)).lexically_normal();
            std::error_code ec;
            if (fs::is_directory(p, ec)) p /= "tokenizer.json";
            if (!fs::exists(p, ec))
              bad_value(name, quoted(t), "file not found (" + p.string() + "); expected a tokenizer.json or a folder holding one");
            c.data.tokenizer = TokenizerSource::File;
            c.data.tokenizer_file = p.string();
          },
          [](const RunConfig& c) { return tokenizer_text(c.data); }};
}

// "none", "auto" or a path; whether the path exists is checked when the run resumes.
static KeySpec resume_key(const char* name) {
  return {name, nullptr,
          [=](RunConfig& c, const std::string& t, const std::string&) {
            std::string v = trim(t);
            if (v.empty()) bad_value(name, quoted(t), "must be none, auto or a checkpoint path");
            std::string l = lower(v);
            c.checkpoint.resume = l == "none" ? ResumeFrom::None : l == "auto" ? ResumeFrom::Auto : ResumeFrom::Path;
            c.checkpoint.resume_path = c.checkpoint.resume == ResumeFrom::Path ? v : "";
          },
          [](const RunConfig& c) { return resume_text(c.checkpoint); }};
}

static const char* positive(double v) { return v > 0 ? nullptr : "must be > 0"; }
static const char* non_negative(double v) { return v >= 0 ? nullptr : "must be >= 0"; }
static const char* unit_interval(double v) { return v >= 0 && v < 1 ? nullptr : "must be in [0, 1)"; }
static const char* unit_closed(double v) { return v >= 0 && v <= 1 ? nullptr : "must be in [0, 1]"; }

static std::vector<KeySpec> build_table() {
  return {
      choice_key("model.arch", SHARDLM_FIELD(model.arch), model_family_names()),
      int_key("model.vocab_size", SHARDLM_FIELD(model.vocab_size), 1, "must be > 0", "N"),
      int_key("model.hidden_size", SHARDLM_FIELD(model.hidden_size), 1, "must be > 0", "N"),
      int_key("model.num_layers", SHARDLM_FIELD(model.num_layers), 1, "must be > 0", "N"),
      int_key("model.num_heads", SHARDLM_FIELD(model.num_heads), 1, "must be > 0", "N"),
      positive_float_key("model.layer_norm_eps", SHARDLM_FIELD(model.layer_norm_eps)),
      positive_float_key("model.init_std", SHARDLM_FIELD(model.init_std)),
      int_key("model.num_kv_heads", SHARDLM_FIELD(model.num_kv_heads), 0, "must be >= 0 (0 = num_heads)"),
      int_key("model.intermediate_size", SHARDLM_FIELD(model.intermediate_size), 0,
              "must be >= 0 (0 = 4 x hidden_size)"),
      int_key("model.head_dim", SHARDLM_FIELD(model.head_size), 0, "must be >= 0 (0 = hidden_size / num_heads)"),
      int_key("model.sliding_window", SHARDLM_FIELD(model.sliding_window), 0,
              "must be >= 0 (0 = no window: every earlier key)"),
      positive_float_key("model.rms_norm_eps", SHARDLM_FIELD(model.rms_norm_eps)),
      positive_float_key("model.rope_theta", SHARDLM_FIELD(model.rope_theta)),
      flag_key("model.tie_word_embeddings", SHARDLM_FIELD(model.tie_word_embeddings)),
      enum_key("model.attention", SHARDLM_FIELD(model.attention),
               {AttentionImpl::Auto, AttentionImpl::Cudnn, AttentionImpl::Native}, attention_impl_name),
      int_key("model.head_chunk_tokens", SHARDLM_FIELD(model.head_chunk_tokens), 0,
              "must be >= 0 (0 = 2048, 512 with fsdp.cpu_offload)"),
      folder_key("model.dir", SHARDLM_FIELD(model.dir), {"config.json"}, "a Hugging Face model directory"),
      folder_key("model.adapter", SHARDLM_FIELD(model.adapter), {"adapter_config.json", "adapter_model.safetensors"},
                 "a PEFT adapter directory"),

      lora_key(int_key("lora.r", SHARDLM_FIELD(model.lora.r), 1, "must be >= 1")),
      lora_key(double_key("lora.alpha", SHARDLM_FIELD(model.lora.alpha), positive)),
      lora_key(double_key("lora.dropout", SHARDLM_FIELD(model.lora.dropout), unit_interval)),
      lora_key(names_key("lora.target_modules", SHARDLM_FIELD(model.lora.target_modules))),
      lora_key(names_key("lora.modules_to_save", SHARDLM_FIELD(model.lora.modules_to_save))),
      lora_key(flag_key("lora.use_rslora", SHARDLM_FIELD(model.lora.use_rslora))),
      lora_key(enum_key("lora.init", SHARDLM_FIELD(model.lora.init), {LoraInit::Kaiming, LoraInit::Gaussian},
                        lora_init_name)),

      enum_key("data.format", SHARDLM_FIELD(data.format),
               {DataFormat::Squad, DataFormat::Jsonl, DataFormat::Chess, DataFormat::Chat}, data_format_name),
      enum_key("data.chat_format", SHARDLM_FIELD(data.chat_format),
               {ChatFormat::Auto, ChatFormat::Messages, ChatFormat::Sharegpt, ChatFormat::Alpaca}, chat_format_name),
      path_key("data.chat_template", SHARDLM_FIELD(data.chat_template)),
      flag_key("data.train_on_prompt", SHARDLM_FIELD(data.train_on_prompt)),
      path_key("data.train_file", SHARDLM_FIELD(data.train_file), "PATH"),
      path_key("data.eval_file", SHARDLM_FIELD(data.eval_file)),
      int_key("data.max_length", SHARDLM_FIELD(data.max_length), 8, "must be >= 8"),
      flag_key("data.packing", SHARDLM_FIELD(data.packing)),
      unsigned_key("data.train_size", SHARDLM_FIELD(data.train_size)),
      unsigned_key("data.eval_size", SHARDLM_FIELD(data.eval_size)),
      tokenizer_key("data.tokenizer"),

      int_key("train.epochs", SHARDLM_FIELD(train.epochs), 1, "must be >= 1"),
      int_key("train.batch_size", SHARDLM_FIELD(train.batch_size), 1, "must be >= 1", "N"),
      int_key("train.micro_batch_size", SHARDLM_FIELD(train.micro_batch_size), 1, "must be >= 1"),
      double_key("train.lr", SHARDLM_FIELD(train.lr), positive),
      double_key("train.weight_decay", SHARDLM_FIELD(train.weight_decay), non_negative),
      int_key("train.warmup_steps", SHARDLM_FIELD(train.warmup_steps), 0, "must be >= 0"),
      double_key("train.warmup_ratio", SHARDLM_FIELD(train.warmup_ratio), unit_closed),
      enum_key("train.optim", SHARDLM_FIELD(train.optim), {Optim::AdamWTorch, Optim::AdamW8bit}, optim_name),
      enum_key("train.lr_schedule", SHARDLM_FIELD(train.lr_schedule),
               {LrSchedule::Linear, LrSchedule::Constant, LrSchedule::ConstantWithWarmup, LrSchedule::Cosine,
                LrSchedule::CosineWithRestarts, LrSchedule::Polynomial, LrSchedule::CosineWithMinLr},
               lr_schedule_name),
      double_key("train.lr_num_cycles", SHARDLM_FIELD(train.lr_num_cycles), non_negative),
      double_key("train.lr_power", SHARDLM_FIELD(train.lr_power), positive),
      double_key("train.lr_end", SHARDLM_FIELD(train.lr_end), non_negative),
      double_key("train.min_lr_ratio", SHARDLM_FIELD(train.min_lr_ratio), unit_closed),
      double_key("train.adam_beta1", SHARDLM_FIELD(train.adam_beta1), unit_interval),
      double_key("train.adam_beta2", SHARDLM_FIELD(train.adam_beta2), unit_interval),
      double_key("train.adam_eps", SHARDLM_FIELD(train.adam_eps), positive),
      double_key("train.max_grad_norm", SHARDLM_FIELD(train.max_grad_norm), non_negative),
      double_key("train.loss_scale", SHARDLM_FIELD(train.loss_scale), non_negative),
      unsigned_key("train.seed", SHARDLM_FIELD(train.seed)),
      flag_key("train.shuffle", SHARDLM_FIELD(train.shuffle)),
      int_key("train.log_every", SHARDLM_FIELD(train.log_every), 1, "must be >= 1"),
      int_key("train.max_steps", SHARDLM_FIELD(train.max_steps), 0, "must be >= 0"),
      int_key("train.early_stopping_patience", SHARDLM_FIELD(train.early_stopping_patience), 0,
              "must be >= 0 (0 = no early stopping)"),
      double_key("train.early_stopping_threshold", SHARDLM_FIELD(train.early_stopping_threshold), non_negative),

      strategy_key("fsdp.strategy"),
      dtype_key("fsdp.param_dtype", SHARDLM_FIELD(fsdp.param_dtype)),
      dtype_key("fsdp.reduce_dtype", SHARDLM_FIELD(fsdp.reduce_dtype)),
      flag_key("fsdp.activation_checkpointing", SHARDLM_FIELD(fsdp.activation_checkpointing)),
      flag_key("fsdp.cpu_offload", SHARDLM_FIELD(fsdp.cpu_offload)),
      text_key("fsdp.offload_dir", SHARDLM_FIELD(fsdp.offload_dir)),
      enum_key("fsdp.offload_accumulate", SHARDLM_FIELD(fsdp.offload_accumulate),
               {OffloadAccumulate::Host, OffloadAccumulate::Device}, offload_accumulate_name),
      enum_key("fsdp.offload_root_update", SHARDLM_FIELD(fsdp.offload_root_update),
               {OffloadRootUpdate::Auto, OffloadRootUpdate::Host, OffloadRootUpdate::Device}, offload_root_update_name),
      double_key("fsdp.offload_resident_gib", SHARDLM_FIELD(fsdp.offload_resident_gib), non_negative),
      enum_key("fsdp.root_reduction", SHARDLM_FIELD(fsdp.root_reduction),
               {RootReduction::Auto, RootReduction::Split, RootReduction::Whole}, root_reduction_name),
      enum_key("fsdp.no_sync", SHARDLM_FIELD(fsdp.no_sync), {NoSync::Auto, NoSync::Off, NoSync::Replicate, NoSync::Full},
               no_sync_name),
      flag_key("fsdp.forward_prefetch", SHARDLM_FIELD(fsdp.forward_prefetch)),
      enum_key("fsdp.backward_prefetch", SHARDLM_FIELD(fsdp.backward_prefetch),
               {BackwardPrefetch::Pre, BackwardPrefetch::Post, BackwardPrefetch::None}, backward_prefetch_name),
      int_key("fsdp.limit_all_gathers", SHARDLM_FIELD(fsdp.limit_all_gathers), 1, "must be >= 1"),

      enum_key("eval.generate", SHARDLM_FIELD(eval.generate), {EvalGenerate::End, EvalGenerate::Epoch, EvalGenerate::None},
               eval_generate_name),
      int_key("eval.max_new_tokens", SHARDLM_FIELD(eval.max_new_tokens), 1, "must be >= 1"),
      int_key("eval.batch_size", SHARDLM_FIELD(eval.batch_size), 0, "must be >= 0 (0 = train.micro_batch_size)"),
      int_key("eval.every_steps", SHARDLM_FIELD(eval.every_steps), 0, "must be >= 0 (0 = after each epoch only)"),

      int_key("dist.ranks_per_node", SHARDLM_FIELD(dist.ranks_per_node), 0, "must be >= 0"),
      double_key("dist.timeout", SHARDLM_FIELD(dist.timeout), positive),

      text_key("checkpoint.dir", SHARDLM_FIELD(checkpoint.dir)),
      int_key("checkpoint.every", SHARDLM_FIELD(checkpoint.every), 0, "must be >= 0"),
      int_key("checkpoint.keep_last", SHARDLM_FIELD(checkpoint.keep_last), 0, "must be >= 0"),
      resume_key("checkpoint.resume"),
      flag_key("checkpoint.at_end", SHARDLM_FIELD(checkpoint.at_end)),
      flag_key("checkpoint.collective_buffering", SHARDLM_FIELD(checkpoint.collective_buffering)),
      flag_key("checkpoint.load_weights_only", SHARDLM_FIELD(checkpoint.load_weights_only)),
      flag_key("checkpoint.allow_new_batch", SHARDLM_FIELD(checkpoint.allow_new_batch)),
      enum_key("checkpoint.keep_best", SHARDLM_FIELD(checkpoint.keep_best), {KeepBest::None, KeepBest::EvalLoss},
               keep_best_name),
      flag_key("checkpoint.every_epoch", SHARDLM_FIELD(checkpoint.every_epoch)),

      dir_key("run.dir"),
      enum_key("run.backend", SHARDLM_FIELD(run.backend), {BackendKind::Cpu, BackendKind::Cuda}, backend_name),
      double_key("run.peak_tflops", SHARDLM_FIELD(run.peak_tflops), non_negative),
      flag_key("run.overwrite", SHARDLM_FIELD(run.overwrite)),
      int_key("run.trace_step", SHARDLM_FIELD(run.trace_step), 0, "must be >= 0 (0 = no timeline)"),
      flag_key("run.tensorboard", SHARDLM_FIELD(run.tensorboard)),
      flag_key("run.smoke", SHARDLM_FIELD(run.smoke)),
  };
}

#undef SHARDLM_FIELD

const std::vector<KeySpec>& key_table() {
  static const std::vector<KeySpec> table = build_table();
  return table;
}

}  // namespace shardlm::config_detail
