// The [model] section's keys and the checks between the model's shape keys.
// Adding a key: keys.cpp's first lines.
#include "key_builders.hpp"

namespace shardlm::config_detail {

// Partial rotary and LongRoPE: only for a family that takes them (Phi-3), with factors for its rotary dimension.
static void check_rotary_options(const ModelConfig& m, const ModelFamily& family) {
  const LongRope& lr = m.longrope;
  const bool set = m.partial_rotary_factor != 1.0 || lr.enabled() || !lr.long_factor.empty() ||
                   lr.original_max_position_embeddings != 0 || lr.attention_factor != 0;
  if (set && !family.rotary_options) {
    std::string takes;
    for (const ModelFamily* f : model_families())
      if (f->rotary_options) takes += (takes.empty() ? "" : ", ") + f->name;
    bad_value(m.partial_rotary_factor != 1.0 ? "model.partial_rotary_factor" : "model.longrope_short_factor",
              m.partial_rotary_factor != 1.0 ? format_double(m.partial_rotary_factor) : "...",
              concat("applies to the families with partial rotary and LongRoPE (", takes, "), not ", m.arch));
  }
  if (!set) return;
  const int half = static_cast<int>(m.head_dim() * m.partial_rotary_factor) / 2;
  if (2 * half != static_cast<int>(m.head_dim() * m.partial_rotary_factor) || half < 1)
    bad_value("model.partial_rotary_factor", format_double(m.partial_rotary_factor),
              concat("gives ", static_cast<int>(m.head_dim() * m.partial_rotary_factor), " rotary dimensions of the head's ",
                     m.head_dim(), "; they must be even and at least 2"));
  const bool any = lr.enabled() || !lr.long_factor.empty() || lr.original_max_position_embeddings != 0;
  if (!any) return;
  if (static_cast<int>(lr.short_factor.size()) != half || static_cast<int>(lr.long_factor.size()) != half)
    bad_value("model.longrope_short_factor", std::to_string(lr.short_factor.size()) + " values",
              concat("model.longrope_short_factor and model.longrope_long_factor need one value per rotary frequency, ",
                     half, " each (they have ", lr.short_factor.size(), " and ", lr.long_factor.size(), ")"));
  if (lr.original_max_position_embeddings <= 0)
    bad_value("model.longrope_original_max_position_embeddings", std::to_string(lr.original_max_position_embeddings),
              "must be > 0 with the LongRoPE factors");
}

// A fraction of the head that rotates: (0, 1].
constexpr Range kRotaryFraction{"in (0, 1]", [](double v) { return v > 0 && v <= 1; }};

// Comma-separated positive floats (LongRoPE's factors); empty for none.
template <typename F>
KeySpec float_list_key(const char* name, F field) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) {
              std::vector<float> values;
              std::string rest = trim(t);
              while (!rest.empty()) {
                const size_t comma = rest.find(',');
                const std::string item = trim(rest.substr(0, comma));
                const float v = parse_float(name, item);
                if (!(v > 0)) bad_value(name, t, "every value must be > 0");
                values.push_back(v);
                rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
              }
              field(c) = values;
            },
            [=](const RunConfig& c) {
              std::string text;
              for (float v : field(c)) text += (text.empty() ? "" : ", ") + format_float(v);
              return text;
            }};
  k.type = "floats > 0, comma-separated";
  return k;
}

