// fsdp/train/runtime.hpp: the process's distributed runtime: MPI initialisation, the world
// communicator, and for each job its DeviceMesh and its Backend.
//
// One Runtime per process, passed down (never looked up): `fsdp_train`'s main builds it
// first, and everything that talks to other ranks gets its communicators from it. It is the
// only place that calls MPI_Init_thread / MPI_Finalize and the only place a backend is chosen,
// so the trainer and engine headers need no <mpi.h>.
//
// Communicators: world() and self() carry host memory (failure agreement, counters, the
// metrics' peak memory); the mesh's communicators carry backend memory (parameters,
// gradients, the loss and norms), NCCL ones once the CUDA backend lands.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fsdp/backend/backend.hpp"
#include "fsdp/backend/peak_flops.hpp"
#include "fsdp/comm/communicator.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/train/memory_check.hpp"  // MemoryBudget
#include "fsdp/train/watchdog.hpp"

namespace fsdp {

// Where a job runs, as every rank of a group agreed (Runtime::configure's first step).
struct DeviceChoice {
  bool cuda = false;  // the CUDA backend (else the CPU backend)
  bool nccl = false;  // NCCL communicators (else MPI; staged through host memory on CUDA)
};

// Chooses the backend and communicator from the config and what each rank sees, the same on
// every rank of `group` (a host communicator; collective over it: one all_reduce of 3 int32).
//   visible_devices: CUDA devices this rank sees (0 without CUDA); local_size: ranks on this
//   rank's node; built_with_cuda: whether this binary has the CUDA backend.
// cuda = train.device "cuda", or "auto" with CUDA built in and a device visible on every
// rank. nccl = on CUDA, comm.backend "nccl", or "auto" where every rank's node has a device
// per rank (NCCL refuses two ranks of one communicator on one device). Each rank judging
// only its own node would let ranks of different nodes pick different communicators (NCCL's
// unique-id broadcast against MPI's split: MPI_ERR_TRUNCATE or a hang), so the verdict is
// the group's. Throws InputError with the same line on every rank, naming the key and the
// lowest offending rank, for: train.device "cuda" without CUDA built in, or with a rank that
// sees no device; "auto" where some ranks see a device and others none; comm.backend "nccl"
// on the CPU backend or where ranks share a device.
DeviceChoice choose_device(Communicator& group, DeviceKind device, CommBackend comm,
                           int visible_devices, int local_size, bool built_with_cuda);

class Runtime {
 public:
  // Initialises MPI with MPI_Init_thread(MPI_THREAD_FUNNELED) (argc/argv may be null) and
  // throws fsdp::Error naming the level if the library provides less. If MPI is already
  // initialised (a test's main did it), adopts it and leaves MPI_Finalize to that owner.
  // Then all-gathers every rank's host name, pid and start time (collective over
  // MPI_COMM_WORLD) and installs the peer watchdog (fsdp/train/watchdog.hpp) on world(),
  // self() and every communicator split from them: a blocking wait on an MPI collective that
  // outlasts comm.timeout_s (600 s until configure() sets the job's), or a rank of this host
  // exiting while others wait for it, prints one line naming the rank and host and ends the
  // job with MPI_Abort (exit code 1).
  Runtime(int* argc, char*** argv);
  ~Runtime();  // frees the communicators, then MPI_Finalize if this object initialised MPI
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Communicator& world();  // every rank (MPI_COMM_WORLD, duplicated once), host memory
  Communicator& self();   // this rank alone, host memory
  int rank();             // world().rank()
  // Host name, pid and start time of every world rank (indexed by world rank), gathered at
  // start-up.
  const std::vector<PeerInfo>& peers() const;

  // Builds the job's DeviceMesh over `group` (world() or self(); mesh.shard_size from the
  // config) and its Backend, replacing any previous job's. Collective over `group`. Sets the
  // watchdog's timeout to comm.timeout_s (seconds).
  //  - train.device: "cuda" (or "auto" when built with CUDA and a GPU is visible) selects
  //    the GPU node-local rank % visible devices and the CUDA backend; otherwise the CPU
  //    backend with train.num_threads threads (0: this node's cores / ranks on the node).
  //  - comm.backend: the mesh's communicators. "nccl" (or "auto" on the CUDA backend when
  //    every rank of the node has its own GPU): NCCL, unique ids exchanged over the MPI
  //    groups; on CUDA otherwise MPI with device buffers staged through pinned host memory;
  //    on CPU the MPI communicators themselves.
  // Throws InputError naming the key for a bad mesh.shard_size, train.device = "cuda"
  // without CUDA or without a visible GPU, or comm.backend = "nccl" where it cannot run.
  void configure(Communicator& group, const Config& config);
  const DeviceMesh& mesh() const;  // throws fsdp::Error before configure()
  Backend& backend();
  // fsdp.cpu_offload: the host runtime (a CPU backend with train.num_threads threads, the
  // optimizer's cores) that holds the engine's shards and the optimizer state; null without
  // offload. Built by configure().
  DeviceRuntime* offload_runtime() { return offload_.get(); }
  // Memory this rank may plan to use, measured by configure() before the job allocates
  // anything: on the CPU backend the host's available memory (fsdp/core/host_memory.hpp:
  // MemAvailable or the cgroup limit, the smaller) divided by the ranks on this node; on
  // CUDA the device's free memory (cudaMemGetInfo) divided by the ranks sharing the device.
  // bytes = -1 when it cannot be measured. `source` says how it was measured, for messages:
  // "MemAvailable 22.5 GiB / 2 ranks on this node".
  const MemoryBudget& memory_budget() const { return memory_budget_; }
  // Host memory this rank may plan to use (MemAvailable or the cgroup limit, divided by the
  // ranks on this node), whatever the backend: the budget of fsdp.cpu_offload's host rows.
  const MemoryBudget& host_memory_budget() const { return host_memory_budget_; }
  // Peak FLOP/s of one rank, the denominator of MFU, set by configure(): train.peak_flops
  // when > 0, else the device's (fsdp/backend/peak_flops.hpp: the published dense peak of a
  // known GPU for mixed_precision.param_dtype, or the CPU estimate for this rank's threads);
  // flops_per_s = 0 when unknown (MFU is then not reported).
  const PeakFlops& peak_flops() const { return peak_flops_; }
  // "cpu (2 threads)", "cuda:0 NVIDIA H100 80GB HBM3, nccl" (for the banner).
  const std::string& device_description() const { return device_description_; }

  // Ends every rank of the world at once with `exit_code` (MPI_Abort): for errors that were
  // not agreed (collective_guard), when peers may be waiting in a collective.
  [[noreturn]] void abort(int exit_code) noexcept;

 private:
  bool owns_mpi_ = false;
  std::shared_ptr<PeerWatch> watch_;
  std::unique_ptr<Communicator> world_, self_;
  std::unique_ptr<DeviceMesh> host_mesh_;  // MPI groups (bootstrap of device communicators)
  std::unique_ptr<DeviceMesh> mesh_;       // the mesh the engine uses
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Backend> offload_;  // fsdp.cpu_offload's host runtime
  std::string device_description_;
  MemoryBudget memory_budget_, host_memory_budget_;
  PeakFlops peak_flops_;
};

}  // namespace fsdp
