// export_logits HF_DIR IDS_JSON OUT_JSON [ADAPTER_DIR]: shardlm's own logits (CPU backend, fp32) of a
// model directory on given token ids, for tests/fixtures/hf/check_export_tokenizer.py and
// tests/fixtures/peft/check_lora_export.py to compare with transformers' (and PEFT's). IDS_JSON is a
// JSON array of token ids; OUT_JSON gets {"logits": [[V floats] per position]}, every position's from
// one forward of the whole sequence, as transformers' forward gives them (not from the prefix ending
// there: with LongRoPE the whole sequence's length picks the rotary factors). With ADAPTER_DIR (a PEFT LoRA
// adapter folder) the model runs with those adapters on the frozen base, and with the adapter's
// modules_to_save (the root's modules it holds whole) in place of the base's.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "shardlm/io.hpp"
#include "shardlm/model.hpp"

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: export_logits HF_DIR IDS_JSON OUT_JSON [ADAPTER_DIR]\n");
    return 2;
  }
  try {
    shardlm::HfModelDir dir(argv[1]);
    shardlm::ModelConfig cfg = dir.config();
    std::vector<std::vector<float>> adapters;  // per unit, lora_layout's order
    if (argc == 5) {
      const shardlm::PeftAdapter a = shardlm::read_peft_adapter(argv[4], cfg);
      cfg.lora = a.lora;
      for (const shardlm::UnitLayout& u : shardlm::lora_layout(cfg)) {
        std::vector<float> f(u.numel);
        for (const shardlm::TensorSpec& t : u.tensors)
          std::copy(a.tensors.at(t.name).values.begin(), a.tensors.at(t.name).values.end(), f.begin() + t.offset);
        adapters.push_back(std::move(f));
      }
    }
    std::ifstream in(argv[2]);
    const std::vector<int32_t> ids = nlohmann::json::parse(in).get<std::vector<int32_t>>();
    std::vector<std::vector<float>> flat;
    for (size_t u = 0; u < dir.layout().size(); ++u) {
      std::vector<float> f(dir.layout()[u].numel);
      dir.read_unit_slice(u, 0, f.size(), f.data());
      flat.push_back(std::move(f));
    }
    // The root as a LoRA run holds it: the frozen rest (lora_frozen_layout) beside the saved modules.
    shardlm::CpuParams root = flat[0].data();
    std::vector<float> frozen_root;
    if (!adapters.empty() && !adapters[0].empty()) {
      const shardlm::UnitLayout frozen = shardlm::lora_frozen_layout(cfg)[0];
      frozen_root.resize(frozen.numel);
      dir.read_unit_slice(0, frozen, 0, frozen.numel, frozen_root.data());  // by name, as a LoRA run reads it
      root = {frozen_root.data(), adapters[0].data()};
    }
    const int T = static_cast<int>(ids.size());
    // Room for the head over all T positions at once, each as a sequence of one.
    std::unique_ptr<shardlm::CpuModel> model = shardlm::make_cpu_model(cfg, T, T);
    std::vector<float> h[2] = {std::vector<float>(static_cast<size_t>(T) * cfg.hidden_size),
                               std::vector<float>(static_cast<size_t>(T) * cfg.hidden_size)};
    model->embed_forward(root, ids.data(), 1, T, h[0].data());
    for (int l = 0; l < cfg.num_layers; ++l)
      model->block_forward(l, {flat[1 + l].data(), adapters.empty() ? nullptr : adapters[1 + l].data()},
                           h[l % 2].data(), h[1 - l % 2].data(), 1, T);
    // The final norm and LM head act on each position alone: the T hidden rows as T sequences of length 1.
    std::vector<float> logits(static_cast<size_t>(T) * cfg.vocab_size);
    model->head_logits(root, h[cfg.num_layers % 2].data(), T, 1, logits.data());
    nlohmann::json rows = nlohmann::json::array();
    for (int t = 0; t < T; ++t)
      rows.push_back(std::vector<float>(logits.begin() + static_cast<size_t>(t) * cfg.vocab_size,
                                        logits.begin() + static_cast<size_t>(t + 1) * cfg.vocab_size));
    std::ofstream(argv[3]) << nlohmann::json{{"logits", rows}}.dump() << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "export_logits: %s\n", e.what());
    return 1;
  }
  return 0;
}