// The shape keys against each other and the model's family.
static void check_model(const RunConfig& cfg, int) {
  const ModelConfig& m = cfg.model;
  if (m.head_size == 0 && m.hidden_size % m.num_heads != 0)
    bad_value("model.num_heads", std::to_string(m.num_heads),
              concat("hidden_size (", m.hidden_size, ") is not divisible by it"));
  const ModelFamily& family = model_family(m.arch);
  if (m.head_size != 0 && !family.grouped_query)
    bad_value("model.head_dim", std::to_string(m.head_size),
              concat("applies to the Llama-style families, not ", m.arch));
  // The Llama-style layer's keys would do nothing in another family (BLOOM: one key/value head a query head, a
  // 4 x hidden GELU MLP, LayerNorm, ALiBi, a tied head): refused unless left at their defaults.
  if (!family.grouped_query) {
    const ModelConfig d;
    const std::pair<const char*, std::string> llama_keys[] = {
        {"model.num_kv_heads", m.num_kv_heads != d.num_kv_heads ? std::to_string(m.num_kv_heads) : ""},
        {"model.intermediate_size",
         m.intermediate_size != d.intermediate_size ? std::to_string(m.intermediate_size) : ""},
        {"model.rms_norm_eps", m.rms_norm_eps != d.rms_norm_eps ? format_float(m.rms_norm_eps) : ""},
        {"model.tie_word_embeddings", m.tie_word_embeddings != d.tie_word_embeddings ? "true" : ""}};
    for (const auto& [key, value] : llama_keys)
      if (!value.empty()) bad_value(key, value, concat("applies to the Llama-style families, not ", m.arch));
  }
  if (!family.rotary && m.rope_theta != ModelConfig().rope_theta)
    bad_value("model.rope_theta", format_float(m.rope_theta),
              concat("applies to the families with rotary positions, not ", m.arch));
  if (m.sliding_window != 0 && !family.sliding_window) {
    std::string windowed;
    for (const ModelFamily* f : model_families())
      if (f->sliding_window) windowed += (windowed.empty() ? "" : ", ") + f->name;
    bad_value("model.sliding_window", std::to_string(m.sliding_window),
              concat("applies to the families with sliding-window attention (", windowed, "), not ", m.arch));
  }
  // config.json (checkpoints, export) has no local layer without a window: transformers' Gemma 3 takes none.
  if (family.local_global_layers && m.sliding_window == 0 && m.sliding_window_pattern != 1)
    bad_value("model.sliding_window", "0",
              concat(m.arch, "'s local layers need a window (Gemma 3 1B: 512), or sliding_window_pattern = 1 for "
                     "global layers only; sliding_window_pattern = ", m.sliding_window_pattern,
                     m.sliding_window_pattern == 0 ? " makes every layer local" : " makes local layers"));
  if (!family.local_global_layers) {
    const std::pair<const char*, double> gemma_keys[] = {{"model.sliding_window_pattern", m.sliding_window_pattern},
                                                         {"model.rope_local_theta", m.rope_local_theta},
                                                         {"model.rope_linear_factor", m.rope_linear_factor},
                                                         {"model.query_pre_attn_scalar", m.query_pre_attn_scalar}};
    for (const auto& [key, value] : gemma_keys)
      if (value != 0) bad_value(key, format_double(value), concat("applies to gemma3, not ", m.arch));
  }
  check_rotary_options(m, family);
  if (family.grouped_query && m.num_heads % m.kv_heads() != 0)
    bad_value("model.num_kv_heads", std::to_string(m.num_kv_heads),
              concat("num_heads (", m.num_heads, ") is not divisible by it"));
  if (family.rotary && m.head_dim() % 2 != 0)
    bad_value("model.num_heads", std::to_string(m.num_heads),
              concat("gives an odd head dimension ", m.head_dim(), "; rotary embeddings need an even one"));
  if (m.fp8_linear && cfg.run.backend != BackendKind::Cuda)
    bad_value("model.fp8_linear", "true", "needs the CUDA backend (run.backend = cuda) on a GPU of compute capability 8.9 "
                                          "or newer (L4, L40S, H100, H200): the CPU backend has no FP8");
  if (m.fp8_linear && cfg.fsdp.param_dtype == DType::F32)
    bad_value("model.fp8_linear", "true", "needs 16-bit parameters (fsdp.param_dtype = bf16): the FP8 copies are made "
                                          "from the gathered bf16 weights and activations");
  if (m.fp8_keep_weights && !m.fp8_linear)
    bad_value("model.fp8_keep_weights", "true", "keeps the E4M3 weights of model.fp8_linear, which is off: set "
                                                "model.fp8_linear = true too, or leave this out");
  if (cfg.data.tokenizer != TokenizerSource::File && cfg.model.dir.empty() && m.vocab_size < kByteVocab)
    bad_value("model.vocab_size", std::to_string(m.vocab_size),
              concat("must be >= ", kByteVocab, ", the byte tokenizer's vocabulary size"));
}

