// Learning-rate schedules against transformers' own: tests/fixtures/schedules/schedules.json holds the
// rate of every optimizer step that get_scheduler gives for each schedule name, both warm-up forms and
// a few step counts and arguments (made on a machine with transformers by make_schedule_fixtures.py).
#define BOOST_TEST_MODULE test_schedules
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "shardlm/config.hpp"
#include "shardlm/optim.hpp"

using namespace shardlm;

namespace {

LrSchedule schedule_named(const std::string& name) {
  for (LrSchedule s : {LrSchedule::Linear, LrSchedule::Constant, LrSchedule::ConstantWithWarmup, LrSchedule::Cosine,
                       LrSchedule::CosineWithRestarts, LrSchedule::Polynomial, LrSchedule::CosineWithMinLr})
    if (name == lr_schedule_name(s)) return s;
  BOOST_FAIL("no schedule named " << name);
  return LrSchedule::Linear;
}

nlohmann::json fixtures() {
  std::ifstream in(std::string(SHARDLM_SOURCE_DIR) + "/tests/fixtures/schedules/schedules.json");
  BOOST_REQUIRE(in);
  return nlohmann::json::parse(in);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_schedule_matches_transformers_per_step) {
  const nlohmann::json doc = fixtures();
  std::set<std::string> names;
  std::set<std::pair<bool, bool>> warmup_forms;
  size_t steps_checked = 0;
  for (const nlohmann::json& c : doc.at("cases")) {
    const std::string name = c.at("name");
    const double lr = c.at("lr");
    const long total = c.at("total");
    const int warmup_steps = c.at("warmup_steps");
    const double warmup_ratio = c.at("warmup_ratio");
    const long warmup = resolved_warmup_steps(warmup_steps, warmup_ratio, total);
    BOOST_TEST_CONTEXT(name << " lr " << lr << " total " << total << " warmup_steps " << warmup_steps
                            << " warmup_ratio " << warmup_ratio << " kwargs " << c.at("kwargs").dump()) {
      BOOST_TEST(warmup == c.at("warmup").get<long>());
      TrainSection t;
      const nlohmann::json& kw = c.at("kwargs");
      if (kw.contains("num_cycles")) t.lr_num_cycles = kw.at("num_cycles");
      if (kw.contains("power")) t.lr_power = kw.at("power");
      if (kw.contains("lr_end")) t.lr_end = kw.at("lr_end");
      if (kw.contains("min_lr_rate")) t.min_lr_ratio = kw.at("min_lr_rate");
      const LrSchedule s = schedule_named(name);
      const std::vector<double> want = c.at("lrs");
      BOOST_REQUIRE(want.size() == static_cast<size_t>(total + 1));
      for (long k = 0; k <= total; ++k) {
        const double got = scheduled_lr(s, lr, k, warmup, total, lr_schedule_args(t));
        BOOST_TEST(std::abs(got - want[k]) <= 1e-7 * std::max(1.0, lr), "step " << k << ": " << got << " vs " << want[k]);
        ++steps_checked;
      }
    }
    names.insert(name);
    warmup_forms.insert({warmup_steps > 0, warmup_ratio > 0});
  }
  // Every name shardlm accepts is in the fixture, with both warm-up forms.
  for (const char* n : {"linear", "constant", "constant_with_warmup", "cosine", "cosine_with_restarts", "polynomial",
                        "cosine_with_min_lr"})
    BOOST_TEST(names.count(n) == 1u, n);
  BOOST_TEST(warmup_forms.count({true, false}) == 1u);
  BOOST_TEST(warmup_forms.count({false, true}) == 1u);
  BOOST_TEST(warmup_forms.count({true, true}) == 1u);  // warmup_steps wins over warmup_ratio
  BOOST_TEST(steps_checked > 10000u);
}

BOOST_AUTO_TEST_CASE(warmup_ratio_rounds_up_and_steps_win) {
  BOOST_TEST(resolved_warmup_steps(0, 0.1, 37) == 4);   // ceil(3.7)
  BOOST_TEST(resolved_warmup_steps(0, 0.25, 100) == 25);
  BOOST_TEST(resolved_warmup_steps(5, 0.5, 100) == 5);  // warmup_steps wins when both are set
  BOOST_TEST(resolved_warmup_steps(0, 0.0, 100) == 0);
}

// What deck.md and the decks say of the schedules' end: transformers' lambdas reach it at step N (total), one
// past the run's last step N - 1, which runs at lr / (N - W) with `linear` and above lr_end with `polynomial`.
BOOST_AUTO_TEST_CASE(the_decay_ends_one_step_past_the_last) {
  const nlohmann::json doc = fixtures();
  size_t checked = 0;
  for (const nlohmann::json& c : doc.at("cases")) {
    const std::string name = c.at("name");
    const double lr = c.at("lr");
    const long total = c.at("total"), warmup = c.at("warmup");
    if ((name != "linear" && name != "polynomial") || total - warmup < 2) continue;
    const std::vector<double> want = c.at("lrs");
    TrainSection t;
    if (c.at("kwargs").contains("lr_end")) t.lr_end = c.at("kwargs").at("lr_end");
    if (c.at("kwargs").contains("power")) t.lr_power = c.at("kwargs").at("power");
    const LrSchedule s = schedule_named(name);
    const double last = scheduled_lr(s, lr, total - 1, warmup, total, lr_schedule_args(t));
    const double end = scheduled_lr(s, lr, total, warmup, total, lr_schedule_args(t));
    BOOST_TEST_CONTEXT(name << " lr " << lr << " total " << total << " warmup " << warmup) {
      if (name == "linear") {
        BOOST_TEST(want[total] == 0.0);
        BOOST_TEST(end == 0.0);
        BOOST_TEST(last == lr / static_cast<double>(total - warmup), boost::test_tools::tolerance(1e-12));
        BOOST_TEST(want[total - 1] == lr / static_cast<double>(total - warmup), boost::test_tools::tolerance(1e-6));
      } else {
        BOOST_TEST(end == t.lr_end, boost::test_tools::tolerance(1e-12));
        BOOST_TEST(want[total] == t.lr_end, boost::test_tools::tolerance(1e-6));
        BOOST_TEST(last > t.lr_end);
        BOOST_TEST(want[total - 1] > t.lr_end);
      }
    }
    ++checked;
  }
  BOOST_TEST(checked >= 2u);
}
