// The files of a Hugging Face export besides config.json and the weights: generation_config.json
// and the tokenizer's files.
#pragma once

#include <functional>
#include <string>

#include "shardlm/io.hpp"

namespace shardlm {

// transformers' name of a dtype in config.json: "float32", "bfloat16" or "float16".
const char* torch_dtype_name(DType dtype);

// Copies options.copy_files into `dir` (Error naming a file that cannot be read), writes
// options.text_files, and writes generation_config.json from options.token_ids unless a copied
// file is one. `write_text(path, text)` writes one file safely (via a temporary name).
void write_export_files(const std::string& dir, const HfExportOptions& options,
                        const std::function<void(const std::string&, const std::string&)>& write_text);

}  // namespace shardlm