// The model's shape, which model.dir's config.json gives instead, in two groups: the family, its sizes and
// attention windows (with init_std, the random initialisation), then the norms, rotary embeddings and the tied head.
static std::vector<KeySpec> family_size_and_window_keys() {
  return {
      choice_key("model.arch", SHARDLM_FIELD(model.arch), model_family_names())
          .on("both; `llama`, `qwen2`, `qwen3`, `mistral`, `gemma3`, `phi3`: see README \"Status\" for the CUDA "
              "backend")
          .of_shape()
          .doc("BLOOM (ALiBi, LayerNorm with biases, GELU MLP, LM head tied to the embeddings), Llama (RMSNorm, "
               "rotary embeddings, grouped-query attention, SwiGLU MLP, no biases), Qwen2 (Llama's layer with biases "
               "on the q, k and v projections), Qwen3 (Llama's layer with an RMSNorm over each head of q and of k "
               "before rotary, `q_norm` / `k_norm`, and its own `head_dim`), Mistral (Llama's layer with a sliding "
               "window of `sliding_window` keys, and its own `head_dim`), Gemma 3's text model (Llama's layer with "
               "(1 + weight) RMSNorms, norms on the attention's and the MLP's outputs too, GeGLU with tanh GELU, "
               "embeddings times sqrt(`hidden_size`), q/k norms, local sliding-window layers interleaved with global "
               "ones: `sliding_window_pattern`, `rope_local_theta`, `query_pre_attn_scalar`) or Phi-3 (Llama's layer "
               "with q|k|v and gate|up fused, `qkv_proj` / `gate_up_proj`, `partial_rotary_factor`, LongRoPE and a "
               "sliding window); with `model.dir`, config.json's `model_type` decides"),
      int_key("model.vocab_size", SHARDLM_FIELD(model.vocab_size), 1, "must be > 0", "N")
          .of_shape()
          .doc("vocabulary size; at least 259 with the byte tokenizer (required without `dir`)"),
      int_key("model.hidden_size", SHARDLM_FIELD(model.hidden_size), 1, "must be > 0", "N")
          .of_shape()
          .doc("width of the residual stream (required without `dir`)"),
      int_key("model.num_layers", SHARDLM_FIELD(model.num_layers), 1, "must be > 0", "N")
          .of_shape()
          .doc("transformer blocks; each is one FSDP unit (required without `dir`)"),
      int_key("model.num_heads", SHARDLM_FIELD(model.num_heads), 1, "must be > 0", "N")
          .of_shape()
          .doc("attention heads; must divide `hidden_size` unless `head_dim` is set; Llama: the head dimension must "
               "be even (required without `dir`)"),
      positive_float_key("model.layer_norm_eps", SHARDLM_FIELD(model.layer_norm_eps))
          .of_shape()
          .doc("BLOOM: LayerNorm epsilon"),
      positive_float_key("model.init_std", SHARDLM_FIELD(model.init_std))
          .doc("standard deviation of the normal initialisation of a model without `dir`"),
      int_key("model.num_kv_heads", SHARDLM_FIELD(model.num_kv_heads), 0, "must be >= 0 (0 = num_heads)")
          .of_shape()
          .doc("Llama: key/value heads (grouped-query attention); must divide `num_heads`; 0 = `num_heads`"),
      int_key("model.intermediate_size", SHARDLM_FIELD(model.intermediate_size), 0,
              "must be >= 0 (0 = 4 x hidden_size)")
          .of_shape()
          .doc("Llama: width of the SwiGLU MLP; 0 = 4 x `hidden_size`"),
      int_key("model.head_dim", SHARDLM_FIELD(model.head_size), 0, "must be >= 0 (0 = hidden_size / num_heads)")
          .of_shape()
          .doc("Llama, Qwen2, Qwen3, Mistral, Gemma 3: the dimension of each attention head, which may differ from "
               "`hidden_size` / `num_heads` (Qwen3-0.6B: 128 at hidden 1024 and 16 heads, so q is 2048 wide); must be"
               " even; 0 = `hidden_size` / `num_heads` (which must then divide)"),
      int_key("model.sliding_window", SHARDLM_FIELD(model.sliding_window), 0,
              "must be >= 0 (0 = no window: every earlier key)")
          .of_shape()
          .doc("Mistral, Phi-3, Qwen2, Qwen3: attention over a sliding window of keys in every layer, as config.json's "
               "`sliding_window` (Mistral-7B-v0.1: 4096; v0.3: null, none; Qwen2 and Qwen3 where every layer is a "
               "`sliding_attention` layer, [huggingface.md](huggingface.md)): the query at position i attends the "
               "keys j with i - `sliding_window` < j <= i, as transformers' sliding-window mask; with `data.packing` "
               "the window lies inside each packed sample (keys of earlier samples stay masked). Applied in training "
               "on both backends (the CPU attention, the CUDA kernels and cuDNN's fused attention, whose graph masks "
               "the band j + window > i, or whose packed rows' bias holds the window) and in generation's "
               "key/value-cache decoding. 0 = no window: every earlier key. Gemma 3: the local layers' window "
               "(`sliding_window_pattern`), which they need (> 0) unless every layer is global (pattern 1). Other "
               "families: must be 0"),
      int_key("model.sliding_window_pattern", SHARDLM_FIELD(model.sliding_window_pattern), 0,
              "must be >= 0 (0 = every layer alike)")
          .of_shape()
          .doc("Gemma 3: local and global layers interleaved, as config.json's `layer_types` (or `sliding_window_pattern`"
               "): with N > 0 the layers i with (i + 1) % N == 0 are global (every earlier key, `rope_theta` with "
               "`rope_linear_factor`), the others local (`sliding_window` keys, `rope_local_theta`); Gemma 3's "
               "models: 6 (five local layers, then one global). 0 = every layer alike. Other families: must be 0"),
      double_key("model.rope_local_theta", SHARDLM_FIELD(model.rope_local_theta), kNonNegative)
          .of_shape()
          .doc("Gemma 3: the rotary base of the local layers, unscaled (config.json's `rope_local_base_freq`, or "
               "`rope_parameters.sliding_attention.rope_theta`; Gemma 3: 10000). 0 = `rope_theta` on every layer. "
               "Other families: must be 0"),
      double_key("model.rope_linear_factor", SHARDLM_FIELD(model.rope_linear_factor), kNonNegative)
          .of_shape()
          .doc("Gemma 3: linear rope scaling of the global layers' table, its frequencies divided by the factor "
               "(config.json's `rope_scaling` / `rope_parameters.full_attention` with `rope_type` linear; Gemma 3 "
               "4B-27B: 8). 0 = none. Other families: must be 0"),
      double_key("model.query_pre_attn_scalar", SHARDLM_FIELD(model.query_pre_attn_scalar), kNonNegative)
          .of_shape()
          .doc("Gemma 3: attention scores scaled by its inverse square root instead of `head_dim`'s (config.json's "
               "`query_pre_attn_scalar`; Gemma 3 1B: 256, its head_dim). 0 = `head_dim`. Other "
               "families: must be 0"),
  };
}

