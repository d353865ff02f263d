// The names of the deck's word-valued keys (data.format, train.lr_schedule, ...), as the deck spells them.
#include "config_internal.hpp"

namespace shardlm {

namespace {

// names[i] is the name of the enum's value i (the enums are declared in the names' order); "?" past the
// last, which is where enum_key (key_builders.hpp) stops listing a key's words.
template <typename E, size_t N>
const char* name_of(E value, const char* const (&names)[N]) {
  const auto i = static_cast<size_t>(value);
  return i < N ? names[i] : "?";
}

}  // namespace

const char* data_format_name(DataFormat f) { return name_of(f, {"squad", "jsonl", "chess", "chat"}); }
const char* chat_format_name(ChatFormat f) { return name_of(f, {"auto", "messages", "sharegpt", "alpaca"}); }
const char* tokenizer_source_name(TokenizerSource t) { return name_of(t, {"auto", "byte", "file"}); }
const char* lr_schedule_name(LrSchedule s) {
  return name_of(s, {"linear", "constant", "constant_with_warmup", "cosine", "cosine_with_restarts", "polynomial",
                     "cosine_with_min_lr"});
}
const char* optim_name(Optim o) { return name_of(o, {"adamw_torch", "adamw_8bit"}); }
const char* backward_prefetch_name(BackwardPrefetch p) { return name_of(p, {"pre", "post", "none"}); }
const char* offload_accumulate_name(OffloadAccumulate a) { return name_of(a, {"host", "device"}); }
const char* offload_root_update_name(OffloadRootUpdate r) { return name_of(r, {"auto", "host", "device"}); }
const char* root_reduction_name(RootReduction r) { return name_of(r, {"auto", "split", "whole"}); }
const char* no_sync_name(NoSync n) { return name_of(n, {"auto", "off", "replicate", "full"}); }
const char* eval_generate_name(EvalGenerate g) { return name_of(g, {"end", "epoch", "none"}); }
const char* resume_from_name(ResumeFrom r) { return name_of(r, {"none", "auto", "path"}); }
const char* keep_best_name(KeepBest k) { return name_of(k, {"none", "eval_loss"}); }
const char* backend_name(BackendKind b) { return name_of(b, {"cpu", "cuda"}); }
const char* attention_impl_name(AttentionImpl a) { return name_of(a, {"auto", "cudnn", "native"}); }
const char* lora_init_name(LoraInit i) { return name_of(i, {"kaiming", "gaussian"}); }

std::string tokenizer_text(const DataSection& data) {
  return data.tokenizer == TokenizerSource::File ? data.tokenizer_file : tokenizer_source_name(data.tokenizer);
}

std::string resume_text(const CheckpointSection& checkpoint) {
  return checkpoint.resume == ResumeFrom::Path ? checkpoint.resume_path : resume_from_name(checkpoint.resume);
}

namespace config_detail {

std::string choice_list(const std::vector<std::string>& choices) {
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i)
    list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  return choices.size() == 1 ? concat("only ", list, " is supported") : concat("must be ", list);
}

}  // namespace config_detail

}  // namespace shardlm
