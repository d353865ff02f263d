// RUN_DIR/run_id: made, read, written and shared between the ranks.
#include "run_id.hpp"

#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "shardlm/core.hpp"

namespace shardlm {

std::string run_id_path(const std::string& run_dir) { return (std::filesystem::path(run_dir) / "run_id").string(); }

std::string new_run_id() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char when[32];
  std::strftime(when, sizeof when, "%Y%m%d-%H%M%S", &utc);
  std::random_device device;  // two jobs started in the same second still differ
  const uint64_t bits = (uint64_t{device()} << 32) ^ device();
  return concat(when, "-", hex_digits(bits));
}

std::string read_run_id(const std::string& run_dir) {
  const std::string path = run_id_path(run_dir);
  if (!std::filesystem::exists(path)) return "";
  std::istringstream in(read_input_file(path, "run id file", 4096));
  std::string id;
  SHARDLM_CHECK(std::getline(in, id), "cannot read the run id in '", path, "'");
  while (!id.empty() && std::isspace(static_cast<unsigned char>(id.back()))) id.pop_back();
  SHARDLM_CHECK(!id.empty(), "the run id file '", path, "' is empty (delete it to make a new id)");
  return id;
}

void write_run_id(const std::string& run_dir, const std::string& id) { replace_file(run_id_path(run_dir), id + "\n", "run id"); }

}  // namespace shardlm