static std::vector<KeySpec> norm_rotary_and_tie_keys() {
  return {
      positive_float_key("model.rms_norm_eps", SHARDLM_FIELD(model.rms_norm_eps))
          .of_shape()
          .doc("Llama: RMSNorm epsilon"),
      positive_float_key("model.rope_theta", SHARDLM_FIELD(model.rope_theta))
          .of_shape()
          .doc("Llama: base of the rotary frequencies (Llama 3.1's `rope_scaling` comes from `config.json` only)"),
      double_key("model.partial_rotary_factor", SHARDLM_FIELD(model.partial_rotary_factor), kRotaryFraction)
          .of_shape()
          .doc("Phi-3: the fraction of each head's dimensions that rotate, as config.json's `partial_rotary_factor` "
               "(Phi-4-mini: 0.75): the first int(head_dim x factor) dimensions rotate (rotate_half within them), the "
               "rest pass through; must give an even number. 1 = all. Other families: must be 1"),
      float_list_key("model.longrope_short_factor", SHARDLM_FIELD(model.longrope.short_factor))
          .of_shape()
          .doc("Phi-3: LongRoPE's `short_factor` (config.json `rope_parameters` / `rope_scaling` with `rope_type` "
               "longrope, the 128k variants): comma-separated, one per rotary frequency (rotary dimension / 2); the "
               "frequency i is 1 / (factor_i x theta^(2i / rotary dimension)) in a forward whose positions stay "
               "within `longrope_original_max_position_embeddings`. Empty = no LongRoPE"),
      float_list_key("model.longrope_long_factor", SHARDLM_FIELD(model.longrope.long_factor))
          .of_shape()
          .doc("Phi-3: LongRoPE's `long_factor`, used instead in a forward whose largest position + 1 exceeds "
               "`longrope_original_max_position_embeddings` (a training micro-batch of more positions; in generation "
               "each step's sequence by its own largest position, as transformers' generate())"),
      int_key("model.longrope_original_max_position_embeddings",
              SHARDLM_FIELD(model.longrope.original_max_position_embeddings), 0, "must be >= 0 (0 = no LongRoPE)")
          .of_shape()
          .doc("Phi-3: LongRoPE's `original_max_position_embeddings` (Phi-3-mini-128k: 4096): past it the long "
               "factors apply; required with the factors"),
      double_key("model.longrope_attention_factor", SHARDLM_FIELD(model.longrope.attention_factor), kNonNegative)
          .of_shape()
          .doc("Phi-3: what LongRoPE multiplies cos and sin by (config.json's `attention_factor`); 0 = transformers' "
               "default sqrt(1 + ln(f) / ln(original)) with f = max_position_embeddings / original (1 where f <= 1; "
               "max_position_embeddings is config.json's, 4096 for a model made from the deck)"),
      flag_key("model.tie_word_embeddings", SHARDLM_FIELD(model.tie_word_embeddings))
          .of_shape()
          .doc("Llama: the LM head is the embedding matrix (BLOOM's always is)"),
  };
}

