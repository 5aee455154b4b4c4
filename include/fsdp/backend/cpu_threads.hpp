// fsdp/backend/cpu_threads.hpp: how many threads a CPU rank runs and which cores they run on.
//
// The CPU backend has one thread pool: OpenMP's. OpenBLAS is called single-threaded from
// inside our OpenMP regions (src/backend/cpu/cpu_kernels.cpp), so BLAS and our own loops
// never compete for cores, and the process needs no OMP_* / OPENBLAS_* environment.
//
// What it does need is cores. Open MPI binds each rank to one core by default when it
// starts two ranks or fewer (`mpirun -np 1`: core 0), so train.num_threads = 2 would run both
// threads on that one core, no faster than one thread (measured: 13.2k tokens/s at 1 and at 2
// threads under mpirun, 26.3k at 2 threads unbound). Launchers that bind on purpose (Slurm's
// --cpus-per-task, taskset, numactl, mpirun --bind-to / --map-by ...:PE=n) are respected.
// The rules (plan_cpu_threads) follow DeepSpeed's `--bind_cores_to_rank` and PyTorch's
// default of one intra-op thread per physical core:
//  - threads: train.num_threads, or when 0 ("auto") the cores the launcher deliberately
//    bound the rank to, else the node's physical cores / ranks on the node (at least 1);
//  - binding: kept when the launcher bound the rank deliberately and it holds at least
//    `threads` CPUs; otherwise the rank is bound to its own slice of the node's cores
//    (local rank r gets cores [r * threads, (r + 1) * threads), all SMT siblings of each),
//    or to every CPU of the node when ranks x threads exceed its cores (oversubscribed).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fsdp {

// Logical CPU ids (as in /proc/cpuinfo, sched_setaffinity), ascending, no duplicates.
using CpuList = std::vector<int>;

// Parses the kernel's list format ("0-3,8,10-11", as in /sys/devices/system/cpu/online and
// cgroup cpuset files; surrounding whitespace allowed, empty text = empty list). Returns the
// ids ascending without duplicates. Throws fsdp::Error naming the text if it is malformed.
CpuList parse_cpu_list(std::string_view text);
// The inverse: ranges compressed ("0-3,8"); "" for an empty list.
std::string format_cpu_list(const CpuList& cpus);

// The CPUs a rank of this node may use, grouped by physical core.
struct CpuTopology {
  // One entry per physical core, each its logical CPUs (SMT siblings) ascending; cores
  // ordered by their first CPU. Only CPUs of the node set (see read_cpu_topology).
  std::vector<CpuList> cores;
  CpuList all_cpus() const;  // every CPU of every core, ascending
};
// The node set: the CPUs of this process's cgroup (cgroup v2 cpuset.cpus.effective, or v1
// cpuset.effective_cpus), else /sys/devices/system/cpu/online, else 0..hardware_concurrency-1;
// grouped by (physical_package_id, core_id) from /sys/devices/system/cpu/cpuN/topology
// (a CPU without topology files is its own core). Never throws; never empty.
CpuTopology read_cpu_topology();

struct CpuThreadPlan {
  int threads = 1;      // OpenMP threads of this rank (>= 1)
  CpuList bind;         // CPUs to bind the rank to; empty = keep the current affinity
  CpuList cpus;         // the CPUs the rank runs on once the plan is applied (bind, or the
                        // current affinity when bind is empty)
  int node_cores = 0;   // physical cores of the node set (read_cpu_topology), set by
                        // setup_cpu_threads
  std::string note;     // one line worth logging (a deliberate binding overridden, or the
                        // node's cores oversubscribed by threads > 1); empty otherwise
};

// The plan for one rank (the rules at the top of this file). requested: train.num_threads
// (0 = auto, else >= 1). local_rank in [0, local_size): this rank's place among the ranks of
// its node. affinity: the CPUs the rank is bound to now. deliberate: whether that binding was
// asked for (see launcher_bound_deliberately); a non-deliberate binding is ignored. Pure
// function; throws fsdp::Error if requested < 0, local_rank is out of range or node has no
// core.
CpuThreadPlan plan_cpu_threads(int requested, int local_rank, int local_size,
                               const CpuTopology& node, const CpuList& affinity, bool deliberate);

// Whether the current binding of this process (affinity, a subset of node) was asked for:
// under Open MPI (OMPI_COMM_WORLD_LOCAL_RANK set) only when a binding policy was given
// (mpirun --bind-to / --map-by / --cpus-per-rank export OMPI_MCA_hwloc_base_binding_policy;
// Open MPI's default core binding exports nothing); under any other launcher whenever the
// affinity is narrower than the node set.
bool launcher_bound_deliberately(const CpuList& affinity, const CpuTopology& node);

// The CPUs the calling thread may run on (sched_getaffinity); the node set if unknown.
CpuList current_affinity(const CpuTopology& node);

// Reads the topology, the affinity and the launcher's environment, plans, and applies the
// plan: binds the calling thread and every thread of the OpenMP pool (plan.threads of them)
// to plan.bind. Call before any other thread this rank should cover is started (threads
// started later inherit the binding). Throws fsdp::Error naming the CPUs if binding fails.
CpuThreadPlan setup_cpu_threads(int requested, int local_rank, int local_size);

}  // namespace fsdp
