// Tests of safetensors I/O and the Hugging Face export: round trips, 16-bit input, the malformed-file corpus.
#define BOOST_TEST_MODULE test_safetensors
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "shardlm/io.hpp"

using namespace shardlm;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kCorpusDir = fs::path(SHARDLM_SOURCE_DIR) / "tests/fixtures/safetensors";

// A fresh, empty scratch directory for one test.
fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(SHARDLM_BINARY_DIR) / "test_safetensors" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  BOOST_REQUIRE(out.good());
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

uint64_t parse_le64(const std::string& s) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[i]);
  return v;
}

// A safetensors file from header text and raw data bytes (no padding, as other writers may produce).
std::string st_file(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

std::string le16s(const std::vector<uint16_t>& values) {
  std::string s;
  for (uint16_t v : values) s += {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
  return s;
}

std::string f32s(const std::vector<float>& values) {
  std::string s(values.size() * 4, '\0');
  if (!values.empty()) std::memcpy(s.data(), values.data(), s.size());
  return s;
}

// Runs fn and checks it throws shardlm::Error whose message contains every fragment.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& f : fragments)
      BOOST_TEST(what.find(f) != std::string::npos, "'" << what << "' lacks '" << f << "'");
    return;
  }
  BOOST_FAIL("no shardlm::Error thrown (expected one with '" << fragments.front() << "')");
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

void check_same(const std::vector<SafetensorsEntry>& got, const std::vector<SafetensorsEntry>& want) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    BOOST_TEST(got[i].name == want[i].name);
    BOOST_TEST(got[i].shape == want[i].shape, "shape of " << want[i].name);
    BOOST_REQUIRE_EQUAL(got[i].data.size(), want[i].data.size());
    for (size_t j = 0; j < want[i].data.size(); ++j)
      BOOST_TEST(same_bits(got[i].data[j], want[i].data[j]), want[i].name << "[" << j << "]");
  }
}

// ---- the malformed-file corpus ----

struct Malformed {
  std::string file;
  std::string bytes;
  std::string expect;  // a fragment of the error message
};

