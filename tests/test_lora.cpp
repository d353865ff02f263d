#define BOOST_TEST_MODULE test_lora
#include <boost/test/unit_test.hpp>
// LoRA's layout and names: the adapters of each family's targeted modules (shapes, order, PEFT's
// tensor names), PEFT's initialisation (Kaiming-uniform A within 1/sqrt(in), zero B; Gaussian A),
// the scale with and without rsLoRA, and the refusal of a module the family does not have.

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu_model_test_support.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"
#include "test_support.hpp"

using namespace shardlm;
using namespace model_test;

namespace {

ModelConfig with_lora(ModelConfig cfg, std::vector<std::string> targets, int r = 4) {
  cfg.lora.r = r;
  cfg.lora.alpha = 8;
  cfg.lora.target_modules = std::move(targets);
  return cfg;
}

std::vector<std::string> names_of(const UnitLayout& u) {
  std::vector<std::string> n;
  for (const TensorSpec& t : u.tensors) n.push_back(t.name);
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(llama_adapters_follow_the_family_order_with_peft_names) {
  const ModelConfig cfg = with_lora(tiny_llama(), {"v_proj", "q_proj", "down_proj"});
  const std::vector<UnitLayout> lora = lora_layout(cfg);
  BOOST_TEST_REQUIRE(lora.size() == 3u);
  BOOST_TEST(lora[0].tensors.empty());
  BOOST_TEST(lora[0].name == "root");
  const std::vector<std::string> want = {
      "layers.1.self_attn.q_proj.lora_A.weight", "layers.1.self_attn.q_proj.lora_B.weight",
      "layers.1.self_attn.v_proj.lora_A.weight", "layers.1.self_attn.v_proj.lora_B.weight",
      "layers.1.mlp.down_proj.lora_A.weight",    "layers.1.mlp.down_proj.lora_B.weight"};
  BOOST_TEST(names_of(lora[2]) == want, boost::test_tools::per_element());
  // q_proj: [r, H] and [H, r]; v_proj's output is kv_heads * head_dim = 2 * 8; down_proj reads F = 40.
  const auto& t = lora[2].tensors;
  BOOST_TEST((t[0].shape == std::vector<int64_t>{4, 32}));
  BOOST_TEST((t[1].shape == std::vector<int64_t>{32, 4}));
  BOOST_TEST((t[3].shape == std::vector<int64_t>{16, 4}));
  BOOST_TEST((t[4].shape == std::vector<int64_t>{4, 40}));
  BOOST_TEST(t[1].offset == t[0].numel);
  BOOST_TEST(lora[2].numel == 4u * 32 + 32 * 4 + 4 * 32 + 16 * 4 + 4 * 40 + 32 * 4);
  BOOST_TEST(peft_tensor_name(cfg, t[0].name) == "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
}

BOOST_AUTO_TEST_CASE(bloom_adapters_and_names) {
  const ModelConfig cfg = with_lora(tiny_bloom(), {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}, 2);
  const std::vector<UnitLayout> lora = lora_layout(cfg);
  BOOST_TEST_REQUIRE(lora[1].tensors.size() == 8u);
  BOOST_TEST(lora[1].tensors[0].name == "h.0.self_attention.query_key_value.lora_A.weight");
  BOOST_TEST((lora[1].tensors[1].shape == std::vector<int64_t>{3 * 24, 2}));
  BOOST_TEST((lora[1].tensors[6].shape == std::vector<int64_t>{2, 4 * 24}));
  BOOST_TEST(peft_tensor_name(cfg, lora[1].tensors[2].name) ==
             "base_model.model.transformer.h.0.self_attention.dense.lora_A.weight");
  const std::vector<LinearModule> modules = linear_modules(cfg);
  BOOST_TEST(modules.size() == 4u);
}

BOOST_AUTO_TEST_CASE(off_without_a_rank) {
  ModelConfig cfg = tiny_llama();
  BOOST_TEST(!cfg.lora.enabled());
  for (const UnitLayout& u : lora_layout(cfg)) BOOST_TEST(u.tensors.empty());
}

BOOST_AUTO_TEST_CASE(peft_initialisation) {
  for (LoraInit init : {LoraInit::Kaiming, LoraInit::Gaussian}) {
    ModelConfig cfg = with_lora(tiny_llama(), {"q_proj", "up_proj"}, 8);
    cfg.lora.init = init;
    const UnitLayout block = lora_layout(cfg)[1];
    std::vector<float> values(block.numel);
    init_unit_slice(block, 1, 42, 0, block.numel, values.data());
    for (const TensorSpec& t : block.tensors) {
      const auto begin = values.begin() + static_cast<std::ptrdiff_t>(t.offset);
      const std::vector<float> v(begin, begin + static_cast<std::ptrdiff_t>(t.numel));
      double ss = 0, max_abs = 0;
      for (float x : v) ss += double(x) * x, max_abs = std::max(max_abs, double(std::fabs(x)));
      const double rms = std::sqrt(ss / v.size());
      if (t.name.find("lora_B") != std::string::npos) {
        BOOST_TEST(max_abs == 0.0, t.name);
      } else if (init == LoraInit::Kaiming) {
        // Uniform in +-1/sqrt(in): within the bound, rms near bound/sqrt(3).
        const double bound = 1.0 / std::sqrt(double(t.shape[1]));
        BOOST_TEST(max_abs <= bound, t.name);
        BOOST_TEST(std::fabs(rms - bound / std::sqrt(3.0)) < 0.1 * bound, t.name << " rms " << rms);
      } else {
        BOOST_TEST(std::fabs(rms - 1.0 / 8) < 0.1 / 8, t.name << " rms " << rms);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(scale_as_peft) {
  LoraConfig l;
  l.r = 16, l.alpha = 32;
  BOOST_TEST(l.scale() == 2.0);
  l.use_rslora = true;
  BOOST_TEST(l.scale() == 8.0);
}

BOOST_AUTO_TEST_CASE(an_unknown_module_is_refused) {
  const ModelConfig cfg = with_lora(tiny_bloom(), {"q_proj"});
  const std::string e = error_of([&] { lora_layout(cfg); });
  BOOST_TEST(e.find("bloom has no linear module 'q_proj'") != std::string::npos, e);
}
