// The [lora] section's keys (lora.cpp checks them against the model's family once its shape is known).
// Adding a key: keys.cpp's first lines.
#include "key_builders.hpp"

namespace shardlm::config_detail {

// A key of [lora]: the resolved deck holds it only when LoRA is on (an absent [lora] is LoRA off).
static KeySpec lora_key(KeySpec k) {
  k.written = [](const RunConfig& c) { return c.model.lora.enabled(); };
  return k;
}

DeckSection lora_section() {
  return {"lora", nullptr, {
      lora_key(int_key("lora.r", SHARDLM_FIELD(model.lora.r), 1, "must be >= 1"))
          .shown_default("required")
          .doc("rank of each adapter: A is `[r, in]`, B is `[out, r]` (PEFT's `r`)"),
      lora_key(double_key("lora.alpha", SHARDLM_FIELD(model.lora.alpha), kPositive))
          .doc("scale numerator: the adapter's output is multiplied by `alpha / r` (`alpha / sqrt(r)` with "
               "`use_rslora`); PEFT's `lora_alpha` and its default"),
      lora_key(double_key("lora.dropout", SHARDLM_FIELD(model.lora.dropout), kUnitInterval))
          .doc("dropout on the adapter's input (PEFT's `lora_dropout`): in training each adapted layer computes `W x "
               "+ scale B A dropout(x)`, `dropout` keeping an element with probability `1 - dropout` and multiplying "
               "it by `1 / (1 - dropout)`; the base layer's input is never dropped, and evaluation and generation "
               "never drop. Each adapted layer draws its own mask from a hash of `train.seed`, the step, the "
               "micro-step, the rank and the element's place ([lora.md](lora.md#dropout)), so a resumed run draws the"
               " same masks and the CPU and CUDA backends draw the same ones. Costs one `[tokens, widest adapted "
               "input]` scratch in the compute dtype (`shardlm plan` counts it) and an element-wise pass over each "
               "adapted layer's input in the forward and two in the backward"),
      lora_key(names_key("lora.target_modules", SHARDLM_FIELD(model.lora.target_modules),
                         "comma-separated names, or `all-linear`"))
          .shown_default("required")
          .doc("the linear layers of every block that get an adapter, by their Hugging Face module names: Llama, "
               "Qwen2, Qwen3, Mistral and Gemma 3 `q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, "
               "`down_proj`; Phi-3 (fused) `qkv_proj`, `o_proj`, `gate_up_proj`, `down_proj`; BLOOM "
               "`query_key_value`, `dense`, `dense_h_to_4h`, `dense_4h_to_h`; `all-linear` is all of them (as PEFT's,"
               " the LM head excluded). Resolved to the family's order, repeats removed"),
      lora_key(names_key("lora.modules_to_save", SHARDLM_FIELD(model.lora.modules_to_save)))
          .doc("modules of the root unit trained whole beside the adapters (fp32 master, gradient and AdamW state; "
               "the rest of the base stays frozen) and saved in the adapter (PEFT's `modules_to_save`): Llama and "
               "Qwen2 `embed_tokens`, `model.norm` (the final norm), `lm_head`; BLOOM `word_embeddings_layernorm`, "
               "`ln_f`. A name selects, as PEFT's, every module whose path ends with it (a path or any end of it; "
               "resolved to these names, in this order). Refused, saying why and listing the valid names: a name that"
               " also selects modules of the blocks (PEFT's `norm` is every block's norms too), and the embedding or "
               "`lm_head` of a model whose head is tied to the embedding (BLOOM's always; Llama's and Qwen2's with "
               "`tie_word_embeddings`), which PEFT would train as two matrices "
               "([lora.md](lora.md#whole-modules-beside-the-adapters-modules_to_save))"),
      lora_key(flag_key("lora.use_rslora", SHARDLM_FIELD(model.lora.use_rslora)))
          .doc("rank-stabilised LoRA: scale `alpha / sqrt(r)` instead of `alpha / r`"),
      lora_key(enum_key("lora.init", SHARDLM_FIELD(model.lora.init), lora_init_name))
          .doc("the adapters' start, as PEFT's `init_lora_weights`: `kaiming` (PEFT's `True`) draws A "
               "Kaiming-uniform, bound `1 / sqrt(in)`; `gaussian` draws A normal with standard deviation `1 / r`; B "
               "is zero either way, so training starts from the base model's output. Ignored for adapters read from "
               "`model.adapter`"),
  }};
}

}  // namespace shardlm::config_detail