std::string f32_entry(const std::string& name, const std::string& shape, uint64_t b, uint64_t e,
                      const std::string& dtype = "F32") {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

// Every case the reader must reject, by the rule it breaks. These bytes are the committed corpus.
std::vector<Malformed> malformed_cases() {
  const std::string four(4, '\0'), eight(8, '\0'), twelve(12, '\0');
  return {
      {"empty.safetensors", "", "too short"},
      {"too_short.safetensors", std::string("\x10\0\0\0\0", 5), "too short"},
      {"header_past_eof.safetensors", le64(1000) + "{}", "runs past the end"},
      {"header_length_huge.safetensors", le64(~uint64_t(0)) + "{}", "exceeds the limit"},
      {"header_not_json.safetensors", st_file("{not json}"), "not valid JSON"},
      {"header_truncated_json.safetensors", st_file("{\"a\":{\"dtype\":\"F3"), "not valid JSON"},
      {"header_not_object.safetensors", st_file("[1, 2]"), "not a JSON object"},
      {"header_bad_utf8.safetensors", st_file("{\"\xff\xfe\":{}}"), "not valid JSON"},
      {"header_deep_nesting.safetensors", st_file(std::string(100, '[') + std::string(100, ']')), "nests deeper"},
      {"duplicate_tensor.safetensors",
       st_file("{" + f32_entry("a", "[1]", 0, 4) + "," + f32_entry("a", "[1]", 0, 4) + "}", four), "twice"},
      {"metadata_not_strings.safetensors", st_file("{\"__metadata__\":{\"format\":1}}"), "not a string"},
      {"entry_not_object.safetensors", st_file("{\"a\":5}"), "entry is not a JSON object"},
      {"missing_dtype.safetensors", st_file("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", four), "no \"dtype\""},
      {"unknown_dtype.safetensors", st_file("{" + f32_entry("a", "[1]", 0, 8, "I64") + "}", eight), "dtype 'I64'"},
      {"negative_shape.safetensors", st_file("{" + f32_entry("a", "[-1]", 0, 4) + "}", four), "not a non-negative"},
      {"fractional_shape.safetensors", st_file("{" + f32_entry("a", "[2.5]", 0, 4) + "}", four), "not a non-negative"},
      {"shape_overflow.safetensors",
       st_file("{" + f32_entry("a", "[4294967296,4294967296,4]", 0, 4) + "}", four), "overflows"},
      {"missing_offsets.safetensors", st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", four), "data_offsets"},
      {"offsets_three_values.safetensors",
       st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", eight), "two non-negative"},
      {"offsets_reversed.safetensors", st_file("{" + f32_entry("a", "[1]", 8, 4) + "}", eight), "end before"},
      {"offsets_past_end.safetensors", st_file("{" + f32_entry("a", "[2]", 0, 8) + "}", four), "run past"},
      {"byte_count_mismatch.safetensors", st_file("{" + f32_entry("a", "[3]", 0, 8) + "}", eight), "need 12"},
      {"bf16_odd_bytes.safetensors", st_file("{" + f32_entry("a", "[3]", 0, 5, "BF16") + "}", eight), "need 6"},
      {"overlapping_tensors.safetensors",
       st_file("{" + f32_entry("a", "[2]", 0, 8) + "," + f32_entry("b", "[2]", 4, 12) + "}", twelve), "overlap"},
      {"empty_inside_other.safetensors",
       st_file("{" + f32_entry("a", "[2]", 0, 8) + "," + f32_entry("b", "[0]", 4, 4) + "}", eight), "overlap"},
  };
}

// A known function of tensor name and element index, exact in fp32: what the export tests' fetch returns.
float known_value(const std::string& name, size_t index) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 16777619u;
  return static_cast<float>(h % 1000) + 0.25f * static_cast<float>(index % 4096);
}

ModelConfig tiny_bloom() {
  ModelConfig cfg;
  cfg.vocab_size = 300;
  cfg.hidden_size = 16;
  cfg.num_heads = 2;
  cfg.num_layers = 2;
  return cfg;
}

// The tiny model's tensors (BLOOM's layout holds no lm_head: it is tied).
std::vector<CheckpointTensor> tiny_tensors(const ModelConfig& cfg) {
  std::vector<CheckpointTensor> tensors;
  for (const auto& unit : model_layout(cfg))
    for (const auto& spec : unit.tensors)
      tensors.push_back({unit.name, spec.name, spec.shape, spec.offset, spec.numel});
  return tensors;
}

std::vector<float> known_values(const CheckpointTensor& t) {
  std::vector<float> v(t.numel);
  for (size_t i = 0; i < v.size(); ++i) v[i] = known_value(t.name, i);
  return v;
}

// Reads back every tensor the export wrote (as "transformer." names) and compares it to known_values.
void check_exported(const std::map<std::string, std::vector<SafetensorsEntry>>& files,
                    const std::vector<CheckpointTensor>& tensors) {
  std::map<std::string, const SafetensorsEntry*> by_name;
  for (const auto& [file, entries] : files)
    for (const auto& e : entries) {
      BOOST_TEST(by_name.count(e.name) == 0u, e.name << " written twice");
      BOOST_TEST(e.name.find("lm_head") == std::string::npos, "lm_head written in " << file);
      by_name[e.name] = &e;
    }
  BOOST_TEST(by_name.size() == tensors.size());
  for (const auto& t : tensors) {
    if (t.name == "lm_head.weight") continue;
    const auto it = by_name.find("transformer." + t.name);
    BOOST_REQUIRE_MESSAGE(it != by_name.end(), "transformer." << t.name << " missing");
    BOOST_TEST(it->second->shape == t.shape, t.name);
    const std::vector<float> want = known_values(t);
    BOOST_TEST(it->second->data == want, t.name);
  }
}

json read_json(const fs::path& path) { return json::parse(read_bytes(path)); }

}  // namespace

// ---- writer and reader ----

BOOST_AUTO_TEST_CASE(round_trip_keeps_names_shapes_values_and_order) {
  const fs::path dir = scratch("round_trip");
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<SafetensorsEntry> tensors = {
      {"z.weight", {2, 3}, {1.5f, -2.25f, 0.0f, -0.0f, 1e-40f, 3.0e38f}},
      {"scalar", {}, {42.0f}},
      {"empty", {0}, {}},
      {"empty_2d", {4, 0}, {}},
      {"a.bias", {5}, {inf, -inf, std::numeric_limits<float>::quiet_NaN(), 1.0f / 3.0f, -7.0f}},
      {"unicode \xc3\xa9\xe2\x82\xac", {1, 1, 2}, {0.5f, 0.125f}},
  };
  const std::string path = (dir / "t.safetensors").string();
  write_safetensors(path, tensors, {{"step", "7"}});
  BOOST_TEST(!fs::exists(path + ".tmp"));
  check_same(read_safetensors(path), tensors);

  const std::string bytes = read_bytes(path);
  const uint64_t n = parse_le64(bytes);
  const json header = json::parse(bytes.substr(8, n));
  BOOST_TEST(header["__metadata__"]["format"] == "pt");
  BOOST_TEST(header["__metadata__"]["step"] == "7");
  BOOST_TEST(header["scalar"]["shape"] == json::array());
  BOOST_TEST(header["empty"]["data_offsets"] == json::array({28, 28}));
  BOOST_TEST(bytes.size() == 8 + n + (6 + 1 + 5 + 2) * 4);

  // An empty file of tensors is valid too.
  write_safetensors(path, {});
  BOOST_TEST(read_safetensors(path).empty());
}

BOOST_AUTO_TEST_CASE(header_is_padded_to_eight_bytes_and_parses) {
  const fs::path dir = scratch("alignment");
  // Names of every length mod 8 exercise every amount of padding.
  for (int len = 1; len <= 16; ++len) {
    const std::string path = (dir / ("a" + std::to_string(len) + ".safetensors")).string();
    const std::vector<SafetensorsEntry> tensors = {{std::string(len, 'w'), {3}, {1, 2, 3}}, {"b", {1}, {4}}};
    write_safetensors(path, tensors);
    const std::string bytes = read_bytes(path);
    const uint64_t n = parse_le64(bytes);
    BOOST_TEST((8 + n) % 8 == 0u);
    const json header = json::parse(bytes.substr(8, n));
    BOOST_TEST(header.at("__metadata__").at("format") == "pt");
    BOOST_TEST(header.at("__metadata__").size() == 1u);
    BOOST_TEST(header.at(std::string(len, 'w')).at("dtype") == "F32");
    BOOST_TEST(header.at("b").at("data_offsets") == json::array({12, 16}));
    float last;
    std::memcpy(&last, bytes.data() + 8 + n + 12, 4);
    BOOST_TEST(last == 4.0f);
    check_same(read_safetensors(path), tensors);
  }
}

BOOST_AUTO_TEST_CASE(sixteen_bit_data_is_converted_to_fp32) {
  const fs::path dir = scratch("sixteen_bit");
  // Header entries out of data order, no padding: written by hand as another writer might.
  const std::string header = "{\"__metadata__\":{\"format\":\"pt\"}," + f32_entry("h", "[2,3]", 8, 20, "F16") + "," +
                             f32_entry("b", "[4]", 0, 8, "BF16") + "," + f32_entry("f", "[1]", 20, 24) + "}";
  const std::string data = le16s({0x3f80, 0xc000, 0x3e20, 0x7f80}) +
                           le16s({0x3c00, 0xc000, 0x3555, 0x0001, 0x7bff, 0x7c00}) + f32s({-1.75f});
  const std::string path = (dir / "half.safetensors").string();
  write_bytes(path, st_file(header, data));
  const auto got = read_safetensors(path);
  const float inf = std::numeric_limits<float>::infinity();
  check_same(got, {{"b", {4}, {1.0f, -2.0f, 0.15625f, inf}},
                   {"h", {2, 3}, {1.0f, -2.0f, 0.333251953125f, std::ldexp(1.0f, -24), 65504.0f, inf}},
                   {"f", {1}, {-1.75f}}});

  // A bf16 tensor larger than the reader's conversion chunk.
  const size_t n = (size_t(1) << 20) + 3;
  std::string big;
  for (size_t i = 0; i < n; ++i) big += le16s({float_to_bf16(static_cast<float>(i % 256))});
  write_bytes(path, st_file("{" + f32_entry("big", "[" + std::to_string(n) + "]", 0, 2 * n, "BF16") + "}", big));
  const auto back = read_safetensors(path);
  BOOST_REQUIRE_EQUAL(back.at(0).data.size(), n);
  bool all_equal = true;
  for (size_t i = 0; i < n; ++i) all_equal &= back[0].data[i] == static_cast<float>(i % 256);
  BOOST_TEST(all_equal);
}

BOOST_AUTO_TEST_CASE(writer_rejects_inconsistent_tensors) {
  const std::string path = (scratch("writer_errors") / "w.safetensors").string();
  expect_error([&] { write_safetensors(path, {{"a", {2, 2}, {1, 2, 3}}}); }, {path, "'a'", "3 values"});
  expect_error([&] { write_safetensors(path, {{"a", {1}, {1}}, {"a", {1}, {2}}}); }, {path, "twice"});
  expect_error([&] { write_safetensors(path, {{"a", {-1}, {}}}); }, {path, "negative"});
  expect_error([&] { write_safetensors(path, {{"__metadata__", {1}, {1}}}); }, {path, "__metadata__"});
  BOOST_TEST(!fs::exists(path));
  expect_error([&] { write_safetensors("/nonexistent-dir/x.safetensors", {}); }, {"/nonexistent-dir/x.safetensors"});
}

BOOST_AUTO_TEST_CASE(malformed_files_are_rejected_naming_the_file) {
  const fs::path dir = scratch("malformed");
  // SHARDLM_REGENERATE_FIXTURES=1 rewrites the committed corpus from this table.
  const bool regenerate = std::getenv("SHARDLM_REGENERATE_FIXTURES") != nullptr;
  for (const auto& c : malformed_cases()) {
    BOOST_TEST_CONTEXT(c.file) {
      const std::string path = (dir / c.file).string();
      write_bytes(path, c.bytes);
      expect_error([&] { read_safetensors(path); }, {"safetensors " + path + ":", c.expect});
      if (regenerate) write_bytes(kCorpusDir / c.file, c.bytes);
      BOOST_TEST(read_bytes(kCorpusDir / c.file) == c.bytes, "corpus file differs from the table");
    }
  }
  expect_error([&] { read_safetensors((dir / "missing.safetensors").string()); },
               {"missing.safetensors", "cannot open"});
  expect_error([&] { read_safetensors(dir.string()); }, {dir.string()});
}

// Every file in the corpus (the table's and any crasher dropped in later) must raise Error, never crash.
BOOST_AUTO_TEST_CASE(regression_corpus_throws_error) {
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(kCorpusDir)) {
    if (!entry.is_regular_file() || entry.path().filename().string().rfind("README", 0) == 0) continue;
    ++files;
    const std::string path = entry.path().string();
    BOOST_TEST_CONTEXT(path) { expect_error([&] { read_safetensors(path); }, {path}); }
  }
  BOOST_TEST(files >= malformed_cases().size());
}

