// Who this process is, for messages (see fsdp/core/process.hpp).
#include "fsdp/core/process.hpp"

#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <string>
#include <system_error>
#include <thread>
#include <vector>
#include <sstream>
#include <fstream>
#include <cstdlib>

namespace fsdp {
namespace {
std::atomic<int> g_rank{-1};

// A non-negative integer environment variable, else -1.
int rank_from_env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long r = std::strtol(v, &end, 10);
  return (*end == '\0' && r >= 0 && r <= 1 << 30) ? static_cast<int>(r) : -1;
}
}  // namespace

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "unknown-host";
  return buf;
}

void set_world_rank(int rank) { g_rank.store(rank); }

int world_rank() noexcept {
  if (const int r = g_rank.load(); r >= 0) return r;
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const int r = rank_from_env(name); r >= 0) return r;
  }
  return -1;
}

std::string where() {
  const int r = world_rank();
  return (r >= 0 ? "rank " + std::to_string(r) : std::string("rank ?")) + " on " + host_name();
}

int usable_cpus() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

void run_parts(int64_t parts, const std::function<void(int64_t)>& part) {
  std::vector<std::thread> pool;
  int64_t started = 1;  // parts 1 .. started-1 have a thread
  try {
    for (; started < parts; ++started) pool.emplace_back(part, started);
  } catch (const std::system_error&) {  // no more threads: the rest on this one
  }
  if (parts > 0) part(0);
  for (int64_t t = started; t < parts; ++t) part(t);
  for (auto& th : pool) th.join();
}

double seconds_since_process_start() noexcept {
  try {
    std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
    std::string line;
    double up = 0;
    if (!std::getline(stat, line) || !(uptime >> up)) return -1;
    // Fields after the command name (which may hold spaces): state is field 3, starttime 22.
    const std::size_t close = line.rfind(')');
    if (close == std::string::npos) return -1;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    for (int i = 3; i < 22 && rest >> field; ++i) {
    }
    unsigned long long ticks = 0;
    if (!(rest >> ticks)) return -1;
    const long hz = sysconf(_SC_CLK_TCK);
    if (hz <= 0) return -1;
    return std::max(0.0, up - static_cast<double>(ticks) / static_cast<double>(hz));
  } catch (...) {
    return -1;
  }
}

}  // namespace fsdp
