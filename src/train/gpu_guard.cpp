// The CUDA backend's start-up guard: this binary's architectures and the deck's dtypes against the
// GPU each rank finds. gpu_run_problem is a pure function (tested on the CPU); check_gpu_for_run
// asks the GPU.
#include "gpu_guard.hpp"

#include <cstdlib>
#include <sstream>
#include <vector>

#ifdef SHARDLM_HAVE_CUDA
#include "gpu_info.hpp"
#include "nccl_communicator.hpp"
#endif

namespace shardlm {

namespace {

std::vector<std::string> split_archs(const std::string& archs) {
  std::vector<std::string> out;
  std::string item;
  std::string list = archs;
  for (char& c : list) c = c == ',' ? ';' : c;  // the compiled-in text has ',' (a ';' would split CMake's definition)
  for (std::istringstream in(list); std::getline(in, item, ';');) {
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

std::string sm(int major, int minor) { return concat("sm_", major, minor); }

}  // namespace

bool archs_cover(const std::string& archs, int major, int minor) {
  const int gpu = major * 10 + minor;
  for (const std::string& a : split_archs(archs)) {
    if (a == "all" || a == "all-major" || a == "native") return true;
    size_t digits = 0;
    while (digits < a.size() && std::isdigit(static_cast<unsigned char>(a[digits]))) ++digits;
    if (digits == 0) continue;
    const int arch = std::atoi(a.substr(0, digits).c_str());
    const std::string suffix = a.substr(digits);
    const bool specific = !suffix.empty() && (suffix[0] == 'a' || suffix[0] == 'f');  // 90a: that GPU only
    const bool real = suffix.find("-virtual") == std::string::npos;
    const bool ptx = suffix.find("-real") == std::string::npos && !specific;
    if (specific && real && arch == gpu) return true;
    if (!specific && real && arch / 10 == major && arch % 10 <= minor) return true;
    if (ptx && arch <= gpu) return true;
  }
  return false;
}

std::string gpu_run_problem(const GpuFacts& gpu, DType param_dtype, DType reduce_dtype, bool fp8_linear) {
  std::vector<std::string> problems;
  const bool covered = gpu.forged_by.empty() ? gpu.kernels_load && archs_cover(gpu.built_archs, gpu.major, gpu.minor)
                                             : archs_cover(gpu.built_archs, gpu.major, gpu.minor);
  if (!covered || (gpu.forged_by.empty() && !gpu.kernels_load))
    problems.push_back(concat("this shardlm has no kernels for ", sm(gpu.major, gpu.minor), ": it was built for CUDA architectures ",
                              gpu.built_archs, "; rebuild with -DSHARDLM_CUDA_ARCHS=", gpu.major, gpu.minor,
                              gpu.major < 8 ? " (or \"70;80\": V100 and A100 in one binary) with CUDA 11.8 or 12, which still "
                                              "compile for sm_70 (CUDA 13 does not; docs/cluster.md)"
                                            : " (docs/cluster.md)"));
  const bool bf16 = param_dtype == DType::BF16 || reduce_dtype == DType::BF16;
  if (bf16 && gpu.major < 8)
    problems.push_back(concat(param_dtype == DType::BF16 ? "fsdp.param_dtype" : "fsdp.reduce_dtype",
                              " = bf16 needs compute capability 8.0 or newer (A100, H100), which this GPU lacks: set "
                              "fsdp.param_dtype = fp16 and fsdp.reduce_dtype = fp16 in the deck (or "
                              "--fsdp.param_dtype=fp16 --fsdp.reduce_dtype=fp16); with fp16, dynamic loss scaling "
                              "turns itself on (train.loss_scale = 0)"));
  if (fp8_linear && gpu.major * 10 + gpu.minor < 89)
    problems.push_back("model.fp8_linear needs compute capability 8.9 or newer (L4, L40S, H100, H200), whose tensor "
                       "cores run FP8; this GPU's do not: remove model.fp8_linear");
  if (problems.empty()) return "";
  std::string msg = concat("GPU '", gpu.name, "' has compute capability ", gpu.major, ".", gpu.minor,
                           gpu.forged_by.empty() ? std::string() : concat(" (forged by ", gpu.forged_by, ")"), ": ");
  for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; and " : "") + problems[i];
  return msg;
}

void parse_compute_capability(const std::string& text, const std::string& what, int& major, int& minor) {
  const size_t dot = text.find('.');
  std::string a = dot == std::string::npos ? text.substr(0, text.size() > 1 ? text.size() - 1 : 0) : text.substr(0, dot);
  std::string b = dot == std::string::npos ? text.substr(a.size()) : text.substr(dot + 1);
  const auto digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 2 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  SHARDLM_CHECK(digits(a) && digits(b) && b.size() == 1, what, " = '", clip_for_message(text),
                "': expected a compute capability such as 7.0 or 80");
  major = std::atoi(a.c_str());
  minor = std::atoi(b.c_str());
  SHARDLM_CHECK(major >= 1, what, " = '", clip_for_message(text), "': expected a compute capability such as 7.0 or 80");
}

void check_gpu_for_run(const RunConfig& cfg, const Topology& topo) {
  if (cfg.run.backend != BackendKind::Cuda) return;
#ifdef SHARDLM_HAVE_CUDA
  cuda::select_device(topo);
  const cuda::GpuInfo info = cuda::current_gpu_info();
  GpuFacts gpu{info.name, info.major, info.minor, "", cuda::built_cuda_archs(), info.kernels_load};
  if (const char* forged = std::getenv("SHARDLM_FORGE_COMPUTE_CAPABILITY"); forged && *forged) {
    parse_compute_capability(forged, "SHARDLM_FORGE_COMPUTE_CAPABILITY", gpu.major, gpu.minor);
    gpu.forged_by = "SHARDLM_FORGE_COMPUTE_CAPABILITY";
  }
  const std::string problem = gpu_run_problem(gpu, cfg.fsdp.param_dtype, cfg.fsdp.reduce_dtype, cfg.model.fp8_linear);
  SHARDLM_CHECK(problem.empty(), "rank ", topo.world_rank, ": ", problem);
#else
  (void)topo;  // make_engine says that this build has no CUDA backend
#endif
}

}  // namespace shardlm