// ---- Hugging Face export ----

namespace {

HfExportOptions ids_only(std::map<std::string, int> ids) {
  HfExportOptions o;
  o.token_ids = std::move(ids);
  return o;
}

HfExportOptions shards_of(size_t max_shard_bytes, DType dtype = DType::F32) {
  HfExportOptions o;
  o.max_shard_bytes = max_shard_bytes;
  o.dtype = dtype;
  return o;
}

// The options with overwrite set: the export may write into a folder that holds files.
HfExportOptions overwriting(HfExportOptions o) {
  o.overwrite = true;
  return o;
}

}  // namespace

BOOST_AUTO_TEST_CASE(export_tiny_bloom_to_one_file) {
  const fs::path dir = scratch("export_single") / "hf";  // the export creates it
  const ModelConfig cfg = tiny_bloom();
  const auto tensors = tiny_tensors(cfg);
  std::vector<std::string> fetched;
  export_hf_model(
      dir.string(), cfg, tensors,
      [&](const CheckpointTensor& t) {
        fetched.push_back(t.name);
        return known_values(t);
      },
      ids_only({{"bos_token_id", 256}, {"eos_token_id", 257}, {"pad_token_id", 258}}));

  BOOST_TEST(fs::exists(dir / "model.safetensors"));
  BOOST_TEST(!fs::exists(dir / "model.safetensors.index.json"));
  BOOST_TEST(fetched.size() == tensors.size());
  check_exported({{"model.safetensors", read_safetensors((dir / "model.safetensors").string())}}, tensors);
  // The file lists tensors in the checkpoint's order.
  const auto back = read_safetensors((dir / "model.safetensors").string());
  for (size_t i = 0; i < back.size(); ++i) BOOST_TEST(back[i].name == "transformer." + tensors[i].name);

  const json config = read_json(dir / "config.json");
  BOOST_TEST(config.at("architectures") == json::array({"BloomForCausalLM"}));
  BOOST_TEST(config.at("model_type") == "bloom");
  BOOST_TEST(config.at("vocab_size") == 300);
  BOOST_TEST(config.at("hidden_size") == 16);
  BOOST_TEST(config.at("n_layer") == 2);
  BOOST_TEST(config.at("n_head") == 2);
  BOOST_TEST(config.at("layer_norm_epsilon").get<double>() == 1e-5);
  BOOST_TEST(config.at("initializer_range").get<double>() == 0.02);
  BOOST_TEST(config.at("apply_residual_connection_post_layernorm") == false);
  BOOST_TEST(config.at("hidden_dropout").get<double>() == 0.0);
  BOOST_TEST(config.at("attention_dropout").get<double>() == 0.0);
  BOOST_TEST(config.at("bos_token_id") == 256);
  BOOST_TEST(config.at("eos_token_id") == 257);
  BOOST_TEST(config.at("pad_token_id") == 258);
  BOOST_TEST(config.at("tie_word_embeddings") == true);
  BOOST_TEST(config.at("use_cache") == true);
  BOOST_TEST(config.at("pretraining_tp") == 1);
  BOOST_TEST(config.at("slow_but_exact") == false);
  BOOST_TEST(config.at("torch_dtype") == "float32");
}

