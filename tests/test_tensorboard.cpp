// TensorBoard event files: CRC32C against known vectors, the TFRecord framing and the Event protos
// read back by a small reader here (tests/fixtures/tensorboard/read_events.py reads them with
// TensorBoard's own reader), a writer's file; Trainer's early stopping rule on a sequence of losses.
#define BOOST_TEST_MODULE test_tensorboard
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tensorboard.hpp"
#include "train_run.hpp"

using namespace shardlm;
namespace fs = std::filesystem;

namespace {

// ---- a reader of what the writer writes: TFRecord frames, then protobuf fields -----------------

template <typename T>
T little(const std::string& s, size_t at) {
  T v;
  BOOST_REQUIRE(at + sizeof(T) <= s.size());
  std::memcpy(&v, s.data() + at, sizeof(T));
  return v;
}

// The records of a TFRecord file, each CRC checked.
std::vector<std::string> read_records(const std::string& bytes) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    const uint64_t n = little<uint64_t>(bytes, at);
    BOOST_TEST(little<uint32_t>(bytes, at + 8) == masked_crc32c(bytes.data() + at, 8));
    BOOST_REQUIRE(at + 12 + n + 4 <= bytes.size());
    const std::string data = bytes.substr(at + 12, n);
    BOOST_TEST(little<uint32_t>(bytes, at + 12 + n) == masked_crc32c(data.data(), data.size()));
    out.push_back(data);
    at += 12 + n + 4;
  }
  return out;
}

struct Field {
  uint32_t number = 0, wire = 0;
  uint64_t varint = 0;  // wire 0, or the raw bits of fixed64 / fixed32
  std::string bytes;    // wire 2
};

uint64_t get_varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    BOOST_REQUIRE(at < s.size());
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

std::vector<Field> fields(const std::string& s) {
  std::vector<Field> out;
  size_t at = 0;
  while (at < s.size()) {
    Field f;
    const uint64_t key = get_varint(s, at);
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire = static_cast<uint32_t>(key & 7);
    if (f.wire == 0) f.varint = get_varint(s, at);
    else if (f.wire == 1) { f.varint = little<uint64_t>(s, at); at += 8; }
    else if (f.wire == 5) { f.varint = little<uint32_t>(s, at); at += 4; }
    else if (f.wire == 2) { const uint64_t n = get_varint(s, at); f.bytes = s.substr(at, n); at += n; }
    else BOOST_FAIL("wire type " << f.wire);
    out.push_back(f);
  }
  return out;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> scalars;
};

