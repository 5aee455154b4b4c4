// Host memory available to this process (see fsdp/core/host_memory.hpp).
#include "fsdp/core/host_memory.hpp"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <sstream>

namespace fsdp {
namespace {

constexpr int64_t kNoLimit = int64_t{1} << 60;

// The whole text of a small /proc or /sys file; empty if it cannot be read.
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream os;
  os << in.rdbuf();
  return in ? os.str() : std::string();
}

// A cgroup limit/usage file: a byte count, or "max"; -1 if unreadable or no limit.
int64_t read_bytes(const std::string& path) {
  const std::string text = slurp(path);
  if (text.empty() || text.rfind("max", 0) == 0) return -1;
  try {
    const long long v = std::stoll(text);
    return v >= 0 && v < kNoLimit ? v : -1;
  } catch (...) {
    return -1;
  }
}

}  // namespace

int64_t parse_mem_available(const std::string& meminfo) {
  std::istringstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    long long kb = -1;
    std::string unit;
    if (!(fields >> kb) || kb < 0) return -1;
    fields >> unit;
    return unit == "kB" || unit.empty() ? kb * 1024 : -1;
  }
  return -1;
}

int64_t parse_memory_stat(const std::string& stat, const std::string& key) {
  std::istringstream in(stat);
  std::string k;
  long long v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return 0;
}

int64_t HostMemory::available() const {
  int64_t best = mem_available;
  if (cgroup_limit >= 0 && cgroup_usage >= 0) {
    const int64_t room = std::max<int64_t>(0, cgroup_limit - cgroup_usage + cgroup_reclaimable);
    best = best < 0 ? room : std::min(best, room);
  }
  return best;
}

std::string HostMemory::describe() const {
  const int64_t a = available();
  if (a < 0) return "unknown";
  if (cgroup_limit >= 0 && cgroup_usage >= 0 && a != mem_available) {
    return "cgroup memory limit " + human_bytes(static_cast<double>(cgroup_limit)) + ", " +
           human_bytes(static_cast<double>(cgroup_usage - cgroup_reclaimable)) + " in use";
  }
  return "MemAvailable " + human_bytes(static_cast<double>(mem_available));
}

HostMemory read_host_memory() {
  HostMemory m;
  m.mem_available = parse_mem_available(slurp("/proc/meminfo"));
  // cgroup v2 (unified hierarchy): the namespace's own group is mounted at /sys/fs/cgroup.
  int64_t limit = read_bytes("/sys/fs/cgroup/memory.max");
  if (limit >= 0) {
    m.cgroup_limit = limit;
    m.cgroup_usage = read_bytes("/sys/fs/cgroup/memory.current");
    m.cgroup_reclaimable = parse_memory_stat(slurp("/sys/fs/cgroup/memory.stat"), "inactive_file");
    return m;
  }
  limit = read_bytes("/sys/fs/cgroup/memory/memory.limit_in_bytes");  // cgroup v1
  if (limit >= 0) {
    m.cgroup_limit = limit;
    m.cgroup_usage = read_bytes("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    m.cgroup_reclaimable =
        parse_memory_stat(slurp("/sys/fs/cgroup/memory/memory.stat"), "total_inactive_file");
  }
  return m;
}

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  // Next unit where one decimal would print 1024.0 or more ("1.0 MiB", not "1024.0 KiB").
  while (i < 5 && b >= (i == 0 ? 1024.0 : 1023.95)) {
    b /= 1024.0;
    ++i;
  }
  std::ostringstream os;
  os << std::fixed << std::setprecision(i == 0 ? 0 : 1) << b << " " << unit[i];
  return os.str();
}

}  // namespace fsdp
