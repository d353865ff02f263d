// Tests of HDF5 checkpoints under mpirun: round trip and resharding of sliced units, the serial
// reader, damaged / truncated / mismatched files refused on every rank, keep-last and latest,
// resolve_resume, and a job killed mid-write (separate program) leaving the previous checkpoint.
#define BOOST_TEST_MODULE test_checkpoint
#include "mpi_fixture.hpp"

#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "checkpoint_edit.hpp"
#include "checkpoint_test_model.hpp"
#include "config_test_support.hpp"
#include "launch_support.hpp"
#include "test_support.hpp"

using namespace shardlm;
using namespace ckpt_test;
namespace fs = std::filesystem;

namespace {

// A fresh folder per test and world size (the np1/np2/np4 runs may overlap), same path on every rank.
std::string scratch(const std::string& name) {
  const std::string dir = concat(SHARDLM_BINARY_DIR, "/test_runs/checkpoint_np", world_size(), "/", name);
  if (world_rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

// Ranks that threw an Error from fn (message into *message); the count is the same on every rank.
int ranks_failing(const std::function<void()>& fn, std::string* message) {
  int failed = 0;
  try {
    fn();
  } catch (const Error& e) {
    failed = 1;
    *message = e.what();
  }
  int total = 0;
  MPI_Allreduce(&failed, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank() == 0) BOOST_TEST_MESSAGE("refused: " << *message);
  return total;
}

// The message load_checkpoint refuses `path` onto `s` with, checked to come from every rank.
std::string load_refusal(const std::string& path, Sharded& s) {
  std::string message;
  BOOST_TEST(ranks_failing([&] { load_checkpoint(path, s.units, MPI_COMM_WORLD); }, &message) == world_size(), path);
  return message;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

// Saves the known values sliced over the whole world (FULL_SHARD) as step `step` in dir.
CheckpointWriteStats save_known(const std::string& dir, long step, int keep_last = 0) {
  const ModelConfig cfg = tiny_bloom();
  Sharded s = make_sharded(cfg, world_size(), world_rank(), true);
  return save_checkpoint(dir, keep_last, tiny_meta(cfg, step, world_size()), s.units, MPI_COMM_WORLD);
}

// save_known with the run's identity, global batch and epoch length kept, as the trainer writes them.
CheckpointWriteStats save_identified(const std::string& dir, long step, const std::string& train_data_hash = "") {
  const ModelConfig cfg = tiny_bloom();
  Sharded s = make_sharded(cfg, world_size(), world_rank(), true);
  CheckpointMeta meta = tiny_meta(cfg, step, world_size());
  meta.run_id = "20261127-221510-00000000000000aa";
  meta.global_batch = 8;
  meta.steps_per_epoch = 25;
  meta.train_data_hash = train_data_hash;
  return save_checkpoint(dir, 0, meta, s.units, MPI_COMM_WORLD);
}

// Loads into zeroed slices of group size `group`; returns the wrong elements summed over ranks.
size_t load_and_count_wrong(const std::string& path, int group, CheckpointMeta* meta = nullptr) {
  Sharded s = make_sharded(tiny_bloom(), group, world_rank(), false);
  CheckpointMeta m = load_checkpoint(path, s.units, MPI_COMM_WORLD);
  if (meta) *meta = m;
  unsigned long long wrong = count_wrong(s), total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

// Rank 0 copies src to dst and applies edit to the copy; every rank waits for it.
void damaged_copy(const std::string& src, const std::string& dst, const std::function<void()>& edit) {
  if (world_rank() == 0) {
    fs::copy_file(src, dst, fs::copy_options::overwrite_existing);
    edit();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Every object of an HDF5 file with its kind, element type and shape, and every attribute's name
// and type class: what two files of one format have in common, whatever their values.
std::vector<std::string> object_listing(const std::string& path) {
  std::vector<std::string> lines;
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  BOOST_TEST_REQUIRE(file >= 0, path);
  auto attributes = [](hid_t obj, const std::string& where, std::vector<std::string>& out) {
    auto add = [](hid_t loc, const char* name, const H5A_info_t*, void* data) -> herr_t {
      auto* pair = static_cast<std::pair<std::string, std::vector<std::string>*>*>(data);
      const hid_t attr = H5Aopen(loc, name, H5P_DEFAULT);
      const hid_t type = H5Aget_type(attr);
      pair->second->push_back(concat(pair->first, " @", name, " class ", H5Tget_class(type)));
      H5Tclose(type);
      H5Aclose(attr);
      return 0;
    };
    std::pair<std::string, std::vector<std::string>*> data{where, &out};
    hsize_t at = 0;
    H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &at, add, &data);
  };
  attributes(file, "/", lines);
  auto visit = [](hid_t root, const char* name, const H5L_info_t*, void* data) -> herr_t {
    auto* out = static_cast<std::pair<std::vector<std::string>*, decltype(attributes)*>*>(data);
    const hid_t obj = H5Oopen(root, name, H5P_DEFAULT);
    std::string line = std::string("/") + name;
    if (H5Iget_type(obj) == H5I_DATASET) {
      const hid_t type = H5Dget_type(obj), space = H5Dget_space(obj);
      hsize_t dims[4] = {0, 0, 0, 0};
      const int rank = H5Sget_simple_extent_dims(space, dims, nullptr);
      line += concat(" dataset class ", H5Tget_class(type), " size ", H5Tget_size(type), " order ", H5Tget_order(type),
                     " rank ", rank, " dims ", dims[0]);
      H5Sclose(space);
      H5Tclose(type);
    } else {
      line += " group";
    }
    out->first->push_back(line);
    (*out->second)(obj, std::string("/") + name, *out->first);
    H5Oclose(obj);
    return 0;
  };
  std::pair<std::vector<std::string>*, decltype(attributes)*> data{&lines, &attributes};
  H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, visit, &data);
  H5Fclose(file);
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

// A barrier that sleeps instead of spinning, so waiting ranks leave the cores to a child job.
void sleeping_barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  int done = 0;
  while (!done) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Runs the fault program on `ranks` ranks (log in DIR/fault.log): its exit code, its output and
// the seconds it took.
struct FaultRun {
  int code = -1;
  std::string output;
  double seconds = 0;
};
FaultRun run_fault_program(const std::string& dir, int ranks, const std::string& fault) {
  const std::string log = dir + "/../" + fs::path(dir).filename().string() + ".log";
  const std::string cmd = concat(clean_launcher_env(), " timeout 60 " SHARDLM_MPIEXEC " -np ", ranks,
                                 " " SHARDLM_MPIEXEC_FLAGS " " SHARDLM_FAULT_PROGRAM " ", dir, " ", fault, " > ", log,
                                 " 2>&1");
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  FaultRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(log);
  r.output = std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  r.output = cmd + "\n" + r.output;
  return r;
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

// A failed second checkpoint: one error line naming the file and the cause, exit 1 (no crash, no
// hang), no temporary left, latest still on the intact first checkpoint.
void check_failed_second_checkpoint(const std::string& dir, const FaultRun& r, const std::string& cause) {
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.code == 1);  // 124: timed out (a hang); 139: a crash
    BOOST_TEST(r.seconds < 10.0);
    BOOST_TEST(count_of(r.output, "shardlm: error:") == 1u);
    BOOST_TEST(contains(r.output, "ckpt-00000002.h5.tmp"));
    BOOST_TEST(contains(r.output, cause));
    BOOST_TEST(!fs::exists(dir + "/ckpt-00000002.h5.tmp"));
    BOOST_TEST(!fs::exists(dir + "/ckpt-00000002.h5"));
    BOOST_TEST(read_text(dir + "/latest") == "ckpt-00000001.h5");
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(round_trip_on_the_same_slicing) {
  const std::string dir = scratch("round_trip");
  const CheckpointWriteStats stats = save_known(dir, 10);
  const std::string path = dir + "/ckpt-00000010.h5";
  BOOST_TEST(stats.path == path);
  BOOST_TEST(fs::exists(path));
  BOOST_TEST(!fs::exists(path + ".tmp"));
  BOOST_TEST(stats.bytes == fs::file_size(path));
  BOOST_TEST(stats.seconds > 0.0);
  BOOST_TEST(read_text(dir + "/latest") == "ckpt-00000010.h5");

  CheckpointMeta m;
  BOOST_TEST(load_and_count_wrong(path, world_size(), &m) == 0u);
  const CheckpointMeta want = tiny_meta(tiny_bloom(), 10, world_size());
  BOOST_TEST(m.format_version == kCheckpointFormatVersion);
  BOOST_TEST(m.step == 10);
  BOOST_TEST(m.epoch == want.epoch);
  BOOST_TEST(m.epoch_step == want.epoch_step);
  BOOST_TEST(m.seed == want.seed);
  BOOST_TEST(m.optimizer_steps == want.optimizer_steps);
  BOOST_TEST(m.lr_schedule == want.lr_schedule);
  BOOST_TEST(m.base_lr == want.base_lr);
  BOOST_TEST(m.warmup_steps == want.warmup_steps);
  BOOST_TEST(m.total_steps == want.total_steps);
  BOOST_TEST(m.loss_scale == want.loss_scale);
  BOOST_TEST(m.world_size == world_size());
  BOOST_TEST(m.shard_group_size == world_size());
  BOOST_TEST(m.strategy == want.strategy);
  BOOST_TEST(m.deck == want.deck);
  BOOST_TEST(m.version == want.version);
  BOOST_TEST(m.tokenizer_hash == want.tokenizer_hash);
  check_bloom_shape(m.model, 50, 8, 2, 2, 1e-5f, 0.02f);
}

BOOST_AUTO_TEST_CASE(loads_onto_a_different_slicing) {
  const std::string dir = scratch("reshard");
  const std::string path = save_known(dir, 3).path;
  // Every rank reads everything (NO_SHARD); rank 0 alone verifies checksums.
  BOOST_TEST(load_and_count_wrong(path, 1) == 0u);
  // Two replicas of world/2 slices (HYBRID_SHARD on two nodes).
  if (world_size() % 2 == 0) BOOST_TEST(load_and_count_wrong(path, world_size() / 2) == 0u);

  // And the other way: written by one primary holding everything, read back sharded over the world.
  const std::string dir1 = scratch("reshard_from_one");
  const ModelConfig cfg = tiny_bloom();
  Sharded whole = make_sharded(cfg, 1, world_rank(), true);
  save_checkpoint(dir1, 0, tiny_meta(cfg, 4, world_size()), whole.units, MPI_COMM_WORLD);
  BOOST_TEST(load_and_count_wrong(dir1 + "/ckpt-00000004.h5", world_size()) == 0u);
}

// Slices written in many small pieces (ranks with shorter slices, or none as replicas, make the
// same number of H5Dwrite calls with empty selections), with and without collective buffering.
BOOST_AUTO_TEST_CASE(small_pieces_and_collective_buffering_round_trip) {
  const ModelConfig cfg = tiny_bloom();
  for (bool collective : {false, true}) {
    for (size_t piece_bytes : {size_t{36}, size_t{64}, size_t{1} << 20}) {
      for (int group : {world_size(), std::max(1, world_size() / 2)}) {
        CheckpointWriteOptions options;
        options.collective_buffering = collective;
        options.piece_bytes = piece_bytes;
        const std::string dir = scratch("pieces_" + std::to_string(collective) + "_" + std::to_string(piece_bytes) +
                                        "_" + std::to_string(group));
        Sharded s = make_sharded(cfg, group, world_rank(), true);
        save_checkpoint(dir, 0, tiny_meta(cfg, 5, world_size()), s.units, MPI_COMM_WORLD, options);
        BOOST_TEST(load_and_count_wrong(dir + "/ckpt-00000005.h5", world_size()) == 0u,
                   "collective " << collective << " piece " << piece_bytes << " B, group " << group);
        BOOST_TEST(load_and_count_wrong(dir + "/ckpt-00000005.h5", 1) == 0u);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(serial_reader_returns_tensors_by_name) {
  const std::string dir = scratch("reader");
  save_known(dir, 5);
  if (world_rank() == 0) {
    CheckpointReader reader(dir + "/ckpt-00000005.h5");
    BOOST_TEST(reader.meta().step == 5);
    BOOST_TEST(reader.meta().model.hidden_size == 8);
    const std::vector<UnitLayout> layouts = model_layout(tiny_bloom());
    size_t expected = 0;
    for (const UnitLayout& u : layouts) expected += u.tensors.size();
    BOOST_TEST_REQUIRE(reader.tensors().size() == expected);
    size_t k = 0;
    for (size_t u = 0; u < layouts.size(); ++u) {
      for (const TensorSpec& spec : layouts[u].tensors) {
        const CheckpointTensor& t = reader.tensors()[k++];
        BOOST_TEST(t.unit == layouts[u].name);
        BOOST_TEST(t.name == spec.name);
        BOOST_TEST(t.shape == spec.shape);
        BOOST_TEST(t.offset == spec.offset);
        BOOST_TEST(t.numel == spec.numel);
        // Twice: the first read verifies the unit's checksum, the second reads only the tensor.
        for (int pass = 0; pass < 2; ++pass) {
          const std::vector<float> values = reader.read(t);
          BOOST_TEST_REQUIRE(values.size() == spec.numel);
          size_t wrong = 0;
          for (size_t i = 0; i < values.size(); ++i) wrong += values[i] != known_value(0, u, spec.offset + i);
          BOOST_TEST(wrong == 0u, t.name << " pass " << pass);
        }
      }
    }
    BOOST_TEST(reader.tensors()[0].name == "word_embeddings.weight");
    BOOST_TEST((reader.tensors()[0].shape == std::vector<int64_t>{50, 8}));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

BOOST_AUTO_TEST_CASE(unreadable_files_are_refused_on_every_rank) {
  const std::string dir = scratch("unreadable");
  const std::string good = save_known(dir, 1).path;
  const std::string truncated = dir + "/truncated.h5";
  damaged_copy(good, truncated, [&] { fs::resize_file(truncated, fs::file_size(good) / 2); });
  const ModelConfig cfg = tiny_bloom();
  Sharded s = make_sharded(cfg, world_size(), world_rank(), false);
  std::string message = load_refusal(truncated, s);
  BOOST_TEST(contains(message, "cannot open checkpoint '" + truncated + "'"), message);

  const std::string missing = dir + "/missing.h5";
  message = load_refusal(missing, s);
  BOOST_TEST(contains(message, "cannot open checkpoint '" + missing + "': no such file"), message);

  const std::string text = dir + "/text.h5";
  if (world_rank() == 0) std::ofstream(text) << "not an HDF5 file\n";
  MPI_Barrier(MPI_COMM_WORLD);
  message = load_refusal(text, s);
  BOOST_TEST(contains(message, "cannot open checkpoint '" + text + "'"), message);

  if (world_rank() == 0) {
    BOOST_CHECK_EXCEPTION(CheckpointReader reader(truncated), Error,
                          [&](const Error& e) { return contains(e.what(), truncated); });
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

BOOST_AUTO_TEST_CASE(flipped_bytes_fail_the_checksum) {
  const std::string dir = scratch("flipped");
  const std::string good = save_known(dir, 1).path;
  const std::string damaged = dir + "/damaged.h5";
  damaged_copy(good, damaged,
               [&] { BOOST_TEST(ckpt_edit::flip_dataset_bytes(damaged, "/units/h.0/exp_avg", 20, 3)); });
  Sharded s = make_sharded(tiny_bloom(), world_size(), world_rank(), false);
  std::string message = load_refusal(damaged, s);
  BOOST_TEST(contains(message, "checkpoint " + damaged + " is damaged: dataset /units/h.0/exp_avg: checksum mismatch"), message);

  // The reader checks only the param vectors; damage one of those for it.
  const std::string damaged_param = dir + "/damaged_param.h5";
  damaged_copy(good, damaged_param,
               [&] { BOOST_TEST(ckpt_edit::flip_dataset_bytes(damaged_param, "/units/h.1/param", 0, 2)); });
  if (world_rank() == 0) {
    CheckpointReader reader(damaged_param);
    for (const CheckpointTensor& t : reader.tensors()) {
      if (t.unit != "h.1") {
        BOOST_CHECK_NO_THROW(reader.read(t));
        continue;
      }
      BOOST_CHECK_EXCEPTION(reader.read(t), Error, [&](const Error& e) {
        return contains(e.what(), damaged_param) && contains(e.what(), "/units/h.1/param: checksum mismatch");
      });
      break;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// An attribute set to a value no run writes is refused on every rank naming the file: the contents
// checksum catches the change; in a file written before that checksum (the attribute removed) the
// reader's own checks name the value. The serial reader reports the same without reading vectors.
BOOST_AUTO_TEST_CASE(impossible_attributes_are_refused_naming_the_file) {
  const std::string dir = scratch("impossible");
  const std::string good = save_identified(dir, 10).path;
  BOOST_TEST(load_and_count_wrong(good, world_size()) == 0u);
  Sharded s = make_sharded(tiny_bloom(), world_size(), world_rank(), false);
  struct Case {
    const char* attribute;
    int64_t value;
    const char* why;
  };
  const Case cases[] = {{"step", -1, "step -1 is negative"},
                        {"epoch", -1, "epoch -1 is negative"},
                        {"epoch_step", -5, "epoch_step -5 is negative"},
                        {"epoch_step", 1000, "epoch_step 1000 is past the 25 steps of its epochs"},
                        {"step", 1000, "step 1000 is past total_steps 100 of the run that wrote it"},
                        {"optimizer_steps", -2, "optimizer_steps -2 is negative"},
                        {"global_batch", -8, "global_batch -8 is negative"}};
  for (const Case& c : cases) {
    for (bool old_format : {false, true}) {
      const std::string path = concat(dir, "/", c.attribute, c.value, old_format ? "_old" : "", ".h5");
      int edited = 0;
      damaged_copy(good, path, [&] {
        edited = ckpt_edit::set_integer(path, c.attribute, c.value) &&
                 (!old_format || ckpt_edit::remove_attributes(path, {"contents_checksum"}));
      });
      MPI_Bcast(&edited, 1, MPI_INT, 0, MPI_COMM_WORLD);
      BOOST_TEST_REQUIRE(edited == 1, path);
      const std::string expected = "checkpoint " + path + (old_format ? concat(" is inconsistent: ", c.why)
                                                                      : std::string(" is damaged: its attributes"));
      std::string message = load_refusal(path, s);
      BOOST_TEST(contains(message, expected), message);
      BOOST_TEST(checkpoint_unusable(message), message);
      if (world_rank() == 0) {
        CheckpointReader reader(path);
        BOOST_TEST_REQUIRE(!reader.metadata_problems().empty(), path);
        BOOST_TEST(contains(reader.metadata_problems().front(), expected), reader.metadata_problems().front());
        const std::vector<std::string> damage = reader.verify();
        BOOST_TEST_REQUIRE(!damage.empty(), path);
        BOOST_TEST(contains(damage.front(), expected), damage.front());
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The training examples' hash, kept since after the contents checksum: written when known and then
// covered by the checksum (removed, the file is damaged); left out when empty, so the file is the one
// an earlier shardlm wrote and its checksum holds without it.
BOOST_AUTO_TEST_CASE(the_training_data_hash_is_kept_and_checksummed) {
  const std::string dir = scratch("train_data_hash");
  const std::string with = save_identified(dir + "/with", 2, "0123456789abcdef").path;
  const std::string without = save_identified(dir + "/without", 2).path;
  CheckpointMeta m;
  BOOST_TEST(load_and_count_wrong(with, world_size(), &m) == 0u);
  BOOST_TEST(m.train_data_hash == "0123456789abcdef");
  BOOST_TEST(load_and_count_wrong(without, world_size(), &m) == 0u);
  BOOST_TEST(m.train_data_hash.empty());
  const std::string removed = dir + "/removed.h5";
  int edited = 0;
  damaged_copy(with, removed, [&] { edited = ckpt_edit::remove_attributes(removed, {"train_data_hash"}); });
  MPI_Bcast(&edited, 1, MPI_INT, 0, MPI_COMM_WORLD);
  BOOST_TEST_REQUIRE(edited == 1);
  Sharded s = make_sharded(tiny_bloom(), world_size(), world_rank(), false);
  const std::string message = load_refusal(removed, s);
  BOOST_TEST(contains(message, "checkpoint " + removed + " is damaged"), message);
  if (world_rank() == 0) {
    BOOST_TEST(CheckpointReader(without).verify().empty());
    const std::string line = concat("/ @train_data_hash class ", H5T_STRING);
    for (const auto& [path, count] : {std::pair{without, 0}, std::pair{with, 1}}) {
      const std::vector<std::string> listing = object_listing(path);
      BOOST_TEST(std::count(listing.begin(), listing.end(), line) == count, path);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The contents checksum covers what the vectors' own checksums do not: the tensor index (whose
// damage read as "different model?") and which dataset each checksum belongs to (param and exp_avg
// swapped each still match their own checksum).
BOOST_AUTO_TEST_CASE(index_damage_and_swapped_vectors_are_damage) {
  const std::string dir = scratch("index_damage");
  const std::string good = save_identified(dir, 1).path;
  Sharded s = make_sharded(tiny_bloom(), world_size(), world_rank(), false);
  const std::string index = dir + "/index.h5", swapped = dir + "/swapped.h5", old_swapped = dir + "/old_swapped.h5";
  int edited = 0;
  damaged_copy(good, index, [&] {
    // The first row's offset (after its 128-byte name), then a byte of the second row's name.
    edited = ckpt_edit::flip_dataset_bytes(index, "/units/h.0/index", 128, 1) &&
             ckpt_edit::flip_dataset_bytes(index, "/units/h.1/index", 180 + 2, 1);
  });
  damaged_copy(good, swapped, [&] {
    edited += ckpt_edit::swap_datasets(swapped, "/units/h.0/param", "/units/h.0/exp_avg");
  });
  damaged_copy(good, old_swapped, [&] {
    edited += ckpt_edit::swap_datasets(old_swapped, "/units/h.0/param", "/units/h.0/exp_avg") &&
              ckpt_edit::make_old_format(old_swapped);
  });
  MPI_Bcast(&edited, 1, MPI_INT, 0, MPI_COMM_WORLD);
  BOOST_TEST_REQUIRE(edited == 3);
  for (const std::string& path : {index, swapped}) {
    std::string message = load_refusal(path, s);
    BOOST_TEST(contains(message, "checkpoint " + path + " is damaged: its attributes, tensor index or vectors' "
                                 "checksums are not those its contents_checksum was computed over"), message);
    BOOST_TEST(checkpoint_damaged(message), message);
    if (world_rank() == 0) {
      CheckpointReader reader(path);
      const std::vector<std::string> damage = reader.verify();
      BOOST_TEST(damage.size() == 1u, join_lines(damage));  // every vector matches its own checksum
      BOOST_TEST((!damage.empty() && contains(damage.front(), path)));
    }
  }
  // A file written before the contents checksum has nothing to tell the swap by (docs/checkpoint.md).
  if (world_rank() == 0) BOOST_TEST(CheckpointReader(old_swapped).verify().empty());
  MPI_Barrier(MPI_COMM_WORLD);
}

// A file written before run ids, global batch and contents checksum reads as it did, with them
// empty; its contents are not checked beyond the vectors' checksums.
BOOST_AUTO_TEST_CASE(checkpoints_without_the_new_attributes_still_load) {
  const std::string dir = scratch("old_format");
  const std::string path = save_identified(dir, 3).path;
  int edited = 0;
  if (world_rank() == 0) edited = ckpt_edit::make_old_format(path);
  MPI_Bcast(&edited, 1, MPI_INT, 0, MPI_COMM_WORLD);
  BOOST_TEST_REQUIRE(edited == 1);
  CheckpointMeta m;
  BOOST_TEST(load_and_count_wrong(path, world_size(), &m) == 0u);
  BOOST_TEST(m.step == 3);
  BOOST_TEST(m.run_id.empty());
  BOOST_TEST(m.global_batch == 0);
  BOOST_TEST(m.steps_per_epoch == 0);
  if (world_rank() == 0) BOOST_TEST(CheckpointReader(path).verify().empty());
  // And one written now keeps them.
  const std::string now = scratch("new_format");
  save_identified(now, 3);
  BOOST_TEST(load_and_count_wrong(now + "/ckpt-00000003.h5", world_size(), &m) == 0u);
  BOOST_TEST(m.run_id == "20261127-221510-00000000000000aa");
  BOOST_TEST(m.global_batch == 8);
  BOOST_TEST(m.steps_per_epoch == 25);
  MPI_Barrier(MPI_COMM_WORLD);
}

BOOST_AUTO_TEST_CASE(a_different_model_is_refused_naming_the_dataset) {
  const std::string dir = scratch("other_model");
  const std::string path = save_known(dir, 1).path;

  Sharded wider = make_sharded(tiny_bloom(16), world_size(), world_rank(), false);
  std::string message = load_refusal(path, wider);
  BOOST_TEST(contains(message, "checkpoint " + path + ": /units/root/param has "), message);
  BOOST_TEST(contains(message, "(different model shape?)"), message);

  Sharded deeper = make_sharded(tiny_bloom(8, 3), world_size(), world_rank(), false);
  message = load_refusal(path, deeper);
  BOOST_TEST(contains(message, "holds units [root, h.0, h.1], the model has [root, h.0, h.1, h.2]"), message);
}

// A file written before the optimizer interface (tests/fixtures/checkpoint) loads onto any slicing,
// and AdamW checkpoints written now hold the same objects, types, shapes and attributes, plus the
// tokenizer's hash, LoRA's settings and base checksum (strings, empty without LoRA), the run id,
// global batch, steps per epoch and contents checksum, which the older file lacks and reads as
// unknown (it loads without the contents check).
BOOST_AUTO_TEST_CASE(todays_format_2_checkpoint_reads_unchanged) {
  const std::string fixture = SHARDLM_SOURCE_DIR "/tests/fixtures/checkpoint/v2_adamw_tiny_bloom.h5";
  CheckpointMeta m;
  BOOST_TEST(load_and_count_wrong(fixture, world_size(), &m) == 0u);
  BOOST_TEST(load_and_count_wrong(fixture, 1) == 0u);
  BOOST_TEST(m.format_version == 2);
  BOOST_TEST(m.step == 10);
  BOOST_TEST(m.world_size == 1);
  BOOST_TEST(m.tokenizer_hash.empty());

  const std::string dir = scratch("same_format");
  save_known(dir, 10);
  if (world_rank() == 0) {
    std::vector<std::string> before = object_listing(fixture), now = object_listing(dir + "/ckpt-00000010.h5");
    BOOST_TEST(before.size() > 20u);
    // The root attributes kept since (optional_meta_attribute): the tokenizer's hash, LoRA's two,
    // the run's id, global batch and steps per epoch, and the contents checksum.
    const std::pair<const char*, H5T_class_t> added[] = {
        {"tokenizer_hash", H5T_STRING}, {"lora", H5T_STRING},         {"base_checksum", H5T_STRING},
        {"run_id", H5T_STRING},         {"global_batch", H5T_INTEGER}, {"steps_per_epoch", H5T_INTEGER},
        {"contents_checksum", H5T_INTEGER}};
    for (const auto& [name, type_class] : added) {
      const std::string line = concat("/ @", name, " class ", type_class);
      BOOST_TEST(std::count(before.begin(), before.end(), line) == 0, line);
      BOOST_TEST(std::count(now.begin(), now.end(), line) == 1, line);
      now.erase(std::remove(now.begin(), now.end(), line), now.end());
    }
    BOOST_TEST(now == before, "now:\n" << join_lines(now) << "before:\n" << join_lines(before));
    CheckpointReader reader(fixture);
    BOOST_TEST_REQUIRE(reader.unit_states().size() == 3u);
    for (const CheckpointUnitState& u : reader.unit_states()) BOOST_TEST(u.optimizer == adamw_vectors(), u.unit);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The tokenizer's hash is FNV-1a 64 of its tokenizer.json (a folder: the file in it), "byte" for the
// byte tokenizer; a checkpoint of another tokenizer differs naming data.tokenizer, both sources and
// short hashes, and one that keeps no hash is not compared.
BOOST_AUTO_TEST_CASE(tokenizer_hash_and_difference) {
  const std::string dir = scratch("tokenizer_hash");
  const fs::path folder = fs::path(dir) / concat("rank", world_rank());
  fs::create_directories(folder);
  std::ofstream(folder / "tokenizer.json") << "a";
  BOOST_TEST(tokenizer_hash("") == "byte");
  BOOST_TEST(tokenizer_hash((folder / "tokenizer.json").string()) == "af63dc4c8601ec8c");  // FNV-1a 64 of "a"
  BOOST_TEST(tokenizer_hash(folder.string()) == "af63dc4c8601ec8c");
  std::ofstream(folder / "tokenizer.json") << "b";
  BOOST_TEST(tokenizer_hash(folder.string()) == "af63df4c8601f1a5");
  BOOST_CHECK_EXCEPTION(tokenizer_hash((folder / "missing.json").string()), Error, [&](const Error& e) {
    return std::string(e.what()).find("missing.json") != std::string::npos;
  });

  CheckpointMeta checkpoint = tiny_meta(tiny_bloom(), 10, world_size());
  checkpoint.deck = "[data]\ntokenizer = byte\n";
  checkpoint.tokenizer_hash = "byte";
  RunConfig run;
  run.data.tokenizer = TokenizerSource::Byte;
  BOOST_TEST(tokenizer_difference(checkpoint, run, "byte") == "");
  run.data.tokenizer = TokenizerSource::File;
  run.data.tokenizer_file = "/m/tokenizer.json";
  BOOST_TEST(tokenizer_difference(checkpoint, run, "af63dc4c8601ec8c") ==
             "data.tokenizer is byte in the checkpoint, /m/tokenizer.json (hash af63dc4c8601) in this run");
  checkpoint.deck = "[data]\ntokenizer = /old/tokenizer.json\n";
  checkpoint.tokenizer_hash = "af63df4c8601f1a5";
  BOOST_TEST(tokenizer_difference(checkpoint, run, "af63dc4c8601ec8c") ==
             "data.tokenizer is /old/tokenizer.json (hash af63df4c8601) in the checkpoint, /m/tokenizer.json (hash "
             "af63dc4c8601) in this run");
  BOOST_TEST(checkpoint_tokenizer_text(checkpoint) == "/old/tokenizer.json (hash af63df4c8601f1a5)");
  BOOST_TEST(tokenizer_difference(checkpoint, run, "af63df4c8601f1a5") == "");  // same content, wherever it lies
  checkpoint.tokenizer_hash.clear();  // written before checkpoints kept it
  BOOST_TEST(tokenizer_difference(checkpoint, run, "af63dc4c8601ec8c") == "");
  BOOST_TEST(checkpoint_tokenizer_text(checkpoint) ==
             "/old/tokenizer.json (no hash kept: written before checkpoints kept one)");
}

// An optimizer with a third per-element vector (AMSGrad's running maximum, as PyTorch names it).
BOOST_AUTO_TEST_CASE(a_third_optimizer_vector_round_trips_and_reshards) {
  const std::vector<std::string> amsgrad = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  const ModelConfig cfg = tiny_bloom();
  auto load_wrong = [&](const std::string& path, int group) {
    Sharded s = make_sharded(cfg, group, world_rank(), false, amsgrad);
    load_checkpoint(path, s.units, MPI_COMM_WORLD);
    unsigned long long wrong = count_wrong(s), total = 0;
    MPI_Allreduce(&wrong, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    return total;
  };
  for (int written_by : {world_size(), 1}) {
    const std::string dir = scratch("amsgrad_" + std::to_string(written_by));
    Sharded s = make_sharded(cfg, written_by, world_rank(), true, amsgrad);
    CheckpointWriteOptions options;
    options.piece_bytes = 64;  // several pieces per slice
    save_checkpoint(dir, 0, tiny_meta(cfg, 7, world_size()), s.units, MPI_COMM_WORLD, options);
    const std::string path = dir + "/ckpt-00000007.h5";
    BOOST_TEST(load_wrong(path, world_size()) == 0u, "written by groups of " << written_by);
    BOOST_TEST(load_wrong(path, 1) == 0u, "written by groups of " << written_by);
    if (world_size() % 2 == 0) BOOST_TEST(load_wrong(path, world_size() / 2) == 0u);
    if (world_rank() == 0) {
      CheckpointReader reader(path);
      for (const CheckpointUnitState& u : reader.unit_states()) BOOST_TEST(u.optimizer == amsgrad, u.unit);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }

  // Its checksum is written and verified like the others.
  Sharded s = make_sharded(cfg, world_size(), world_rank(), true, amsgrad);
  const std::string dir = scratch("amsgrad_damaged");
  save_checkpoint(dir, 0, tiny_meta(cfg, 7, world_size()), s.units, MPI_COMM_WORLD);
  const std::string damaged = dir + "/damaged.h5";
  damaged_copy(dir + "/ckpt-00000007.h5", damaged,
               [&] { BOOST_TEST(ckpt_edit::flip_dataset_bytes(damaged, "/units/root/max_exp_avg_sq", 8, 2)); });
  Sharded into = make_sharded(cfg, world_size(), world_rank(), false, amsgrad);
  std::string message = load_refusal(damaged, into);
  BOOST_TEST(contains(message, "dataset /units/root/max_exp_avg_sq: checksum mismatch"), message);
}

BOOST_AUTO_TEST_CASE(other_optimizer_state_is_refused_naming_the_dataset) {
  const std::string dir = scratch("other_optimizer");
  const std::string path = save_known(dir, 1).path;
  const std::string fixture = SHARDLM_SOURCE_DIR "/tests/fixtures/checkpoint/v2_adamw_tiny_bloom.h5";
  const ModelConfig cfg = tiny_bloom();
  std::string message;
  auto refusal = [&](const std::string& file, const std::vector<std::string>& names) {
    Sharded s = make_sharded(cfg, world_size(), world_rank(), false, names);
    return load_refusal(file, s);
  };
  for (const std::string& file : {path, fixture}) {
    message = refusal(file, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"});
    BOOST_TEST(contains(message, "checkpoint " + file + ": unit root holds optimizer state [exp_avg, exp_avg_sq], "
                                 "the run's optimizer keeps [exp_avg, exp_avg_sq, max_exp_avg_sq]; missing dataset "
                                 "/units/root/max_exp_avg_sq (written by another optimizer?)"),
               message);
  }
  message = refusal(path, {"momentum_buffer"});
  BOOST_TEST(contains(message, "unit root holds optimizer state [exp_avg, exp_avg_sq], the run's optimizer keeps "
                               "[momentum_buffer]; missing dataset /units/root/momentum_buffer; extra dataset "
                               "/units/root/exp_avg; extra dataset /units/root/exp_avg_sq"),
             message);
  message = refusal(path, {});
  BOOST_TEST(contains(message, "the run's optimizer keeps []; extra dataset /units/root/exp_avg; extra dataset "
                               "/units/root/exp_avg_sq"),
             message);
  message = refusal(path, {"exp_avg_sq", "exp_avg", "exp_avg"});
  BOOST_TEST(contains(message, "lists optimizer vector 'exp_avg' twice"), message);
  // The AdamW names in another order are the same state.
  Sharded swapped = make_sharded(cfg, world_size(), world_rank(), false, {"exp_avg_sq", "exp_avg"});
  load_checkpoint(path, swapped.units, MPI_COMM_WORLD);
  size_t wrong = 0;
  for (size_t u = 0; u < swapped.units.size(); ++u)
    for (size_t i = 0; i < swapped.units[u].count; ++i) {
      const size_t at = swapped.units[u].begin + i;
      wrong += swapped.vectors[1][u][i] != known_value(2, u, at) || swapped.vectors[2][u][i] != known_value(1, u, at);
    }
  BOOST_TEST(wrong == 0u);
}

BOOST_AUTO_TEST_CASE(bad_optimizer_vectors_are_refused_before_writing) {
  const std::string dir = scratch("bad_optimizer");
  const ModelConfig cfg = tiny_bloom();
  const CheckpointMeta meta = tiny_meta(cfg, 2, world_size());
  std::string message;
  for (const std::vector<std::string>& names : std::vector<std::vector<std::string>>{
           {"param"}, {"index"}, {"a/b"}, {""}, {"exp_avg", "exp_avg"}}) {
    Sharded s = make_sharded(cfg, world_size(), world_rank(), true, names);
    BOOST_TEST(ranks_failing([&] { save_checkpoint(dir, 0, meta, s.units, MPI_COMM_WORLD); }, &message) ==
               world_size());
    BOOST_TEST(contains(message, "save_checkpoint: unit root"), message);
  }
  Sharded s = make_sharded(cfg, world_size(), world_rank(), true);
  s.units[1].optimizer[1].data = nullptr;
  BOOST_TEST(ranks_failing([&] { save_checkpoint(dir, 0, meta, s.units, MPI_COMM_WORLD); }, &message) ==
             world_size());
  BOOST_TEST(contains(message, "save_checkpoint: unit h.0 has no buffer for exp_avg_sq"), message);
  // Ranks must agree on the names: they create the datasets together.
  if (world_size() > 1) {
    Sharded other = make_sharded(cfg, world_size(), world_rank(), true,
                                 world_rank() == 0 ? adamw_vectors() : std::vector<std::string>{"exp_avg", "m"});
    BOOST_TEST(ranks_failing([&] { save_checkpoint(dir, 0, meta, other.units, MPI_COMM_WORLD); }, &message) ==
               world_size());
    BOOST_TEST(contains(message, "ranks passed different units"), message);
  }
  BOOST_TEST(!fs::exists(dir + "/ckpt-00000002.h5"));
}

BOOST_AUTO_TEST_CASE(keep_last_latest_and_resolve_resume) {
  const std::string dir = scratch("keep_last");
  for (long step : {1, 2, 3}) save_known(dir, step, 2);
  const std::string newest = dir + "/ckpt-00000003.h5";
  BOOST_TEST(!fs::exists(dir + "/ckpt-00000001.h5"));
  BOOST_TEST(fs::exists(dir + "/ckpt-00000002.h5"));
  BOOST_TEST(fs::exists(newest));
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.path().extension() == ".h5";
  BOOST_TEST(files == 2u);
  BOOST_TEST(read_text(dir + "/latest") == "ckpt-00000003.h5");
  BOOST_TEST(resolve_resume(ResumeFrom::Auto, "", dir) == newest);
  BOOST_TEST(resolve_resume(ResumeFrom::Path, dir, "") == newest);
  BOOST_TEST(resolve_checkpoint_path(newest) == newest);
  BOOST_TEST(resolve_resume(ResumeFrom::None, newest, dir) == "");
  BOOST_TEST(load_and_count_wrong(resolve_resume(ResumeFrom::Auto, "", dir), world_size()) == 0u);

  const std::string empty = scratch("keep_last_empty");
  BOOST_TEST(resolve_resume(ResumeFrom::Auto, "", empty) == "");
  BOOST_TEST(resolve_resume(ResumeFrom::Auto, "", empty + "/not_yet") == "");
  BOOST_CHECK_EXCEPTION(resolve_checkpoint_path(empty), Error, [&](const Error& e) { return contains(e.what(), empty); });
  const std::string nowhere = dir + "/nowhere.h5";
  BOOST_CHECK_EXCEPTION(resolve_resume(ResumeFrom::Path, nowhere, dir), Error,
                        [&](const Error& e) { return contains(e.what(), nowhere); });

  // latest naming a file that is gone
  const std::string dangling = scratch("keep_last_dangling");
  if (world_rank() == 0) std::ofstream(dangling + "/latest") << "ckpt-00000009.h5\n";
  MPI_Barrier(MPI_COMM_WORLD);
  BOOST_CHECK_EXCEPTION(resolve_resume(ResumeFrom::Auto, "", dangling), Error,
                        [&](const Error& e) { return contains(e.what(), "ckpt-00000009.h5"); });
}

BOOST_AUTO_TEST_CASE(large_deck_and_bad_inputs) {
  const std::string dir = scratch("large_deck");
  const ModelConfig cfg = tiny_bloom();
  Sharded s = make_sharded(cfg, world_size(), world_rank(), true);
  CheckpointMeta meta = tiny_meta(cfg, 6, world_size());
  // Beyond the 64 KiB an attribute may take in an object header; UTF-8 survives.
  meta.deck.clear();
  while (meta.deck.size() < 200000) meta.deck += "# commentaire généré pour remplir le deck\n";
  save_checkpoint(dir, 0, meta, s.units, MPI_COMM_WORLD);
  CheckpointMeta back;
  BOOST_TEST(load_and_count_wrong(dir + "/ckpt-00000006.h5", world_size(), &back) == 0u);
  BOOST_TEST(back.deck == meta.deck);

  // Primaries must cover each unit exactly once.
  std::string message;
  if (world_size() > 1) {
    Sharded all_primary = make_sharded(cfg, 1, 0, true);
    BOOST_TEST(ranks_failing([&] { save_checkpoint(dir, 0, meta, all_primary.units, MPI_COMM_WORLD); }, &message) ==
               world_size());
    BOOST_TEST(contains(message, "primary"), message);
  }
  // A malformed fault specification is refused before anything is written.
  setenv("SHARDLM_FAULT_CHECKPOINT", "after:2", 1);
  BOOST_TEST(ranks_failing([&] { save_checkpoint(dir, 0, meta, s.units, MPI_COMM_WORLD); }, &message) == world_size());
  BOOST_TEST(contains(message, "SHARDLM_FAULT_CHECKPOINT"), message);
  unsetenv("SHARDLM_FAULT_CHECKPOINT");
}

BOOST_AUTO_TEST_CASE(a_job_killed_mid_write_keeps_the_previous_checkpoint) {
  const std::string dir = scratch("fault");
  if (world_rank() == 0) {
    const std::string log = dir + "/fault.log";
    const std::string cmd = clean_launcher_env() + " timeout 120 " SHARDLM_MPIEXEC " -np 2 " SHARDLM_MPIEXEC_FLAGS
                            " " SHARDLM_FAULT_PROGRAM " " + dir + " > " + log + " 2>&1";
    const int status = std::system(cmd.c_str());
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream in(log);
    const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    BOOST_TEST_CONTEXT(cmd << "\n" << output) {
      BOOST_TEST(code != 0);
      BOOST_TEST(code != 124);  // timed out
      BOOST_TEST(!contains(output, "completed"));
      BOOST_TEST(fs::exists(dir + "/ckpt-00000001.h5"));
      BOOST_TEST(fs::exists(dir + "/ckpt-00000002.h5.tmp"));
      BOOST_TEST(!fs::exists(dir + "/ckpt-00000002.h5"));
      BOOST_TEST(read_text(dir + "/latest") == "ckpt-00000001.h5");
    }
  }
  sleeping_barrier();
  BOOST_TEST(resolve_resume(ResumeFrom::Auto, "", dir) == dir + "/ckpt-00000001.h5");
  BOOST_TEST(load_and_count_wrong(dir + "/ckpt-00000001.h5", world_size()) == 0u);

  // The next successful checkpoint removes the abandoned temporary of the step before it.
  save_known(dir, 3);
  BOOST_TEST(!fs::exists(dir + "/ckpt-00000002.h5.tmp"));
  BOOST_TEST(read_text(dir + "/latest") == "ckpt-00000003.h5");
}

BOOST_AUTO_TEST_CASE(a_failed_write_ends_every_rank_and_keeps_latest) {
  // An injected ENOSPC in one rank's data write (the last rank, the fourth piece of the file), then
  // one in rank 0's space reservation: every rank of the job stops within seconds with one message.
  const std::vector<std::pair<std::string, std::string>> faults = {
      {concat("write_error:", world_size() - 1, ":3"), "No space left on device"},
      {"write_error:0:0", "No space left on device"},
      {"reserve_error", "cannot reserve"}};
  for (size_t i = 0; i < faults.size(); ++i) {
    const std::string dir = scratch(concat("write_error_", i));
    if (world_rank() == 0) {
      const FaultRun r = run_fault_program(dir, world_size(), faults[i].first);
      check_failed_second_checkpoint(dir, r, faults[i].second);
    }
    sleeping_barrier();
    BOOST_TEST(load_and_count_wrong(dir + "/ckpt-00000001.h5", world_size()) == 0u);
  }

  // In this process too: every rank throws the same error, and the next checkpoint succeeds.
  const std::string dir = scratch("write_error_in_process");
  save_known(dir, 1);
  setenv("SHARDLM_FAULT_CHECKPOINT", concat("write_error:", world_size() - 1, ":2").c_str(), 1);
  std::string message;
  BOOST_TEST(ranks_failing([&] { save_known(dir, 2); }, &message) == world_size());
  unsetenv("SHARDLM_FAULT_CHECKPOINT");
  BOOST_TEST(contains(message, "No space left on device"), message);
  BOOST_TEST(!fs::exists(dir + "/ckpt-00000002.h5.tmp"));
  BOOST_TEST(read_text(dir + "/latest") == "ckpt-00000001.h5");
  save_known(dir, 3);
  BOOST_TEST(load_and_count_wrong(dir + "/ckpt-00000003.h5", world_size()) == 0u);
}

// A real full disk, where this machine lets the test mount a small tmpfs (root, mount allowed); the
// injected failures above are the path every CI machine takes.
BOOST_AUTO_TEST_CASE(a_full_disk_ends_every_rank_and_keeps_latest) {
  const std::string probe = scratch("full_disk_probe");
  const uint64_t bytes = save_known(probe, 1).bytes;
  const std::string dir = concat(SHARDLM_BINARY_DIR, "/test_runs/checkpoint_np", world_size(), "/full_disk");
  if (world_rank() == 0) (void)std::system(concat("umount ", dir, " 2>/dev/null").c_str());  // an interrupted run's
  scratch("full_disk");
  int mounted = 0;
  if (world_rank() == 0) {
    // Room for the first checkpoint and half of the second.
    const uint64_t size = (bytes + bytes / 2 + (64 << 10) + 4095) / 4096 * 4096;
    mounted = std::system(concat("mount -t tmpfs -o size=", size, " tmpfs ", dir, " 2>/dev/null").c_str()) == 0;
  }
  MPI_Bcast(&mounted, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!mounted) {
    BOOST_TEST_MESSAGE("no tmpfs could be mounted here: the injected failures stand for a full disk");
    return;
  }
  // Found by the space reservation, then (without it) inside HDF5's own writes.
  for (const char* fault : {"none", "no_reserve"}) {
    if (world_rank() == 0) {
      for (const auto& e : fs::directory_iterator(dir)) fs::remove_all(e.path());
      const FaultRun r = run_fault_program(dir, world_size(), fault);
      check_failed_second_checkpoint(dir, r, "No space left on device");
    }
    sleeping_barrier();
    BOOST_TEST(load_and_count_wrong(dir + "/ckpt-00000001.h5", world_size()) == 0u);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (world_rank() == 0) BOOST_TEST(std::system(concat("umount ", dir).c_str()) == 0);
}