Event parse_event(const std::string& record) {
  Event e;
  for (const Field& f : fields(record)) {
    if (f.number == 1 && f.wire == 1) std::memcpy(&e.wall_time, &f.varint, 8);
    else if (f.number == 2 && f.wire == 0) e.step = static_cast<int64_t>(f.varint);
    else if (f.number == 3 && f.wire == 2) e.file_version = f.bytes;
    else if (f.number == 5 && f.wire == 2) {
      for (const Field& v : fields(f.bytes)) {
        BOOST_TEST_REQUIRE(v.number == 1u);
        std::string tag;
        float value = 0;
        for (const Field& g : fields(v.bytes)) {
          if (g.number == 1) tag = g.bytes;
          if (g.number == 2 && g.wire == 5) {
            const auto bits = static_cast<uint32_t>(g.varint);
            std::memcpy(&value, &bits, 4);
          }
        }
        e.scalars.emplace_back(tag, value);
      }
    } else BOOST_FAIL("unexpected Event field " << f.number);
  }
  return e;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

BOOST_AUTO_TEST_CASE(crc32c_matches_known_vectors) {
  BOOST_TEST(crc32c("123456789", 9) == 0xE3069283u);  // the CRC catalogue's check value
  const std::string zeros(32, '\0'), ones(32, '\xff');
  BOOST_TEST(crc32c(zeros.data(), 32) == 0x8A9136AAu);  // RFC 3720, B.4
  BOOST_TEST(crc32c(ones.data(), 32) == 0x62A8AB43u);
  std::string inc(32, '\0');
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<char>(i);
  BOOST_TEST(crc32c(inc.data(), 32) == 0x46DD794Eu);
  BOOST_TEST(crc32c("", 0) == 0u);
  const uint32_t c = crc32c("123456789", 9);
  BOOST_TEST(masked_crc32c("123456789", 9) == static_cast<uint32_t>(((c >> 15) | (c << 17)) + 0xa282ead8u));
}

BOOST_AUTO_TEST_CASE(frames_and_events_read_back) {
  const std::string e1 = file_version_event(1700000000.5);
  const std::string e2 = scalars_event(1700000001.25, 42, {{"train/loss", 2.5}, {"train/learning_rate", 5e-5}});
  const std::vector<std::string> records = read_records(tfrecord_frame(e1) + tfrecord_frame(e2));
  BOOST_TEST_REQUIRE(records.size() == 2u);
  const Event a = parse_event(records[0]), b = parse_event(records[1]);
  BOOST_TEST(a.file_version == "brain.Event:2");
  BOOST_TEST(a.wall_time == 1700000000.5);
  BOOST_TEST(b.step == 42);
  BOOST_TEST(b.wall_time == 1700000001.25);
  BOOST_TEST_REQUIRE(b.scalars.size() == 2u);
  BOOST_TEST(b.scalars[0].first == "train/loss");
  BOOST_TEST(b.scalars[0].second == 2.5f);
  BOOST_TEST(b.scalars[1].first == "train/learning_rate");
  BOOST_TEST(b.scalars[1].second == 5e-5f);
  // A long tag takes a two-byte length varint.
  const std::string tag(200, 'x');
  const Event c = parse_event(read_records(tfrecord_frame(scalars_event(1, 300, {{tag, -1.0}})))[0]);
  BOOST_TEST(c.scalars.at(0).first == tag);
  BOOST_TEST(c.step == 300);
}

BOOST_AUTO_TEST_CASE(a_writer_makes_a_new_file_per_start) {
  const fs::path dir = fs::temp_directory_path() / ("shardlm_tb_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string first, second;
  {
    TensorBoardWriter w(dir.string());
    w.scalars(1, {{"train/loss", 3.0}});
    w.scalars(2, {{"train/loss", 2.0}});
    first = w.path();
  }
  {
    TensorBoardWriter w(dir.string());  // a resume: same folder, same second, its own file
    w.scalars(3, {{"eval/loss", 1.5}});
    second = w.path();
  }
  BOOST_TEST(first != second);
  BOOST_TEST(fs::path(first).filename().string().rfind("events.out.tfevents.", 0) == 0u);
  const std::vector<std::string> r1 = read_records(slurp(first)), r2 = read_records(slurp(second));
  BOOST_TEST_REQUIRE(r1.size() == 3u);
  BOOST_TEST(parse_event(r1[0]).file_version == "brain.Event:2");
  BOOST_TEST(parse_event(r1[2]).step == 2);
  BOOST_TEST(parse_event(r1[2]).scalars.at(0).second == 2.0f);
  BOOST_TEST_REQUIRE(r2.size() == 2u);
  BOOST_TEST(parse_event(r2[1]).scalars.at(0).first == "eval/loss");
  fs::remove_all(dir);
}

// transformers' EarlyStoppingCallback: an evaluation resets the count only when it beats the best of
// the earlier ones by more than the threshold; the best follows every improvement.
BOOST_AUTO_TEST_CASE(early_stopping_counts_as_trainer_does) {
  EarlyStopping e{2, 0.05};
  BOOST_TEST(!e.should_stop(1.00));  // first: the best
  BOOST_TEST(!e.should_stop(0.97));  // better by 0.03 <= 0.05: counts 1, best 0.97
  BOOST_TEST(e.without_improvement == 1);
  BOOST_TEST(e.best == 0.97);
  BOOST_TEST(!e.should_stop(0.90));  // better than 0.97 by 0.07: reset
  BOOST_TEST(e.without_improvement == 0);
  BOOST_TEST(!e.should_stop(0.95));  // worse: 1
  BOOST_TEST(e.should_stop(0.88));   // better by 0.02 only: 2 = patience, stop
  EarlyStopping off{0, 0};
  for (int i = 0; i < 10; ++i) BOOST_TEST(!off.should_stop(1.0));
  EarlyStopping exact{1, 0};
  BOOST_TEST(!exact.should_stop(1.0));
  BOOST_TEST(exact.should_stop(1.0));  // equal is no improvement
}