BOOST_AUTO_TEST_CASE(export_tiny_bloom_in_shards_with_an_index) {
  const fs::path dir = scratch("export_sharded");
  const ModelConfig cfg = tiny_bloom();
  const auto tensors = tiny_tensors(cfg);
  const size_t max_shard = 5000;  // below the 19200-byte embeddings, above every block matrix
  // How many shard files exist when each tensor is fetched: shard k's tensors must see k - 1.
  std::map<std::string, size_t> files_at_fetch;
  export_hf_model(dir.string(), cfg, tensors,
                  [&](const CheckpointTensor& t) {
                    // The export is written into DIR.partial, which takes DIR's place when complete.
                    size_t n = 0;
                    for (const auto& e : fs::directory_iterator(dir.string() + ".partial"))
                      n += e.path().extension() == ".safetensors";
                    files_at_fetch["transformer." + t.name] = n;
                    return known_values(t);
                  },
                  shards_of(max_shard));

  const json index = read_json(dir / "model.safetensors.index.json");
  BOOST_TEST(!fs::exists(dir / "model.safetensors"));
  size_t total = 0;
  for (const auto& t : tensors)
    if (t.name != "lm_head.weight") total += t.numel * 4;
  BOOST_TEST(index.at("metadata").at("total_size").get<size_t>() == total);

  const json& weight_map = index.at("weight_map");
  std::set<std::string> files;
  for (const auto& [name, file] : weight_map.items()) files.insert(file.get<std::string>());
  BOOST_TEST(files.size() > 2u);
  const std::regex pattern("model-(\\d{5})-of-(\\d{5})\\.safetensors");
  std::map<std::string, std::vector<SafetensorsEntry>> contents;
  size_t next_index = 1;
  for (const auto& file : files) {  // sorted: shard 1, 2, ...
    std::smatch m;
    BOOST_REQUIRE(std::regex_match(file, m, pattern));
    BOOST_TEST(std::stoul(m[1]) == next_index);
    BOOST_TEST(std::stoul(m[2]) == files.size());
    contents[file] = read_safetensors((dir / file).string());
    size_t bytes = 0;
    for (const auto& e : contents[file]) {
      bytes += e.data.size() * 4;
      BOOST_TEST(weight_map.at(e.name) == file, e.name);  // the index names the file that holds it
      BOOST_TEST(files_at_fetch.at(e.name) == next_index - 1, e.name << " fetched before its shard's turn");
    }
    ++next_index;
    BOOST_TEST((bytes <= max_shard || contents[file].size() == 1u), file << " holds " << bytes << " bytes");
  }
  BOOST_TEST(weight_map.size() == tensors.size());
  BOOST_TEST(weight_map.count("lm_head.weight") == 0u);
  BOOST_TEST(weight_map.count("transformer.lm_head.weight") == 0u);
  check_exported(contents, tensors);
  // The embeddings, larger than the limit, fill the first file alone.
  BOOST_TEST(contents.at(*files.begin()).size() == 1u);
  BOOST_TEST(contents.at(*files.begin()).at(0).name == "transformer.word_embeddings.weight");

  // Exporting again as a single file removes the shards and the index of the earlier export.
  export_hf_model(dir.string(), cfg, tensors, known_values, overwriting({}));
  for (const auto& file : files) BOOST_TEST(!fs::exists(dir / file));
  BOOST_TEST(!fs::exists(dir / "model.safetensors.index.json"));
  check_exported({{"model.safetensors", read_safetensors((dir / "model.safetensors").string())}}, tensors);

  // An export that fails part-way leaves the earlier one as it was, and a file that is not an
  // export's (a tokenizer put beside the weights) survives a successful one.
  {
    std::ofstream(dir / "tokenizer.json") << "{}";
  }
  const auto before = fs::file_size(dir / "model.safetensors");
  BOOST_CHECK_THROW(export_hf_model(dir.string(), cfg, tensors,
                                    [&](const CheckpointTensor& t) -> std::vector<float> {
                                      if (t.name == "ln_f.weight") throw Error("disk full (simulated)");
                                      return known_values(t);
                                    },
                                    overwriting(shards_of(max_shard))),
                    Error);
  BOOST_TEST(!fs::exists(dir.string() + ".partial"));
  BOOST_TEST(fs::file_size(dir / "model.safetensors") == before);
  BOOST_TEST(!fs::exists(dir / "model.safetensors.index.json"));
  check_exported({{"model.safetensors", read_safetensors((dir / "model.safetensors").string())}}, tensors);
  export_hf_model(dir.string(), cfg, tensors, known_values, overwriting(shards_of(max_shard)));
  BOOST_TEST(fs::exists(dir / "tokenizer.json"));
  BOOST_TEST(fs::exists(dir / "model.safetensors.index.json"));
  BOOST_TEST(!fs::exists(dir / "model.safetensors"));
  BOOST_TEST(!fs::exists(dir.string() + ".old"));
}

