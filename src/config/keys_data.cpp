// The [data] section's keys.
// Adding a key: keys.cpp's first lines.
#include "key_builders.hpp"

namespace shardlm::config_detail {

// CHECKS

// The chat records' keys would do nothing for another format: refused unless left at their defaults.
// (data.chat_template is not: `shardlm generate --chat` renders with it whatever the run trained on.)
static void check_data(const RunConfig& cfg, int) {
  const DataSection& d = cfg.data;
  if (d.format == DataFormat::Chat) return;
  const DataSection defaults;
  const std::string why = concat("applies to data.format = chat, not ", data_format_name(d.format));
  if (d.train_on_prompt != defaults.train_on_prompt) bad_value("data.train_on_prompt", "true", why);
  if (d.chat_format != defaults.chat_format) bad_value("data.chat_format", chat_format_name(d.chat_format), why);
}

DeckSection data_section() {
  return {"data", check_data, {
      enum_key("data.format", SHARDLM_FIELD(data.format), data_format_name)
          .doc("SQuAD v1.1 JSON; JSON lines with `{\"text\"}` or `{\"prompt\",\"completion\"}`; chess games as UCI "
               "moves (below); conversations rendered with the model's chat template, the loss on the assistant's "
               "turns ([data.md](data.md))"),
      enum_key("data.chat_format", SHARDLM_FIELD(data.chat_format), chat_format_name)
          .doc("`format = chat`: the records' form, OpenAI `{\"messages\"}`, ShareGPT `{\"conversations\"}` or alpaca"
               " `instruction`/`input`/`output`; `auto` tells each record's by its fields "
               "([data.md](data.md#records))"),
      path_key("data.chat_template", SHARDLM_FIELD(data.chat_template))
          .doc("`format = chat`: a `.jinja` chat template, or a `tokenizer_config.json` whose `chat_template`, "
               "`bos_token` and `eos_token` are used; empty: `model.dir`'s `chat_template.jinja` or "
               "`tokenizer_config.json` (then the tokenizer folder's); none is an error "
               "([data.md](data.md#the-chat-template))"),
      flag_key("data.train_on_prompt", SHARDLM_FIELD(data.train_on_prompt))
          .doc("`format = chat`: the loss on every token; `false` takes it on the assistant's turns only (each turn's"
               " tokens after the generation prompt, through its end-of-turn marker)"),
      path_key("data.train_file", SHARDLM_FIELD(data.train_file), "PATH").doc("training data"),
      path_key("data.eval_file", SHARDLM_FIELD(data.eval_file))
          .doc("evaluation data, evaluated after each epoch; empty for none. The eval loss is the mean over all its "
               "loss tokens, not Trainer's mean of per-batch means (section [eval])"),
      int_key("data.max_length", SHARDLM_FIELD(data.max_length), 8, "must be >= 8")
          .doc("tokens per sample; SQuAD contexts are truncated to fit, never the answer"),
      flag_key("data.packing", SHARDLM_FIELD(data.packing))
          .doc("sequence packing for training: each step's global batch (the same samples as without packing) is "
               "packed end to end into rows of `max_length` tokens, longest sample first into the first row with room"
               " (first-fit decreasing), and the rows are dealt out `micro_batch_size` at a time to the ranks' "
               "micro-steps, so a step runs fewer, fuller micro-batches; every rank runs the same number (a rank may "
               "get an empty one at the end, which still joins the collectives). A token attends only to the tokens "
               "of its own sample, and its position restarts at 0 with each sample (rotary for Llama / Qwen2; ALiBi "
               "is relative), so each sample's loss and gradients are those of a row of its own and the step's loss, "
               "still averaged per answer token over the global batch, is unchanged. On the GPU the fused path masks "
               "the other samples with a `[micro-batch, 1, T, T]` 16-bit bias (`max_length`^2 x 2 bytes per row, in "
               "the attention workspace and in `shardlm plan`); the native kernels mask them directly. Evaluation "
               "stays unpacked. The start-up log line `padding:` and the setup record's `padding_share` / "
               "`packed_padding_share` and `micro_batches_per_epoch` / `packed_micro_batches_per_epoch` give the "
               "share of padding among the positions computed and the forward passes of the first epoch (all ranks) "
               "without and with packing: at micro-batch 1 nothing is padded either way, and packing's gain is the "
               "fewer passes"),
      unsigned_key("data.train_size", SHARDLM_FIELD(data.train_size))
          .doc("use a seeded random subset of this many records (0 = all)"),
      unsigned_key("data.eval_size", SHARDLM_FIELD(data.eval_size)).doc("the same for the eval set"),
      tokenizer_key("data.tokenizer")
          .doc("`auto`: `model.dir`'s `tokenizer.json` (an error if the directory has none), or `byte` without "
               "`model.dir`; the resolved deck names what it chose. `byte`: byte-level, ids 0-255 are bytes, 256 BOS,"
               " 257 EOS, 258 PAD. A path: a Hugging Face `tokenizer.json` (byte-level BPE as BLOOM's and Llama 3's, "
               "or Llama 2 style as CodeLlama's), or a folder holding one, such as the model directory. Checkpoints "
               "keep a hash of it, and resume refuses another tokenizer (see `checkpoint.load_weights_only`)"),
  }};
}

}  // namespace shardlm::config_detail
