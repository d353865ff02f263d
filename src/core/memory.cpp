// Accounting of the planned buffers of a rank, by kind, with a high-water mark.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "shardlm/core.hpp"

namespace shardlm {

MemoryStats& memory_stats() {
  static MemoryStats stats;
  return stats;
}

void memory_reset_peak() { memory_stats().total_peak = memory_stats().total_current; }

void memory_track_alloc(MemKind kind, size_t bytes) {
  MemoryStats& s = memory_stats();
  s.current[static_cast<int>(kind)] += bytes;
  s.total_current += bytes;
  if (s.total_current > s.total_peak) s.total_peak = s.total_current;
}

void memory_track_free(MemKind kind, size_t bytes) {
  MemoryStats& s = memory_stats();
  s.current[static_cast<int>(kind)] -= bytes;
  s.total_current -= bytes;
}

void* aligned_zero_alloc(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw Error(concat("out of host memory allocating ", format_bytes(bytes)));
  std::memset(p, 0, rounded);
  return p;
}

void aligned_free(void* p) { std::free(p); }

size_t process_peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string hex_digits(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

size_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

}  // namespace shardlm
