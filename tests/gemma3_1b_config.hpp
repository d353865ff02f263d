// Gemma-3-1B's config.json (google/gemma-3-1b-pt, in transformers 4.5x's form) cut to the keys shardlm reads: the
// stand-in the deck and plan tests put beside input/gemma3/gemma3-1b-lora.ini.
#pragma once

inline const char* const kGemma3_1bConfig =
    R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262144,
    "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_local_base_freq": 10000,
    "rope_scaling": null, "sliding_window": 512, "sliding_window_pattern": 6,
    "attn_logit_softcapping": null, "final_logit_softcapping": null,
    "max_position_embeddings": 32768, "initializer_range": 0.02})";
