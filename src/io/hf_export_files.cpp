// generation_config.json and the tokenizer files of a Hugging Face export: copied from the run's
// source folder where it had them, else written from what the caller knows (token ids, a byte
// tokenizer's files).
#include "hf_export_files.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace shardlm {

namespace fs = std::filesystem;

const char* torch_dtype_name(DType dtype) { return by_dtype(dtype, "float32", "bfloat16", "float16"); }

void write_export_files(const std::string& dir, const HfExportOptions& options,
                        const std::function<void(const std::string&, const std::string&)>& write_text) {
  bool generation_config = false;
  for (const std::string& source : options.copy_files) {
    const std::string text = read_input_file(source, "export: file to copy", kMaxTokenizerBytes);
    const std::string name = fs::path(source).filename().string();
    write_text((fs::path(dir) / name).string(), text);
    generation_config |= name == "generation_config.json";
  }
  for (const auto& [name, text] : options.text_files) {
    write_text((fs::path(dir) / name).string(), text);
    generation_config |= name == "generation_config.json";
  }
  if (!generation_config) {
    // What save_pretrained derives from the model's config: its special tokens.
    nlohmann::ordered_json g;
    g["_from_model_config"] = true;
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if (auto it = options.token_ids.find(key); it != options.token_ids.end()) g[key] = it->second;
    write_text((fs::path(dir) / "generation_config.json").string(), g.dump(2) + "\n");
  }
}

}  // namespace shardlm
