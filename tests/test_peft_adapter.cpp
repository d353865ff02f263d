#define BOOST_TEST_MODULE test_peft_adapter
#include <boost/test/unit_test.hpp>
// test_peft_adapter: PEFT LoRA adapter folders. adapter_config.json as PEFT 0.21 writes it and a
// hand-written one in PEFT's format read back; adapter_model.safetensors under PEFT's names; a write
// read back equal; every refusal of a damaged or mismatched adapter naming the file and the key.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "cpu_model_test_support.hpp"
#include "shardlm/config.hpp"
#include "shardlm/io.hpp"
#include "temp_dir.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace shardlm;
using model_test::tiny_bloom;
using model_test::tiny_llama;
using model_test::tiny_qwen2;
using Json = nlohmann::json;

namespace {

const std::string kFixture = SHARDLM_SOURCE_DIR "/tests/fixtures/peft/adapter_config_llama.json";

ModelConfig with_lora(ModelConfig cfg, std::vector<std::string> targets, std::vector<std::string> saved = {},
                      int r = 4) {
  cfg.lora.r = r;
  cfg.lora.alpha = 8;
  cfg.lora.target_modules = std::move(targets);
  cfg.lora.modules_to_save = std::move(saved);
  return cfg;
}

const std::vector<std::string> kLlamaLinear = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

// The adapter's tensors of `cfg` with random values (B non-zero, as after training).
std::vector<AdapterTensor> random_adapter(const ModelConfig& cfg, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<AdapterTensor> out;
  for (const TensorSpec& t : peft_adapter_tensors(cfg))
    out.push_back({t.name, t.shape, model_test::random_floats(t.numel, rng, 0.5f)});
  return out;
}

AdapterTensor& named(std::vector<AdapterTensor>& tensors, const std::string& name) {
  for (AdapterTensor& t : tensors)
    if (t.name == name) return t;
  throw Error("no tensor " + name);
}

// The fixture's adapter_config.json (PEFT 0.21.2's keys) with `edit` applied.
std::string fixture_with(const std::function<void(Json&)>& edit) {
  Json j = Json::parse(read_text_file(kFixture));
  edit(j);
  return j.dump(2);
}

// An adapter folder of `config_text` and these tensors under PEFT's names, written directly (not by
// write_peft_adapter), in `dtype`.
std::string adapter_folder(const TempDir& tmp, const std::string& name, const std::string& config_text,
                           const ModelConfig& cfg, const std::vector<AdapterTensor>& tensors, DType dtype = DType::F32) {
  const fs::path dir = tmp.root / name;
  fs::create_directories(dir);
  std::ofstream(dir / "adapter_config.json") << config_text;
  std::vector<SafetensorsEntry> entries;
  for (const AdapterTensor& t : tensors) entries.push_back({peft_tensor_name(cfg, t.name), t.shape, t.values, dtype});
  write_safetensors((dir / "adapter_model.safetensors").string(), entries);
  return dir.string();
}

void check_equal(const PeftAdapter& read, const std::vector<AdapterTensor>& written) {
  BOOST_TEST(read.tensors.size() == written.size());
  for (const AdapterTensor& w : written) {
    BOOST_TEST_CONTEXT(w.name) {
      const auto it = read.tensors.find(w.name);
      BOOST_TEST_REQUIRE((it != read.tensors.end()));
      BOOST_TEST((it->second.shape == w.shape));
      BOOST_TEST((it->second.values == w.values));
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_tensors_of_an_adapter) {
  const ModelConfig cfg = with_lora(tiny_llama(), {"v_proj", "q_proj"}, {"lm_head", "model.norm", "embed_tokens"});
  std::vector<std::string> names;
  for (const TensorSpec& t : peft_adapter_tensors(cfg)) names.push_back(t.name);
  const std::vector<std::string> want = {
      "layers.0.self_attn.q_proj.lora_A.weight", "layers.0.self_attn.q_proj.lora_B.weight",
      "layers.0.self_attn.v_proj.lora_A.weight", "layers.0.self_attn.v_proj.lora_B.weight",
      "layers.1.self_attn.q_proj.lora_A.weight", "layers.1.self_attn.q_proj.lora_B.weight",
      "layers.1.self_attn.v_proj.lora_A.weight", "layers.1.self_attn.v_proj.lora_B.weight",
      "embed_tokens.weight",                     "norm.weight",
      "lm_head.weight"};  // the saved modules in the root's order
  BOOST_TEST(names == want, boost::test_tools::per_element());
  BOOST_TEST((peft_adapter_tensors(cfg).back().shape == std::vector<int64_t>{37, 32}));
  BOOST_TEST(peft_tensor_name(cfg, "norm.weight") == "base_model.model.model.norm.weight");
  BOOST_TEST(peft_tensor_name(cfg, "lm_head.weight") == "base_model.model.lm_head.weight");
  // BLOOM's LayerNorms: weight and bias each, under transformer.
  const ModelConfig bloom = with_lora(tiny_bloom(), {"dense"}, {"word_embeddings_layernorm", "ln_f"});
  std::vector<std::string> bloom_names;
  for (const TensorSpec& t : peft_adapter_tensors(bloom)) bloom_names.push_back(peft_tensor_name(bloom, t.name));
  BOOST_TEST_REQUIRE(bloom_names.size() == 2u * 2 + 4);
  const std::vector<std::string> bloom_saved(bloom_names.end() - 4, bloom_names.end());
  BOOST_TEST((bloom_saved == std::vector<std::string>{"base_model.model.transformer.word_embeddings_layernorm.weight",
                                                      "base_model.model.transformer.word_embeddings_layernorm.bias",
                                                      "base_model.model.transformer.ln_f.weight",
                                                      "base_model.model.transformer.ln_f.bias"}),
             boost::test_tools::per_element());
}

// The root modules modules_to_save may name, by the shortest end of their path that PEFT's rule
// (a plain string suffix) matches to them alone.
BOOST_AUTO_TEST_CASE(savable_modules_and_peft_matching) {
  auto names = [](const ModelConfig& cfg) {
    std::vector<std::string> n;
    for (const SavableModule& m : lora_savable_modules(cfg)) n.push_back(m.name + "=" + m.path);
    return n;
  };
  BOOST_TEST((names(tiny_llama()) ==
              std::vector<std::string>{"embed_tokens=model.embed_tokens", "model.norm=model.norm", "lm_head=lm_head"}),
             boost::test_tools::per_element());
  // A tied head: neither the head nor its embedding.
  BOOST_TEST((names(tiny_qwen2()) == std::vector<std::string>{"model.norm=model.norm"}));
  BOOST_TEST((names(tiny_bloom()) == std::vector<std::string>{
                                         "word_embeddings_layernorm=transformer.word_embeddings_layernorm",
                                         "ln_f=transformer.ln_f"}),
             boost::test_tools::per_element());
  BOOST_TEST(peft_saves("model.layers.3.input_layernorm", "norm"));
  BOOST_TEST(peft_saves("model.norm", "norm"));
  BOOST_TEST(peft_saves("model.norm", "model.norm"));
  BOOST_TEST(!peft_saves("model.layers.3.input_layernorm", "model.norm"));
  BOOST_TEST(peft_saves("lm_head", "head"));  // a string's end, not a component's
  BOOST_TEST(!peft_saves("lm_head", ""));
  const std::vector<std::string> paths = hf_module_paths(tiny_qwen2());
  BOOST_TEST(std::count(paths.begin(), paths.end(), "lm_head") == 1);  // the tied head is a module of its own
  BOOST_TEST(std::count(paths.begin(), paths.end(), "model.layers.1.mlp") == 1);
}

BOOST_AUTO_TEST_CASE(adapter_config_json_as_peft_writes_it) {
  ModelConfig cfg = with_lora(tiny_llama(), {"all-linear"});
  cfg.lora.target_modules = kLlamaLinear;
  cfg.lora.alpha = 16;
  cfg.lora.dropout = 0.05;
  const std::string text = peft_adapter_config_json(cfg, "meta-llama/Llama-3.1-8B");
  // Keys sorted, two-space indent, no newline at the end: json.dumps(indent=2, sort_keys=True).
  BOOST_TEST(text.rfind("{\n  \"alora_invocation_tokens\": null,\n  \"alpha_pattern\": {},\n", 0) == 0u, text);
  BOOST_TEST(text.back() == '}');
  const auto j = nlohmann::ordered_json::parse(text);
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  BOOST_TEST(std::is_sorted(keys.begin(), keys.end()));
  // Every key PEFT 0.21.2 writes (the fixture's), peft_version aside: shardlm is not PEFT.
  const Json fixture = Json::parse(read_text_file(kFixture));
  for (const auto& [k, v] : fixture.items())
    if (k != "peft_version") BOOST_TEST(j.contains(k), k);
  BOOST_TEST(keys.size() == fixture.size() - 1);

  BOOST_TEST(j.at("peft_type") == "LORA");
  BOOST_TEST(j.at("task_type") == "CAUSAL_LM");
  BOOST_TEST(j.at("r") == 4);
  BOOST_TEST(j.at("lora_alpha").is_number_integer());
  BOOST_TEST(j.at("lora_alpha") == 16);
  BOOST_TEST(j.at("lora_dropout") == 0.05);
  BOOST_TEST((j.at("target_modules").get<std::vector<std::string>>() == kLlamaLinear));
  BOOST_TEST(j.at("modules_to_save").is_null());
  BOOST_TEST(j.at("bias") == "none");
  BOOST_TEST(j.at("fan_in_fan_out") == false);
  BOOST_TEST(j.at("inference_mode") == true);
  BOOST_TEST(j.at("init_lora_weights") == true);
  BOOST_TEST(j.at("use_rslora") == false);
  BOOST_TEST(j.at("use_dora") == false);
  BOOST_TEST(j.at("ensure_weight_tying") == false);
  BOOST_TEST(j.at("layers_to_transform").is_null());
  BOOST_TEST(j.at("revision").is_null());
  BOOST_TEST((j.at("rank_pattern").is_object() && j.at("rank_pattern").empty()));
  BOOST_TEST(j.at("base_model_name_or_path") == "meta-llama/Llama-3.1-8B");

  cfg.lora.alpha = 0.5;
  cfg.lora.init = LoraInit::Gaussian;
  cfg.lora.use_rslora = true;
  cfg.lora.modules_to_save = {"lm_head"};
  const Json k = Json::parse(peft_adapter_config_json(cfg, ""));
  BOOST_TEST(k.at("lora_alpha") == 0.5);
  BOOST_TEST(k.at("init_lora_weights") == "gaussian");
  BOOST_TEST(k.at("use_rslora") == true);
  BOOST_TEST((k.at("modules_to_save").get<std::vector<std::string>>() == std::vector<std::string>{"lm_head"}));
  BOOST_TEST(k.at("base_model_name_or_path").is_null());
  // No tied module is ever trained: ensure_weight_tying has nothing to tie.
  const ModelConfig qwen = with_lora(tiny_qwen2(), {"q_proj"}, {"model.norm"});
  BOOST_TEST(Json::parse(peft_adapter_config_json(qwen, "")).at("ensure_weight_tying") == false);

  BOOST_TEST(contains(error_of([&] { peft_adapter_config_json(tiny_llama(), ""); }), "LoRA is off"));
}

BOOST_AUTO_TEST_CASE(write_then_read_back_equal) {
  TempDir tmp{"peft"};
  for (const ModelConfig& cfg : {with_lora(tiny_llama(), kLlamaLinear, {"embed_tokens", "model.norm", "lm_head"}),
                                 with_lora(tiny_bloom(), {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"},
                                           {"word_embeddings_layernorm", "ln_f"}, 2),
                                 with_lora(tiny_qwen2(), {"v_proj", "o_proj"}, {}, 3)}) {
    BOOST_TEST_CONTEXT(cfg.arch) {
      const std::string dir = (tmp.root / cfg.arch / "adapter").string();
      const std::vector<AdapterTensor> tensors = random_adapter(cfg, 11);
      write_peft_adapter(dir, cfg, "base/" + cfg.arch, tensors);
      BOOST_TEST(fs::exists(fs::path(dir) / "adapter_config.json"));
      BOOST_TEST(!fs::exists(dir + ".partial"));

      // The weights under PEFT's names, fp32, in the layout's order.
      SafetensorsFile file((fs::path(dir) / "adapter_model.safetensors").string());
      const std::vector<TensorSpec> specs = peft_adapter_tensors(cfg);
      BOOST_TEST_REQUIRE(file.tensors().size() == specs.size());
      for (size_t i = 0; i < specs.size(); ++i) {
        BOOST_TEST(file.tensors()[i].name == peft_tensor_name(cfg, specs[i].name));
        BOOST_TEST((file.tensors()[i].dtype == DType::F32));
      }
      if (cfg.arch == "llama")
        BOOST_TEST(file.tensors()[0].name == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
      if (cfg.arch == "bloom")
        BOOST_TEST(file.tensors().back().name == "base_model.model.transformer.ln_f.bias");

      const PeftAdapter read = read_peft_adapter(dir, cfg);
      BOOST_TEST(read.lora.r == cfg.lora.r);
      BOOST_TEST(read.lora.alpha == cfg.lora.alpha);
      BOOST_TEST((read.lora.target_modules == cfg.lora.target_modules));
      BOOST_TEST((read.lora.modules_to_save == cfg.lora.modules_to_save));
      BOOST_TEST(read.base_model_name_or_path == "base/" + cfg.arch);
      check_equal(read, tensors);
      // A model without LoRA of its own reads the adapter's config as it is.
      ModelConfig base = cfg;
      base.lora = LoraConfig{};
      BOOST_TEST(read_peft_adapter(dir, base).lora.r == cfg.lora.r);
    }
  }
}

// A multimodal Gemma 3 folder (Gemma3ForConditionalGeneration, which AutoModelForCausalLM builds from it): the
// adapter names the text model's modules by their paths there (model.language_model.*), target_modules and
// modules_to_save as full paths, which PEFT matches as whole names (a short "q_proj" would also adapt the vision
// tower's q_proj). Read back from the folder, from a checkpoint (whose model config is the text model's), and a
// PEFT adapter of the multimodal model with short names.
BOOST_AUTO_TEST_CASE(a_multimodal_gemma3_adapter_names_the_multimodal_modules) {
  const std::string hf = SHARDLM_SOURCE_DIR "/tests/fixtures/hf/";
  const ModelConfig mm = model_config_from_hf(read_text_file(hf + "tiny_gemma3_mm/config.json"), "mm");
  const ModelConfig text = model_config_from_hf(read_text_file(hf + "tiny_gemma3/config.json"), "text");
  BOOST_TEST_REQUIRE(mm.hf_multimodal);
  BOOST_TEST_REQUIRE(!text.hf_multimodal);
  const ModelConfig cfg = with_lora(mm, {"q_proj", "v_proj"}, {"model.norm"});
  BOOST_TEST(peft_tensor_name(cfg, "layers.0.self_attn.q_proj.lora_A.weight") ==
             "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight");
  BOOST_TEST(peft_tensor_name(cfg, "norm.weight") == "base_model.model.model.language_model.norm.weight");
  const Json j = Json::parse(peft_adapter_config_json(cfg, "/models/gemma3_mm"));
  std::vector<std::string> targets;
  for (const char* m : {"q_proj", "v_proj"})
    for (int i = 0; i < mm.num_layers; ++i) targets.push_back(concat("model.language_model.layers.", i, ".self_attn.", m));
  BOOST_TEST(j.at("target_modules").get<std::vector<std::string>>() == targets, boost::test_tools::per_element());
  BOOST_TEST(j.at("modules_to_save") == Json({"model.language_model.norm"}));
  // The deck's names are the text model's: model.norm selects the final norm alone there too.
  BOOST_TEST_REQUIRE(lora_savable_modules(mm).size() == 1u);
  BOOST_TEST(lora_savable_modules(mm)[0].name == "model.norm");
  BOOST_TEST(lora_savable_modules(mm)[0].path == "model.language_model.norm");

  TempDir tmp{"peft"};
  const std::string dir = (tmp.root / "mm_adapter").string();
  const std::vector<AdapterTensor> tensors = random_adapter(cfg, 13);
  write_peft_adapter(dir, cfg, "/models/gemma3_mm", tensors);
  const std::vector<SafetensorsEntry> file = read_safetensors(dir + "/adapter_model.safetensors");
  BOOST_TEST(file.front().name == "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight");
  const PeftAdapter read = read_peft_adapter(dir, mm);
  BOOST_TEST((read.lora.target_modules == std::vector<std::string>{"q_proj", "v_proj"}));
  BOOST_TEST((read.lora.modules_to_save == cfg.lora.modules_to_save));
  check_equal(read, tensors);
  // The same text model's folder reads it too (its paths say which model they name), as a checkpoint's does.
  check_equal(read_peft_adapter(dir, text), tensors);
  CheckpointMeta meta;
  meta.model = model_config_from_hf(hf_config_json(mm), "checkpoint");
  meta.lora = peft_adapter_config_json(cfg, "/models/gemma3_mm");
  std::string base;
  const ModelConfig from_checkpoint = checkpoint_lora_model(meta, "ckpt.h5", &base);
  BOOST_TEST(from_checkpoint.hf_multimodal);
  BOOST_TEST(base == "/models/gemma3_mm");
  BOOST_TEST(peft_adapter_config_json(from_checkpoint, base) == peft_adapter_config_json(cfg, base));

  // PEFT on the multimodal model with short names: its tensors under model.language_model.*.
  Json short_names = Json::parse(read_text_file(kFixture));
  short_names["r"] = 4;
  short_names["lora_alpha"] = 8;
  short_names["target_modules"] = {"q_proj", "v_proj"};
  short_names["modules_to_save"] = {"model.norm"};
  const std::string peft_dir = adapter_folder(tmp, "peft_mm", short_names.dump(2), cfg, tensors);
  check_equal(read_peft_adapter(peft_dir, mm), tensors);
  // The text model's paths are not the multimodal model's modules: PEFT would match nothing.
  short_names["target_modules"] = {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                                   "model.language_model.layers.1.self_attn.q_proj"};
  BOOST_TEST(contains(error_of([&] { peft_adapter_config_from_json(short_names.dump(), "A", mm); }),
                      "A: target_modules = [\"model.layers.0.self_attn.q_proj\""));
}

// A second write into the folder is refused unless it overwrites; then it replaces its own two
// files and leaves every other one (a README, PEFT's pickle weights) as it was.
BOOST_AUTO_TEST_CASE(a_second_write_replaces_the_adapter_and_keeps_other_files) {
  TempDir tmp{"peft"};
  const ModelConfig cfg = with_lora(tiny_llama(), {"q_proj"});
  const std::string dir = (tmp.root / "adapter").string();
  const std::vector<AdapterTensor> first = random_adapter(cfg, 1);
  write_peft_adapter(dir, cfg, "", first);
  std::ofstream(fs::path(dir) / "README.md") << "notes";
  std::ofstream(fs::path(dir) / "adapter_model.bin") << "a pickle";
  const std::vector<AdapterTensor> second = random_adapter(cfg, 2);
  BOOST_TEST(contains(error_of([&] { write_peft_adapter(dir, cfg, "", second); }), "is not empty: pass --overwrite"));
  check_equal(read_peft_adapter(dir, cfg), first);
  write_peft_adapter(dir, cfg, "", second, /*overwrite=*/true);
  check_equal(read_peft_adapter(dir, cfg), second);
  BOOST_TEST(fs::exists(fs::path(dir) / "README.md"));
  BOOST_TEST(fs::exists(fs::path(dir) / "adapter_model.bin"));
  BOOST_TEST(!fs::exists(dir + ".old"));
  BOOST_TEST(!fs::exists(dir + ".partial"));
}

// adapter_config.json as PEFT 0.21.2 saves it (tests/fixtures/peft, hand-written in its format: keys
// sorted, target_modules in a set's order), with weights in bf16 and fp16 beside it.
BOOST_AUTO_TEST_CASE(a_peft_adapter_config_is_read) {
  const PeftAdapterConfig c = peft_adapter_config_from_json(read_text_file(kFixture), kFixture, tiny_llama());
  BOOST_TEST(c.lora.r == 16);
  BOOST_TEST(c.lora.alpha == 32.0);
  BOOST_TEST(c.lora.dropout == 0.05);
  BOOST_TEST((c.lora.target_modules == std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
  BOOST_TEST(c.lora.modules_to_save.empty());
  BOOST_TEST(!c.lora.use_rslora);
  BOOST_TEST((c.lora.init == LoraInit::Kaiming));
  BOOST_TEST(c.base_model_name_or_path == "meta-llama/Llama-3.1-8B");
  // PEFT's defaults for the keys an older PEFT did not write.
  const PeftAdapterConfig old = peft_adapter_config_from_json(
      R"({"peft_type": "LORA", "r": 8, "target_modules": "all-linear", "init_lora_weights": "gaussian"})", "old.json",
      tiny_llama());
  BOOST_TEST(old.lora.alpha == 8.0);
  BOOST_TEST(old.lora.dropout == 0.0);
  BOOST_TEST((old.lora.target_modules == kLlamaLinear));
  BOOST_TEST((old.lora.init == LoraInit::Gaussian));
  BOOST_TEST(old.base_model_name_or_path.empty());

  TempDir tmp{"peft"};
  ModelConfig cfg = with_lora(tiny_llama(), {"q_proj", "v_proj", "down_proj"}, {}, 16);
  for (DType dtype : {DType::BF16, DType::F16}) {
    std::vector<AdapterTensor> tensors = random_adapter(cfg, 5);
    const std::string dir = adapter_folder(tmp, dtype_name(dtype), read_text_file(kFixture), cfg, tensors, dtype);
    for (AdapterTensor& t : tensors) round_to(dtype, t.values.data(), t.values.size());
    const PeftAdapter read = read_peft_adapter(dir, tiny_llama());
    BOOST_TEST(read.lora.alpha == 32.0);
    check_equal(read, tensors);
  }
}

// Adapters PEFT 0.21 itself saved (tests/fixtures/peft/make_lora_parity.py, for test_peft_parity) on
// the tiny models of tests/fixtures/hf: all-linear saved as every module's full path; the tiny Llama
// also with modules_to_save = ["lm_head"] (PEFT saves the head as base_model.model.lm_head.weight):
// shardlm reads them, and names the tensors it would write for the same settings as PEFT did.
BOOST_AUTO_TEST_CASE(adapters_peft_saved_are_read) {
  const std::string hf = SHARDLM_SOURCE_DIR "/tests/fixtures/hf/";
  const std::string peft = SHARDLM_SOURCE_DIR "/tests/fixtures/peft/";
  for (const auto& [name, fixture, saved] : std::vector<std::tuple<std::string, std::string, std::vector<std::string>>>{
           {"tiny_llama", "tiny_llama_lora", {}},
           {"tiny_bloom", "tiny_bloom_lora", {}},
           {"tiny_llama", "tiny_llama_lora_head", {"lm_head"}}}) {
    BOOST_TEST_CONTEXT(fixture) {
      const std::string config_path = hf + name + "/config.json";
      const ModelConfig cfg = model_config_from_hf(read_text_file(config_path), config_path);
      const std::string dir = peft + fixture;
      const PeftAdapter a = read_peft_adapter(dir, cfg);
      std::vector<std::string> linear;
      for (const LinearModule& m : linear_modules(cfg)) linear.push_back(m.name);
      BOOST_TEST(a.lora.r == 4);
      BOOST_TEST(a.lora.alpha == 8.0);
      BOOST_TEST(a.lora.dropout == 0.0);
      BOOST_TEST(a.lora.target_modules == linear, boost::test_tools::per_element());
      BOOST_TEST(a.lora.modules_to_save == saved, boost::test_tools::per_element());
      BOOST_TEST(a.base_model_name_or_path.find("tests/fixtures/hf/" + name) != std::string::npos);
      // Every tensor of the file, by its layout name, with the file's values.
      const std::vector<SafetensorsEntry> file = read_safetensors(dir + "/adapter_model.safetensors");
      BOOST_TEST(a.tensors.size() == file.size());
      ModelConfig adapted = cfg;
      adapted.lora = a.lora;
      for (const TensorSpec& spec : peft_adapter_tensors(adapted)) {
        const auto it = std::find_if(file.begin(), file.end(),
                                     [&](const SafetensorsEntry& e) { return e.name == peft_tensor_name(adapted, spec.name); });
        BOOST_TEST_REQUIRE((it != file.end()), spec.name);
        BOOST_TEST((a.tensors.at(spec.name).values == it->data), spec.name);
      }
      if (!saved.empty())
        BOOST_TEST(a.tensors.count("lm_head.weight") == 1u);
    }
  }
}

BOOST_AUTO_TEST_CASE(adapter_configs_shardlm_cannot_follow_are_refused) {
  const ModelConfig llama = tiny_llama();
  const auto refusal = [&](const std::function<void(Json&)>& edit, const ModelConfig& model) {
    return error_of([&] { peft_adapter_config_from_json(fixture_with(edit), "A/adapter_config.json", model); });
  };
  // Each message names the file and the key.
  const std::vector<std::pair<std::function<void(Json&)>, std::string>> cases = {
      {[](Json& j) { j["peft_type"] = "LOHA"; }, "A/adapter_config.json: peft_type = \"LOHA\": a LoRA adapter"},
      {[](Json& j) { j.erase("peft_type"); }, "A/adapter_config.json: peft_type: a LoRA adapter"},
      {[](Json& j) { j["task_type"] = "SEQ_CLS"; }, "task_type = \"SEQ_CLS\": a causal language model's adapter"},
      {[](Json& j) { j["bias"] = "lora_only"; }, "bias = \"lora_only\": only \"none\" is supported"},
      {[](Json& j) { j["fan_in_fan_out"] = true; }, "A/adapter_config.json: fan_in_fan_out = true: not supported"},
      {[](Json& j) { j["layers_to_transform"] = {0}; }, "layers_to_transform = [0]: not supported"},
      {[](Json& j) { j["rank_pattern"] = {{"q_proj", 8}}; }, "rank_pattern = {\"q_proj\":8}: not supported"},
      {[](Json& j) { j["alpha_pattern"] = {{"q_proj", 8}}; }, "alpha_pattern = {\"q_proj\":8}: not supported"},
      {[](Json& j) { j["use_dora"] = true; }, "use_dora = true: not supported"},
      {[](Json& j) { j["lora_bias"] = true; }, "lora_bias = true: not supported"},
      {[](Json& j) { j["exclude_modules"] = {"q_proj"}; }, "exclude_modules = [\"q_proj\"]: not supported"},
      {[](Json& j) { j["a_future_option"] = {{"on", true}}; }, "a_future_option = {\"on\":true}: not supported"},
      {[](Json& j) { j["target_modules"] = ".*proj"; }, "target_modules = \".*proj\": a regular expression is not supported"},
      {[](Json& j) { j.erase("target_modules"); }, "target_modules: missing"},
      {[](Json& j) { j["target_modules"] = {"q_proj", "wq"}; },
       "A/adapter_config.json: target_modules = [\"q_proj\",\"wq\"]: 'wq' is not a linear module of llama: must "
       "be q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj or down_proj (or the path of one)"},
      {[](Json& j) { j["target_modules"] = {"mlp"}; }, "'mlp' is not a linear module of llama"},
      {[](Json& j) { j["target_modules"] = {"lm_head"}; }, "'lm_head' is not a linear module of llama"},
      // Paths PEFT matches, but of some layers only (what layers_to_transform would do).
      {[](Json& j) { j["target_modules"] = {"model.layers.1.self_attn.q_proj", "v_proj"}; },
       "target_modules = [\"model.layers.1.self_attn.q_proj\",\"v_proj\"]: adapts q_proj in 1 of 2 layers; "
       "shardlm adapts a module in every layer or in none"},
      {[](Json& j) { j["r"] = 0; }, "r = 0: must be an integer >= 1"},
      {[](Json& j) { j["r"] = 8.5; }, "r = 8.5: must be an integer >= 1"},
      {[](Json& j) { j.erase("r"); }, "A/adapter_config.json: r: must be an integer >= 1"},
      {[](Json& j) { j["lora_alpha"] = -1; }, "lora_alpha = -1: must be > 0"},
      {[](Json& j) { j["lora_alpha"] = "16"; }, "lora_alpha = \"16\": must be a finite number"},
      {[](Json& j) { j["lora_dropout"] = 1.0; }, "lora_dropout = 1.0: must be in [0, 1)"},
      {[](Json& j) { j["use_rslora"] = "yes"; }, "use_rslora = \"yes\": must be true or false"},
      {[](Json& j) { j["init_lora_weights"] = "pissa"; }, "init_lora_weights = \"pissa\": not supported"},
      {[](Json& j) { j["modules_to_save"] = {"score"}; },
       "modules_to_save: 'score' is not a module of llama that can be trained whole: must be embed_tokens, "
       "model.norm or lm_head"},
      // PEFT's "norm" is every norm, the blocks' too: shardlm trains whole only the root's modules.
      {[](Json& j) { j["modules_to_save"] = {"norm"}; },
       "A/adapter_config.json: modules_to_save: 'norm' selects model.layers.0.input_layernorm and 3 more module(s)"},
  };
  for (const auto& [edit, message] : cases) {
    const std::string m = refusal(edit, llama);
    BOOST_TEST(contains(m, message), "'" << message << "' not in: " << m);
  }
  // A tied head and its embedding are one matrix, which PEFT trains as two: refused whatever
  // ensure_weight_tying says; a tied model's final norm is fine, and ensure_weight_tying changes nothing.
  const ModelConfig qwen = tiny_qwen2();
  for (const char* tied : {"lm_head", "embed_tokens", "model.embed_tokens"})
    for (const bool tie : {false, true})
      BOOST_TEST(contains(refusal([&](Json& j) {
                                    j["modules_to_save"] = {tied};
                                    j["ensure_weight_tying"] = tie;
                                  },
                                  qwen),
                          "but this qwen2 model's LM head is tied to its embedding (one matrix)"),
                 tied << " " << tie);
  BOOST_TEST((peft_adapter_config_from_json(fixture_with([](Json& j) {
                                              j["modules_to_save"] = {"model.norm"};
                                              j["ensure_weight_tying"] = true;
                                            }),
                                            "A", qwen)
                  .lora.modules_to_save == std::vector<std::string>{"model.norm"}));
  // PEFT's other spellings of the same modules: a path's end, whole paths of every layer (as PEFT
  // saves all-linear), a path for modules_to_save.
  const PeftAdapterConfig paths = peft_adapter_config_from_json(fixture_with([](Json& j) {
                                    j["target_modules"] = {"self_attn.v_proj", "model.layers.0.mlp.down_proj",
                                                           "model.layers.1.mlp.down_proj"};
                                    j["modules_to_save"] = {"lm_head", "model.embed_tokens", "model.norm"};
                                  }),
                                  "A", llama);
  BOOST_TEST((paths.lora.target_modules == std::vector<std::string>{"v_proj", "down_proj"}));
  BOOST_TEST((paths.lora.modules_to_save == std::vector<std::string>{"embed_tokens", "model.norm", "lm_head"}));
  // Keys that are off, known or not, and keys that change nothing computed, are accepted.
  BOOST_TEST(peft_adapter_config_from_json(fixture_with([](Json& j) {
                                             j["a_future_flag"] = false;
                                             j["peft_version"] = "0.99.0";
                                             j["revision"] = "main";
                                             j["inference_mode"] = false;
                                           }),
                                           "A", llama)
                 .lora.r == 16);
  // EVA: PEFT's LoraConfig always sets eva_config with init_lora_weights = "eva" (how A was initialised from
  // activations, done before training); what it may leave behind (per-layer ranks) is still refused.
  const Json eva = {{"rho", 2.0}, {"tau", 0.99}, {"whiten", false}};
  BOOST_TEST(peft_adapter_config_from_json(fixture_with([&](Json& j) {
                                             j["init_lora_weights"] = "eva";
                                             j["eva_config"] = eva;
                                           }),
                                           "A", llama)
                 .lora.r == 16);
  BOOST_TEST(contains(refusal([&](Json& j) { j["eva_config"] = eva; }, llama), "eva_config = {"));
  BOOST_TEST(contains(refusal([&](Json& j) {
                                j["init_lora_weights"] = "eva";
                                j["eva_config"] = eva;
                                j["rank_pattern"] = {{"model.layers.0.self_attn.q_proj", 8}};
                              },
                              llama),
                      "rank_pattern = {\"model.layers.0.self_attn.q_proj\":8}: not supported"));
  BOOST_TEST(contains(error_of([&] { peft_adapter_config_from_json("{\"r\": ", "A", llama); }), "A: not valid JSON"));
  BOOST_TEST(contains(error_of([&] { peft_adapter_config_from_json("[1]", "A", llama); }), "A: expected a JSON object"));
}

BOOST_AUTO_TEST_CASE(damaged_or_mismatched_adapters_are_refused) {
  TempDir tmp{"peft"};
  const ModelConfig cfg = with_lora(tiny_llama(), {"q_proj", "v_proj", "down_proj"}, {}, 16);
  const std::string config = read_text_file(kFixture);
  const std::string q_a = "layers.0.self_attn.q_proj.lora_A.weight";
  const std::string q_a_peft = "base_model.model.model." + q_a;
  const auto read_error = [&](const std::string& name, const std::vector<AdapterTensor>& tensors) {
    const std::string dir = adapter_folder(tmp, name, config, cfg, tensors);
    return std::make_pair(dir + "/adapter_model.safetensors", error_of([&] { read_peft_adapter(dir, tiny_llama()); }));
  };

  std::string file, m;
  std::vector<AdapterTensor> missing = random_adapter(cfg, 3);
  missing.erase(missing.begin());
  std::tie(file, m) = read_error("missing", missing);
  BOOST_TEST(contains(m, file + ": tensor '" + q_a_peft + "' is missing"), m);

  std::vector<AdapterTensor> extra = random_adapter(cfg, 3);
  extra.push_back({"layers.0.self_attn.k_proj.lora_A.weight", {16, 32}, std::vector<float>(16 * 32)});
  std::tie(file, m) = read_error("extra", extra);
  BOOST_TEST(contains(m, file + ": 1 tensor(s) that the adapter's config has no place for: "
                                "'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight'"), m);

  // Another rank than the config's: r = 8 tensors under r = 16.
  const std::vector<AdapterTensor> rank8 = random_adapter(with_lora(tiny_llama(), {"q_proj", "v_proj", "down_proj"}, {}, 8), 3);
  std::tie(file, m) = read_error("rank", rank8);
  BOOST_TEST(contains(m, file + ": tensor '" + q_a_peft + "' has shape [8, 32], the adapter's config implies [16, 32]"), m);

  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<AdapterTensor> diverged = random_adapter(cfg, 3);
    named(diverged, q_a).values[7] = bad;
    std::tie(file, m) = read_error("diverged", diverged);
    BOOST_TEST(contains(m, file + ": tensor '" + q_a_peft + "' holds "), m);
    BOOST_TEST(contains(m, " at element 7 (every value of an adapter must be finite)"), m);
  }

  // A truncated weights file, a folder without weights (or with PyTorch's pickle only), no folder.
  const std::string dir = adapter_folder(tmp, "truncated", config, cfg, random_adapter(cfg, 3));
  fs::resize_file(dir + "/adapter_model.safetensors", fs::file_size(dir + "/adapter_model.safetensors") - 100);
  BOOST_TEST(contains(error_of([&] { read_peft_adapter(dir, tiny_llama()); }), "safetensors " + dir + "/adapter_model.safetensors"));
  fs::remove(dir + "/adapter_model.safetensors");
  BOOST_TEST(contains(error_of([&] { read_peft_adapter(dir, tiny_llama()); }), "has no adapter_model.safetensors"));
  std::ofstream(dir + "/adapter_model.bin") << "pickle";
  BOOST_TEST(contains(error_of([&] { read_peft_adapter(dir, tiny_llama()); }), "adapter_model.bin, PyTorch's pickle format, is not read"));
  BOOST_TEST(contains(error_of([&] { read_peft_adapter((tmp.root / "nowhere").string(), tiny_llama()); }), "is not a directory"));

  // Another family's model, and a run whose own LoRA disagrees with the file.
  const std::string good = adapter_folder(tmp, "good", config, cfg, random_adapter(cfg, 3));
  m = error_of([&] { read_peft_adapter(good, tiny_bloom()); });
  BOOST_TEST(contains(m, good + "/adapter_config.json: target_modules = "), m);
  BOOST_TEST(contains(m, "'v_proj' is not a linear module of bloom: must be query_key_value, dense"), m);
  BOOST_TEST(contains(error_of([&] { read_peft_adapter(good, with_lora(tiny_llama(), {"q_proj", "v_proj", "down_proj"}, {}, 8)); }),
                      "lora.r = 8 disagrees with " + good + "/adapter_config.json (r = 16)"));
  BOOST_TEST(contains(error_of([&] { read_peft_adapter(good, with_lora(tiny_llama(), {"q_proj"}, {}, 16)); }),
                      "lora.alpha = 8 disagrees with"));
  ModelConfig agreeing = cfg;
  agreeing.lora.alpha = 32;
  agreeing.lora.dropout = 0.3;  // how to go on training: not compared
  BOOST_TEST(read_peft_adapter(good, agreeing).tensors.size() == 12u);
}

BOOST_AUTO_TEST_CASE(writes_of_wrong_tensors_are_refused) {
  TempDir tmp{"peft"};
  const ModelConfig cfg = with_lora(tiny_bloom(), {"dense"});
  const std::string dir = (tmp.root / "adapter").string();
  const std::string a = "h.0.self_attention.dense.lora_A.weight";

  std::vector<AdapterTensor> t = random_adapter(cfg, 1);
  t.pop_back();
  BOOST_TEST(contains(error_of([&] { write_peft_adapter(dir, cfg, "", t); }),
                      "adapter " + dir + ": tensor 'h.1.self_attention.dense.lora_B.weight' is missing"));
  t = random_adapter(cfg, 1);
  t.push_back(t.front());
  BOOST_TEST(contains(error_of([&] { write_peft_adapter(dir, cfg, "", t); }), "tensor '" + a + "' is given twice"));
  t = random_adapter(cfg, 1);
  named(t, a).shape = {24, 4};
  BOOST_TEST(contains(error_of([&] { write_peft_adapter(dir, cfg, "", t); }),
                      "tensor '" + a + "' has shape [24, 4], the adapter's config implies [4, 24]"));
  t = random_adapter(cfg, 1);
  named(t, a).values.pop_back();
  BOOST_TEST(contains(error_of([&] { write_peft_adapter(dir, cfg, "", t); }), "has 95 values for a shape of 96"));
  t = random_adapter(cfg, 1);
  named(t, a).values[0] = std::nanf("");
  BOOST_TEST(contains(error_of([&] { write_peft_adapter(dir, cfg, "", t); }), "holds nan at element 0"));
  BOOST_TEST(contains(error_of([&] { write_peft_adapter(dir, tiny_bloom(), "", {}); }), "LoRA is off"));
  BOOST_TEST(!fs::exists(dir));  // nothing written by a refused write
  BOOST_TEST(!fs::exists(dir + ".partial"));
}
