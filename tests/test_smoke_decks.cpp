#define BOOST_TEST_MODULE test_smoke_decks
#include <boost/test/unit_test.hpp>
// test_smoke_decks: every deck under input/ trains as a smoke run (`shardlm train DECK --tiny`) on the
// CPU backend on two ranks, as shipped: its model family at a tiny size, its data or synthetic text
// where its files are not here (the real models and data sets are not in CI), two optimizer steps.

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "launch_support.hpp"
#include "temp_dir.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using shardlm::concat;

namespace {

const fs::path kInput = fs::path(SHARDLM_SOURCE_DIR) / "input";

std::set<std::string> decks() {
  std::set<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(kInput))
    if (e.is_regular_file() && e.path().extension() == ".ini") found.insert(e.path().lexically_relative(kInput).generic_string());
  return found;
}

// The "type" of each line of a metrics.jsonl.
size_t records_of(const fs::path& metrics, const std::string& type) {
  std::ifstream in(metrics);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += contains(line, "\"type\":\"" + type + "\"");
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_shipped_deck_smoke_runs_on_the_cpu_backend) {
  const std::set<std::string> all = decks();
  BOOST_REQUIRE_GE(all.size(), 20u);
  TempDir tmp("smoke_decks");
  for (const std::string& deck : all) {
    BOOST_TEST_CONTEXT(deck) {
      const fs::path run = tmp.root / fs::path(deck).replace_extension("");
      const Outcome o = run_shardlm(2, concat("train ", (kInput / deck).string(), " --tiny --run.backend=cpu --run.dir=",
                                              run.string()));
      BOOST_TEST_INFO(o.output);
      BOOST_TEST(o.exit_code == 0);
      BOOST_TEST(contains(o.output, "smoke run: "));
      BOOST_TEST(records_of(run / "metrics.jsonl", "train") == 2u);
      BOOST_TEST(o.seconds < 60.0);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_smoke_run_keeps_the_family_shape_and_says_what_it_replaced) {
  TempDir tmp("smoke_shape");
  // Qwen2.5-0.5B's shape in the deck: 7 query heads per key/value head and a tied head survive.
  const Outcome o = run_shardlm(1, concat("train ", (kInput / "bench/qwen25-05b.ini").string(),
                                          " --run.smoke=true --run.backend=cpu --fsdp.param_dtype=fp32 --run.dir=",
                                          (tmp.root / "q").string()));
  BOOST_TEST_INFO(o.output);
  BOOST_TEST(o.exit_code == 0);
  BOOST_TEST(contains(o.output, "smoke run: qwen2 of 2 layers, width 224, 14 heads over 2 key/value heads, tied head"));
  BOOST_TEST(contains(o.output, "bench_data.jsonl': file not found"));
  BOOST_TEST(contains(o.output, "synthetic text instead"));
  const std::string resolved = read_text_file((tmp.root / "q" / "deck.resolved.ini").string());
  BOOST_TEST(contains(resolved, "smoke = true"));
  BOOST_TEST(contains(resolved, "num_layers = 2\n"));
}
