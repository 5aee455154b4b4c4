// Thread count and core binding of a CPU rank (see fsdp/backend/cpu_threads.hpp).
#include "fsdp/backend/cpu_threads.hpp"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

bool parse_int(std::string_view s, int& out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

// The cgroup's cpuset (v2, then v1) of this process; empty if none can be read.
CpuList cgroup_cpus() {
  // /proc/self/cgroup: "0::/path" (v2) or "N:cpuset:/path" (v1).
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const auto a = line.find(':');
    const auto b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    std::string file;
    if (controllers.empty()) {
      file = "/sys/fs/cgroup" + path + "/cpuset.cpus.effective";
    } else if (("," + controllers + ",").find(",cpuset,") != std::string::npos) {
      file = "/sys/fs/cgroup/cpuset" + path + "/cpuset.effective_cpus";
    } else {
      continue;
    }
    try {
      CpuList cpus = parse_cpu_list(read_first_line(file));
      if (!cpus.empty()) return cpus;
    } catch (const Error&) {
    }
  }
  return {};
}

}  // namespace

CpuList parse_cpu_list(std::string_view text) {
  const auto bad = [&] {
    return Error("cpu list \"" + std::string(text) +
                 "\" is malformed (expected ranges like 0-3,8,10-11)");
  };
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  CpuList out;
  while (!s.empty()) {
    const auto comma = s.find(',');
    const std::string_view item = s.substr(0, comma);
    s = comma == std::string_view::npos ? std::string_view{} : s.substr(comma + 1);
    if (comma != std::string_view::npos && s.empty()) throw bad();  // trailing comma
    const auto dash = item.find('-');
    int lo = 0, hi = 0;
    if (dash == std::string_view::npos) {
      if (!parse_int(item, lo)) throw bad();
      hi = lo;
    } else if (!parse_int(item.substr(0, dash), lo) || !parse_int(item.substr(dash + 1), hi) ||
               hi < lo) {
      throw bad();
    }
    for (int c = lo; c <= hi; ++c) out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string format_cpu_list(const CpuList& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

CpuList CpuTopology::all_cpus() const {
  CpuList out;
  for (const CpuList& core : cores) out.insert(out.end(), core.begin(), core.end());
  std::sort(out.begin(), out.end());
  return out;
}

CpuTopology read_cpu_topology() {
  CpuList cpus = cgroup_cpus();
  if (cpus.empty()) {
    try {
      cpus = parse_cpu_list(read_first_line("/sys/devices/system/cpu/online"));
    } catch (const Error&) {
    }
  }
  if (cpus.empty()) {
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int c = 0; c < hw; ++c) cpus.push_back(c);
  }
  // Group by (package, core); a CPU without topology files is a core of its own.
  std::map<std::pair<int, int>, CpuList> by_core;
  int lone = 0;
  for (int c : cpus) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    int pkg = 0, core = 0;
    if (!parse_int(read_first_line(dir + "physical_package_id"), pkg) ||
        !parse_int(read_first_line(dir + "core_id"), core)) {
      pkg = -1;
      core = lone++;
    }
    by_core[{pkg, core}].push_back(c);
  }
  CpuTopology topo;
  for (auto& [key, list] : by_core) topo.cores.push_back(std::move(list));
  std::sort(topo.cores.begin(), topo.cores.end(),
            [](const CpuList& a, const CpuList& b) { return a.front() < b.front(); });
  return topo;
}

CpuThreadPlan plan_cpu_threads(int requested, int local_rank, int local_size,
                               const CpuTopology& node, const CpuList& affinity, bool deliberate) {
  if (requested < 0) {
    throw Error("cpu threads: train.num_threads = " + std::to_string(requested) +
                " (expected >= 0)");
  }
  if (local_size < 1 || local_rank < 0 || local_rank >= local_size) {
    throw Error("cpu threads: local rank " + std::to_string(local_rank) + " of " +
                std::to_string(local_size) + " (expected 0 <= local rank < local size)");
  }
  if (node.cores.empty()) throw Error("cpu threads: the node has no CPU");
  const int node_cores = static_cast<int>(node.cores.size());
  const CpuList all = node.all_cpus();

  // The launcher's binding, within the node set (a deliberate binding outside it is ignored).
  CpuList bound;
  std::set_intersection(affinity.begin(), affinity.end(), all.begin(), all.end(),
                        std::back_inserter(bound));
  const bool keep_candidate = deliberate && !bound.empty() && bound.size() < all.size();
  int bound_cores = 0;
  for (const CpuList& core : node.cores) {
    const bool any = std::any_of(core.begin(), core.end(), [&](int c) {
      return std::binary_search(bound.begin(), bound.end(), c);
    });
    bound_cores += any ? 1 : 0;
  }

  CpuThreadPlan plan;
  plan.cpus = affinity;
  plan.threads = requested > 0 ? requested
                 : keep_candidate ? std::max(1, bound_cores)
                                  : std::max(1, node_cores / local_size);
  if (keep_candidate && plan.threads <= static_cast<int>(bound.size())) return plan;

  // Our own placement: this local rank's slice of the node's cores, or all of them.
  if (static_cast<int64_t>(local_size) * plan.threads <= node_cores) {
    for (int i = local_rank * plan.threads; i < (local_rank + 1) * plan.threads; ++i) {
      const CpuList& core = node.cores[static_cast<std::size_t>(i)];
      plan.bind.insert(plan.bind.end(), core.begin(), core.end());
    }
    std::sort(plan.bind.begin(), plan.bind.end());
  } else {
    plan.bind = all;
    if (plan.threads > 1) {
      plan.note = std::to_string(local_size) + " ranks x " + std::to_string(plan.threads) +
                  " threads on " + std::to_string(node_cores) +
                  (node_cores == 1 ? " core" : " cores") +
                  ": oversubscribed, threads will wait on each other (train.num_threads = " +
                  std::to_string(std::max(1, node_cores / local_size)) + " fits)";
    }
  }
  if (keep_candidate) {
    plan.note = "train.num_threads = " + std::to_string(plan.threads) +
                " exceeds the CPUs the launcher bound this rank to (" + format_cpu_list(bound) +
                "): rebound to CPUs " + format_cpu_list(plan.bind);
  }
  if (plan.bind == affinity) {
    plan.bind.clear();  // already where it should be
  } else {
    plan.cpus = plan.bind;
  }
  return plan;
}

bool launcher_bound_deliberately(const CpuList& affinity, const CpuTopology& node) {
  if (std::getenv("OMPI_COMM_WORLD_LOCAL_RANK") != nullptr) {
    const char* policy = std::getenv("OMPI_MCA_hwloc_base_binding_policy");
    return policy != nullptr && *policy != '\0' && std::strcmp(policy, "none") != 0;
  }
  const CpuList all = node.all_cpus();
  return !std::includes(affinity.begin(), affinity.end(), all.begin(), all.end());
}

CpuList current_affinity(const CpuTopology& node) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return node.all_cpus();
  CpuList out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out.empty() ? node.all_cpus() : out;
}

CpuThreadPlan setup_cpu_threads(int requested, int local_rank, int local_size) {
  const CpuTopology node = read_cpu_topology();
  const CpuList affinity = current_affinity(node);
  CpuThreadPlan plan = plan_cpu_threads(requested, local_rank, local_size, node, affinity,
                                        launcher_bound_deliberately(affinity, node));
  plan.node_cores = static_cast<int>(node.cores.size());
  if (plan.bind.empty()) return plan;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : plan.bind) {
    if (c < CPU_SETSIZE) CPU_SET(c, &set);
  }
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    throw Error("cpu threads: cannot bind to CPUs " + format_cpu_list(plan.bind) + ": " +
                std::strerror(errno));
  }
  // Threads of the OpenMP pool that already exist keep the mask they were created with:
  // each binds itself (new ones inherit the calling thread's).
#pragma omp parallel num_threads(plan.threads)
  { sched_setaffinity(0, sizeof set, &set); }
  return plan;
}

}  // namespace fsdp