// A model directory whose weights hold a NaN or an infinity: reading the slice names the file, the
// tensor and the element, rather than training until the loss is not finite.
BOOST_AUTO_TEST_CASE(non_finite_weights_are_named_when_read) {
  const ModelConfig cfg = tiny_bloom();
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    const fs::path dir = scratch("non_finite") / "hf";
    export_hf_model(dir.string(), cfg, tiny_tensors(cfg), [&](const CheckpointTensor& t) {
      std::vector<float> v = known_values(t);
      if (t.name == "h.1.self_attention.dense.weight") v[5] = bad;
      return v;
    });
    HfModelDir model(dir.string());
    expect_error(
        [&] {
          for (size_t u = 0; u < model.layout().size(); ++u) {
            std::vector<float> buf(model.layout()[u].numel);
            model.read_unit_slice(u, 0, buf.size(), buf.data());
          }
        },
        {"model.safetensors", "tensor 'transformer.h.1.self_attention.dense.weight' holds", "at element 5"});
  }
}

BOOST_AUTO_TEST_CASE(export_rejects_a_wrong_fetch) {
  const fs::path dir = scratch("export_bad_fetch");
  const ModelConfig cfg = tiny_bloom();
  expect_error([&] { export_hf_model(dir.string(), cfg, tiny_tensors(cfg), [](const CheckpointTensor&) {
                 return std::vector<float>(3);
               }); },
               {"word_embeddings.weight", "fetched 3 values"});
}

