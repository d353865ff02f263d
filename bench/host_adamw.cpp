// bench_host_adamw: bytes/s of the host AdamW (the offloaded optimizer) against the machine's memory
// bandwidth, measured in the same program by a STREAM-like triad on the same threads.
//
//   build/bin/bench_host_adamw [--elements N] [--reps R] [--threads 1,2,4] [--moments-dir DIR] [--json]
//
// For each thread count: the triad a[i] = b[i] + s c[i] over fp32 arrays of N elements (12 bytes an
// element: two reads, one write), then host_adamw on one range of N elements with each path the CPU
// has (scalar, AVX2, AVX-512), without and with the bf16 compute-dtype copy. AdamW reads param, grad
// and both moments and writes param and both moments: 28 bytes an element, 30 with the bf16 copy
// (write-allocate traffic is not counted, as STREAM does not count it). Each figure is the median of
// R repetitions after one warm-up; the last column is the AdamW rate over the triad's. With
// --moments-dir, both moments are memory-mapped files in DIR as fsdp.offload_dir makes them (the
// CPU backend's allocation): the rate then includes the page cache, and the disk where they do not fit.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "shardlm/device.hpp"

using namespace shardlm;

namespace {

const char* kUsage = "usage: bench_host_adamw [--elements N] [--reps R] [--threads 1,2,4] [--moments-dir DIR] [--json]\n";

struct Options {
  size_t elements = size_t(32) << 20;
  int reps = 7;
  std::vector<int> threads;
  std::string moments_dir;
  bool json = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      SHARDLM_CHECK(i + 1 < argc, a, " needs a value\n", kUsage);
      return argv[++i];
    };
    auto count = [&](const std::string& text) {
      char* end = nullptr;
      const long v = std::strtol(text.c_str(), &end, 10);
      SHARDLM_CHECK(end != text.c_str() && *end == '\0' && v >= 1, a, " = '", text, "': must be a whole number >= 1");
      return v;
    };
    if (a == "--elements") {
      o.elements = static_cast<size_t>(count(value()));
    } else if (a == "--reps") {
      o.reps = static_cast<int>(count(value()));
    } else if (a == "--threads") {
      const std::string list = value();
      size_t pos = 0;
      while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        o.threads.push_back(static_cast<int>(count(list.substr(pos, comma - pos))));
        pos = comma + 1;
      }
    } else if (a == "--moments-dir") {
      o.moments_dir = value();
    } else if (a == "--json") {
      o.json = true;
    } else {
      throw Error(concat("unknown option '", a, "'\n", kUsage));
    }
  }
  if (o.threads.empty())
    for (int t = 1; t <= cpu_default_threads(1); t *= 2) o.threads.push_back(t);
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Median seconds of `reps` runs of f after one warm-up.
template <typename F>
double time_median(int reps, F&& f) {
  f();
  std::vector<double> s;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(s);
}

// a = b + s c on `threads` threads, each a contiguous share.
void triad(float* a, const float* b, const float* c, size_t n, int threads) {
  auto part = [&](int t) {
    const size_t begin = n * t / threads, end = n * (t + 1) / threads;
    for (size_t i = begin; i < end; ++i) a[i] = b[i] + 3.0f * c[i];
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(part, t);
  part(0);
  for (std::thread& t : pool) t.join();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const size_t n = o.elements;
    std::vector<float> p(n), g(n), a(n), b(n), c(n);
    std::vector<uint16_t> out(n);
    // The moments: host memory, or fsdp.offload_dir's mapped files (zeros either way).
    const std::unique_ptr<Backend> files = make_cpu_backend(1, o.moments_dir);
    const DeviceArray m_array = files->allocate(n * sizeof(float), MemKind::Optimizer);
    const DeviceArray v_array = files->allocate(n * sizeof(float), MemKind::Optimizer);
    float* m = m_array.as<float>();
    float* v = v_array.as<float>();
    for (size_t i = 0; i < n; ++i) {
      p[i] = 1e-3f * static_cast<float>(i % 1000);
      g[i] = 1e-4f * static_cast<float>(i % 777) - 0.03f;
      b[i] = 1.0f, c[i] = 2.0f, a[i] = 0.0f;
    }
    const double gb = 1e9;
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    std::printf("host AdamW on %zu elements (%.0f MiB per array), median of %d repetitions%s%s\n", n,
                static_cast<double>(n) * 4 / 1048576.0, o.reps, o.moments_dir.empty() ? "" : "; moments mapped in ",
                o.moments_dir.c_str());
    std::printf("%-8s %7s %-10s %12s %10s %9s\n", "threads", "path", "copy", "seconds", "GB/s", "of triad");
    for (int threads : o.threads) {
      const double triad_s = time_median(o.reps, [&] { triad(a.data(), b.data(), c.data(), n, threads); });
      const double triad_rate = 12.0 * static_cast<double>(n) / triad_s;
      std::printf("%-8d %7s %-10s %12.5f %10.2f %9s\n", threads, "triad", "-", triad_s, triad_rate / gb, "1.00");
      rows.push_back({{"threads", threads}, {"kernel", "triad"}, {"seconds", triad_s}, {"bytes_per_s", triad_rate}});
      for (HostSimd simd : {HostSimd::Scalar, HostSimd::Avx2, HostSimd::Avx512}) {
        if (!host_simd_available(simd)) {
          std::printf("%-8d %7s (this CPU has none)\n", threads, host_simd_name(simd));
          continue;
        }
        for (bool copy : {false, true}) {
          AdamWHyper h;
          h.lr = 1e-4, h.step = 1, h.out_dtype = copy ? DType::BF16 : DType::F32;
          const std::vector<AdamWRange> ranges = {
              {p.data(), g.data(), m, v, n, 0.01, copy ? out.data() : nullptr}};
          const double s = time_median(o.reps, [&] {
            host_adamw(ranges, h, threads, simd);
            ++h.step;
          });
          const double bytes = (copy ? 30.0 : 28.0) * static_cast<double>(n);
          std::printf("%-8d %7s %-10s %12.5f %10.2f %9.2f\n", threads, host_simd_name(simd), copy ? "bf16" : "none", s,
                      bytes / s / gb, bytes / s / triad_rate);
          rows.push_back({{"threads", threads},
                          {"kernel", concat("adamw_", host_simd_name(simd))},
                          {"compute_copy", copy ? "bf16" : "none"},
                          {"seconds", s},
                          {"bytes_per_s", bytes / s},
                          {"of_triad", bytes / s / triad_rate}});
        }
      }
    }
    if (o.json)
      std::printf("%s\n", nlohmann::ordered_json{{"elements", n}, {"reps", o.reps}, {"moments_dir", o.moments_dir}, {"rows", rows}}
                               .dump()
                               .c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_host_adamw: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
