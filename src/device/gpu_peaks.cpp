// The dense tensor-core peaks of GPU models, matched by the CUDA device name, for the MFU: the
// built-in table, the user's file of more (SHARDLM_GPU_PEAKS) and the lookup. Plain C++.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "shardlm/device.hpp"

namespace shardlm {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The longest entry whose name is in `device` (lowered); nullptr when none is.
const GpuPeak* longest_match(const std::string& device, const std::vector<GpuPeak>& entries) {
  const GpuPeak* best = nullptr;
  for (const GpuPeak& e : entries)
    if (!e.name.empty() && device.find(lower(e.name)) != std::string::npos &&
        (!best || e.name.size() > best->name.size()))
      best = &e;
  return best;
}

// A TFLOP/s field of a peaks file: a finite number >= 0; false otherwise.
bool parse_tflops(const std::string& text, double& value) {
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return !text.empty() && *end == '\0' && std::isfinite(value) && value >= 0;
}

}  // namespace

// NVIDIA's datasheet figures, dense (the datasheets' "with sparsity" figures halved), per GPU.
// Device names as cudaGetDeviceProperties gives them: "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100
// PCIe", "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", ...
const std::vector<GpuPeak>& builtin_gpu_peaks() {
  static const std::vector<GpuPeak> table = {
      {"H100", 989, 989},        // H100 SXM5 (and any H100 not named below)
      {"H100 PCIe", 756, 756},
      {"H100 NVL", 835, 835},
      {"H200", 989, 989},        // H200 SXM
      {"H200 NVL", 835, 835},
      {"A100", 312, 312},        // SXM4 and PCIe, 40 and 80 GB
      {"V100", 0, 125},          // SXM2 and SXM3; no bf16 tensor cores before Ampere
      {"V100-PCIE", 0, 112},
      {"V100S", 0, 130},         // V100S PCIe
  };
  return table;
}

std::vector<GpuPeak> read_gpu_peaks(const std::string& path) {
  std::istringstream in(read_input_file(path, "SHARDLM_GPU_PEAKS file", kMaxDeckBytes));
  std::vector<GpuPeak> entries;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string text = line.substr(0, line.find('#'));
    std::istringstream words(text);
    std::vector<std::string> fields;
    for (std::string w; words >> w;) fields.push_back(w);
    if (fields.empty()) continue;
    GpuPeak e;
    const bool ok = fields.size() >= 3 && parse_tflops(fields[fields.size() - 2], e.bf16_tflops) &&
                    parse_tflops(fields.back(), e.fp16_tflops);
    SHARDLM_CHECK(ok, path, ":", number, " (SHARDLM_GPU_PEAKS): expected '<name substring> <bf16 TFLOP/s> ",
                  "<fp16 TFLOP/s>' with numbers >= 0, got '", line, "'");
    for (size_t i = 0; i + 2 < fields.size(); ++i) e.name += (i ? " " : "") + fields[i];
    entries.push_back(e);
  }
  return entries;
}

const GpuPeak* find_gpu_peak(const std::string& device_name, const std::vector<GpuPeak>& user_entries) {
  const std::string device = lower(device_name);
  if (const GpuPeak* mine = longest_match(device, user_entries)) return mine;
  return longest_match(device, builtin_gpu_peaks());
}

}  // namespace shardlm