BOOST_AUTO_TEST_CASE(export_in_bf16_and_fp16_halves_the_bytes_and_says_so) {
  const ModelConfig cfg = tiny_bloom();
  const auto tensors = tiny_tensors(cfg);
  for (const DType dtype : {DType::BF16, DType::F16}) {
    const fs::path dir = scratch(concat("export_", dtype_name(dtype)));
    // A limit that shards fp32 (the 19200-byte embeddings alone exceed it) but not 16-bit weights'
    // embeddings: 9600 bytes.
    export_hf_model(dir.string(), cfg, tensors, known_values, shards_of(10000, dtype));
    const json config = read_json(dir / "config.json");
    BOOST_TEST(config.at("torch_dtype") == (dtype == DType::BF16 ? "bfloat16" : "float16"));
    const json index = read_json(dir / "model.safetensors.index.json");
    size_t total = 0;
    for (const auto& t : tensors) total += t.numel * 2;
    BOOST_TEST(index.at("metadata").at("total_size").get<size_t>() == total);
    std::set<std::string> files;
    for (const auto& [name, file] : index.at("weight_map").items()) files.insert(file.get<std::string>());
    for (const std::string& file : files) {
      const std::string header = read_bytes(dir / file).substr(8, 200);
      BOOST_TEST(header.find(dtype == DType::BF16 ? "\"dtype\":\"BF16\"" : "\"dtype\":\"F16\"") != std::string::npos, header);
      for (const SafetensorsEntry& e : read_safetensors((dir / file).string())) {
        const CheckpointTensor* t = nullptr;
        for (const auto& c : tensors)
          if ("transformer." + c.name == e.name) t = &c;
        BOOST_TEST_REQUIRE(t != nullptr);
        const std::vector<float> want = known_values(*t);
        for (size_t i = 0; i < want.size(); ++i) BOOST_TEST(e.data[i] == round_to(dtype, want[i]));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(export_writes_generation_config_and_the_given_files) {
  const ModelConfig cfg = tiny_bloom();
  const fs::path dir = scratch("export_files");
  HfExportOptions options = ids_only({{"bos_token_id", 1}, {"eos_token_id", 2}});
  options.text_files["tokenizer.json"] = "{}\n";
  export_hf_model(dir.string(), cfg, tiny_tensors(cfg), known_values, options);
  const json generation = read_json(dir / "generation_config.json");
  BOOST_TEST(generation.at("bos_token_id") == 1);
  BOOST_TEST(generation.at("eos_token_id") == 2);
  BOOST_TEST(!generation.contains("pad_token_id"));
  BOOST_TEST(read_bytes(dir / "tokenizer.json") == "{}\n");
  // A source model's generation_config.json is copied as it is, not written.
  const fs::path source = scratch("export_files_source");
  fs::create_directories(source);
  write_bytes((source / "generation_config.json").string(), "{\"do_sample\": true, \"eos_token_id\": 2}\n");
  options.copy_files = {(source / "generation_config.json").string()};
  options.overwrite = true;
  export_hf_model(dir.string(), cfg, tiny_tensors(cfg), known_values, options);
  BOOST_TEST(read_json(dir / "generation_config.json").at("do_sample") == true);
  options.copy_files = {(source / "missing.json").string()};
  expect_error([&] { export_hf_model(dir.string(), cfg, tiny_tensors(cfg), known_values, options); }, {"missing.json"});
}


namespace {

// Every entry under ROOT (relative path -> contents, or "<dir>" / "-> target" for a folder / link).
std::map<std::string, std::string> tree_of(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const std::string rel = fs::relative(it->path(), root).string();
    if (it->is_symlink()) out[rel] = "-> " + fs::read_symlink(it->path()).string();
    else if (it->is_directory()) out[rel] = "<dir>";
    else out[rel] = read_bytes(it->path());
  }
  return out;
}

}  // namespace

// An export into a folder that holds files is refused without overwrite; with it, each file the
// export writes replaces its namesake, an earlier export's weight files it did not write again go,
// and every other entry (files, folders, a file named like a shard's folder) stays byte-identical.
BOOST_AUTO_TEST_CASE(export_into_a_non_empty_folder_needs_overwrite_and_keeps_other_files) {
  const fs::path root = scratch("export_overwrite");
  const fs::path dir = root / "out";
  const ModelConfig cfg = tiny_bloom();
  fs::create_directories(dir / "notes");
  write_bytes((dir / "README.md").string(), "mine\n");
  write_bytes((dir / "notes" / "model.safetensors").string(), "not the export's\n");
  write_bytes((dir / "model.safetensors.bak").string(), "a copy\n");
  const auto before = tree_of(dir);
  expect_error([&] { export_hf_model(dir.string(), cfg, tiny_tensors(cfg), known_values); },
               {dir.string(), "is not empty: pass --overwrite"});
  BOOST_TEST((tree_of(dir) == before));
  BOOST_TEST(!fs::exists(dir.string() + ".partial"));

  // Sharded, then a single file: the shards and their index go, the user's files stay.
  export_hf_model(dir.string(), cfg, tiny_tensors(cfg), known_values, overwriting(shards_of(5000)));
  BOOST_TEST(fs::exists(dir / "model.safetensors.index.json"));
  export_hf_model(dir.string(), cfg, tiny_tensors(cfg), known_values, overwriting({}));
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  BOOST_TEST((names == std::set<std::string>{"README.md", "config.json", "generation_config.json", "model.safetensors",
                                             "model.safetensors.bak", "notes"}));
  for (const auto& [rel, text] : before) BOOST_TEST(tree_of(dir).at(rel) == text, rel);
  BOOST_TEST(!fs::exists(dir.string() + ".partial"));

  // A folder where the export writes a file is the user's: refused, nothing moved, the new files
  // left in DIR.partial.
  fs::remove(dir / "config.json");
  fs::create_directories(dir / "config.json");
  const auto with_folder = tree_of(dir);
  expect_error([&] { export_hf_model(dir.string(), cfg, tiny_tensors(cfg), known_values, overwriting({})); },
               {(dir / "config.json").string(), "is not a regular file"});
  BOOST_TEST((tree_of(dir) == with_folder));
}

// Files named like an export's weights that no export wrote (no "writer": "shardlm" mark) are the
// user's: an overwriting export never removes them, and refuses while they are of another layout than
// its own (they would stay beside the new weights); an earlier export's own it removes.
BOOST_AUTO_TEST_CASE(an_overwriting_export_removes_only_weights_an_export_wrote) {
  const fs::path dir = scratch("export_foreign_weights") / "out";
  const ModelConfig cfg = tiny_bloom();
  // An earlier export, sharded: its shards and index carry the mark.
  export_hf_model(dir.string(), cfg, tiny_tensors(cfg), known_values, overwriting(shards_of(5000)));
  std::set<std::string> earlier;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("model-", 0) == 0) earlier.insert(e.path().filename().string());
  BOOST_TEST_REQUIRE(earlier.size() >= 2u);
  // The user's: a safetensors shard of another model and an index, under names the export uses.
  write_safetensors((dir / "model-00097-of-00099.safetensors").string(), {{"x", {2}, {1, 2}}});
  write_bytes((dir / "model-00098-of-00099.safetensors").string(), "not even safetensors\n");
  fs::remove(dir / "model.safetensors.index.json");
  write_bytes((dir / "model.safetensors.index.json").string(), "{\"metadata\": {}, \"weight_map\": {}}\n");
  const auto before = tree_of(dir);

  // One file now: the user's sharded weights would stay beside it (a loader picks one of the two), so the
  // export is refused before it writes anything, naming one of them.
  expect_error([&] { export_hf_model(dir.string(), cfg, tiny_tensors(cfg), known_values, overwriting({})); },
               {"holds weights shardlm did not write, in another layout than this export's (model.safetensors)"});
  BOOST_TEST((tree_of(dir) == before));
  BOOST_TEST(!fs::exists(dir.string() + ".partial"));
  // Once the user's files are moved away, the earlier export's shards go and the one file comes.
  for (const char* mine : {"model-00097-of-00099.safetensors", "model-00098-of-00099.safetensors",
                           "model.safetensors.index.json"})
    fs::remove(dir / mine);
  export_hf_model(dir.string(), cfg, tiny_tensors(cfg), known_values, overwriting({}));
  const auto after = tree_of(dir);
  for (const std::string& name : earlier) BOOST_TEST(after.count(name) == 0u, name);  // the export's own: gone
  BOOST_TEST(after.count("model.safetensors") == 1u);
  BOOST_TEST(!fs::exists(dir.string() + ".partial"));
}

// DIR.partial left by someone is an error naming it and is not touched; a DIR that is a symbolic
// link is refused and the folder it points to stays as it was.
BOOST_AUTO_TEST_CASE(export_refuses_a_leftover_partial_and_a_symbolic_link) {
  const fs::path root = scratch("export_refusals");
  const ModelConfig cfg = tiny_bloom();
  const fs::path dir = root / "out";
  fs::create_directories(root / "out.partial");
  write_bytes((root / "out.partial" / "keep.txt").string(), "kept\n");
  for (const bool overwrite : {false, true}) {
    HfExportOptions options;
    options.overwrite = overwrite;
    expect_error([&] { export_hf_model(dir.string(), cfg, tiny_tensors(cfg), known_values, options); },
                 {(root / "out.partial").string(), "exists", "it is not removed"});
    BOOST_TEST(read_bytes(root / "out.partial" / "keep.txt") == "kept\n");
    BOOST_TEST(!fs::exists(dir));
  }

  const fs::path target = root / "elsewhere";
  fs::create_directories(target);
  write_bytes((target / "model.safetensors").string(), "the user's\n");
  write_bytes((target / "other").string(), "x");
  fs::create_directory_symlink(target, root / "link");
  const auto before = tree_of(target);
  for (const std::string& given : {(root / "link").string(), (root / "link").string() + "/"})
    for (const bool overwrite : {false, true}) {
      HfExportOptions options;
      options.overwrite = overwrite;
      expect_error([&] { export_hf_model(given, cfg, tiny_tensors(cfg), known_values, options); },
                   {(root / "link").string(), "is a symbolic link"});
      BOOST_TEST((tree_of(target) == before));
      BOOST_TEST(fs::is_symlink(root / "link"));
      BOOST_TEST(!fs::exists(root / "link.partial"));
    }
}