// How the model runs and where it comes from.
static std::vector<KeySpec> run_keys() {
  return {
      enum_key("model.attention", SHARDLM_FIELD(model.attention), attention_impl_name)
          .cuda()
          .doc("how training runs attention. `auto`: cuDNN's fused flash attention (forward and backward; causal, "
               "grouped-query heads read in place, BLOOM's ALiBi computed inside the kernel; each layer keeps only "
               "its softmax's log-sum-exp) where it can run: a build with cuDNN (`SHARDLM_CUDNN`), a GPU of compute "
               "capability 8.0 or newer, `fsdp.param_dtype` bf16 or fp16, a head dimension that is a multiple of 8 up"
               " to 256; elsewhere shardlm's own kernels (cuBLASLt GEMMs around softmax kernels; their T x T scratch "
               "and, for BLOOM, the T x T probabilities per layer). `cudnn`: the fused path or an error at start "
               "saying why not. `native`: never cuDNN. The start-up log line `attention: ...` and the summary "
               "record's `\"attention\"` say which ran and why; `shardlm plan` sizes the path it expects. cuDNN "
               "builds its plans once per micro-batch shape (about 0.14 s each, 1.5-2 s for the first), so on the "
               "fused path micro-batches are padded up to a multiple of 64 tokens (at most `data.max_length`; the "
               "added positions are padding without loss, after every real token, so no result changes). Generation's"
               " key/value-cache decoding uses its own kernels either way"),
      int_key("model.head_chunk_tokens", SHARDLM_FIELD(model.head_chunk_tokens), 0,
              "must be >= 0 (0 = 2048, 512 with fsdp.cpu_offload)")
          .cuda()
          .doc("how many tokens' logits the LM head forms at once (its loss and gradient run chunk by chunk): the "
               "chunk's fp32 logits are tokens x vocabulary x 4 bytes of GPU workspace (2 GB at BLOOM's 250,880 words"
               " and 2048 tokens). `0`: 2048, or 512 with `fsdp.cpu_offload` (where GPU memory is what the run is "
               "for). Smaller chunks save that memory for more passes of the head's weight gradient (one fp32 read "
               "and write of vocabulary x hidden per chunk). Not part of the shape: allowed with `model.dir`. The CPU"
               " backend has its own chunks and ignores it"),
      flag_key("model.fp8_linear", SHARDLM_FIELD(model.fp8_linear))
          .cuda()
          .doc("the decoder blocks' linear layers (q|k|v, o, gate|up, down) run their forward and both backward GEMMs "
               "in FP8 on the tensor cores (Accelerate's `mixed_precision: fp8`): each operand is copied to E4M3 with "
               "one scale per tensor from its current largest magnitude (torchao's tensorwise current scaling; "
               "activations, weights and gradients alike), the GEMM accumulates in fp32 and writes bf16 (fp32 for "
               "weight gradients). Attention, norms, embeddings, the LM head and the loss stay in "
               "`fsdp.param_dtype`, as do LoRA's adapter GEMMs and GEMMs whose sizes are not multiples of 16 "
               "(the run's `fp8:` line at start names them; micro-batches are padded to a multiple of 16 tokens). "
               "Needs the CUDA backend, "
               "`fsdp.param_dtype = bf16` and a GPU of compute capability 8.9 or newer (an error at start names the "
               "GPU otherwise); `shardlm plan` counts the E4M3 copies ([PERFORMANCE.md](PERFORMANCE.md) has its "
               "speed and loss against bf16)"),
      flag_key("model.fp8_keep_weights", SHARDLM_FIELD(model.fp8_keep_weights))
          .cuda()
          .doc("with `model.fp8_linear`, each of those layers keeps its weight's transposed E4M3 copy from its "
               "forward to its backward (the copy its input gradient multiplies by, written in the same pass as "
               "the forward's) instead of quantizing the weight again there: one byte of GPU memory per weight "
               "of the blocks' linear layers, unsharded, all layers at once, for one read and write of them fewer "
               "a step. With LoRA, whose base weights never change, both E4M3 copies are kept for the whole run "
               "(two bytes per weight), so no weight is quantized after the first step. `shardlm plan` and the "
               "run's `fp8:` line count the bytes; Llama-style families (BLOOM's blocks quantize again). The "
               "results are the same bits either way"),
      folder_key("model.dir", SHARDLM_FIELD(model.dir), {"config.json"}, "a Hugging Face model directory")
          .doc("a Hugging Face model directory: `config.json` and the weights, `model.safetensors` or shards with "
               "`model.safetensors.index.json` (as `save_pretrained` writes them or as the Hub has them). The shape "
               "comes from `config.json`, the initial weights from the safetensors files; each rank reads only the "
               "bytes of its own slices. Empty: a model of the shape below, randomly initialised"),
      folder_key("model.adapter", SHARDLM_FIELD(model.adapter), {"adapter_config.json", "adapter_model.safetensors"},
                 "a PEFT adapter directory")
          .doc("a PEFT LoRA adapter directory (`adapter_config.json` and `adapter_model.safetensors`, as PEFT's "
               "`save_pretrained` writes them) to start from: its `adapter_config.json` sets LoRA's `r`, `alpha`, "
               "`target_modules`, `modules_to_save` and `use_rslora`, so `[lora]` may be left out; a `[lora]` value "
               "that disagrees with the file is an error naming both. Checked at start against the model's family "
               "([lora.md](lora.md))"),
  };
}

DeckSection model_section() {
  return grouped_section("model", check_model, {family_size_and_window_keys(), norm_rotary_and_tie_keys(), run_keys()});
}

}  // namespace shardlm::config_detail
