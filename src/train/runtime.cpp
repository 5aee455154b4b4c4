// The distributed runtime: MPI, the world communicator, the mesh and the backend
// (see fsdp/train/runtime.hpp).
#include "fsdp/train/runtime.hpp"

#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/backend/cpu_threads.hpp"
#include "fsdp/backend/peak_flops.hpp"
#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/comm/mpi_check.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/host_memory.hpp"
#include "fsdp/core/process.hpp"
#include "fsdp/train/watchdog.hpp"
#ifdef FSDP_WITH_CUDA
#include "fsdp/cuda/cuda_backend.hpp"
#include "fsdp/cuda/device.hpp"
#include "fsdp/cuda/nccl_communicator.hpp"
#include "fsdp/cuda/staged_communicator.hpp"
#endif

namespace fsdp {
namespace {
// train.peak_flops when set (> 0), else what `device()` (an optional<PeakFlops>) finds, else
// unknown; the device is not asked when the config says (the CPU estimate measures a clock).
template <class DevicePeak>
PeakFlops peak_or_device(const Config& config, DevicePeak device) {
  if (config.train.peak_flops > 0) return {config.train.peak_flops, "train.peak_flops"};
  return device().value_or(PeakFlops{});
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "unknown";
  }
}
}  // namespace

Runtime::Runtime(int* argc, char*** argv) {
  int initialised = 0;
  FSDP_CHECK_MPI(MPI_Initialized(&initialised));
  int provided = MPI_THREAD_SINGLE;
  if (!initialised) {
    FSDP_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    owns_mpi_ = true;
  } else {
    FSDP_CHECK_MPI(MPI_Query_thread(&provided));
  }
  if (provided < MPI_THREAD_FUNNELED) {
    // OpenMP threads inside kernels need at least FUNNELED (only the main thread calls MPI).
    throw Error(std::string("MPI provides ") + thread_level_name(provided) +
                ", fsdp_train needs MPI_THREAD_FUNNELED");
  }
  auto world = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
  set_world_rank(world->rank());  // fsdp::where() in error lines (core asks no MPI)
  auto self = std::make_unique<MpiCommunicator>(MPI_COMM_SELF);
  // Every rank's host name and pid, for the watchdog's diagnosis of a silent peer.
  constexpr std::size_t kHost = 256;
  struct Entry {
    char host[kHost];
    int64_t pid;
    int64_t start_time;
  };
  Entry mine{};
  std::snprintf(mine.host, kHost, "%s", host_name().c_str());
  mine.pid = static_cast<int64_t>(getpid());
  mine.start_time = process_start_time(mine.pid);
  std::vector<Entry> all(static_cast<std::size_t>(world->size()));
  world->all_gather(&mine, all.data(), sizeof(Entry), DType::u8)->wait();
  std::vector<PeerInfo> peers;
  for (const Entry& e : all) {
    peers.push_back({std::string(e.host, strnlen(e.host, kHost)), e.pid, e.start_time});
  }
  watch_ = std::make_shared<PeerWatch>(world->rank(), std::move(peers), CommConfig{}.timeout_s,
                                       [](const std::string& line) {
                                         if (line.empty()) _exit(kExitRuntimeError);
                                         std::fprintf(stderr, "fsdp_train: %s\n", line.c_str());
                                         std::fflush(stderr);
                                         MPI_Abort(MPI_COMM_WORLD, kExitRuntimeError);
                                       });
  world->set_wait_hook(watch_);
  self->set_wait_hook(watch_);
  world_ = std::move(world);
  self_ = std::move(self);
}

Runtime::~Runtime() {
  offload_.reset();
  backend_.reset();
  mesh_.reset();
  host_mesh_.reset();
  self_.reset();
  world_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) MPI_Finalize();
}

Communicator& Runtime::world() { return *world_; }
Communicator& Runtime::self() { return *self_; }
int Runtime::rank() { return world_->rank(); }
const std::vector<PeerInfo>& Runtime::peers() const { return watch_->peers(); }

DeviceChoice choose_device(Communicator& group, DeviceKind device, CommBackend comm,
                           int visible_devices, int local_size, bool built_with_cuda) {
  const int rank = group.rank(), size = group.size();
  // Each entry is max-reduced: 0 where a rank is fine, else (size - rank), so the maximum
  // names the lowest offending rank (size - max).
  const bool has_device = visible_devices > 0;
  const bool own_device = local_size <= visible_devices;
  int32_t v[3] = {has_device ? 0 : size - rank, has_device ? size - rank : 0,
                  own_device ? 0 : size - rank};
  int32_t agreed[3];
  group.all_reduce(v, agreed, 3, DType::i32, ReduceOp::max)->wait();
  const int lacking = agreed[0] ? size - agreed[0] : -1;  // lowest rank seeing no device
  const int having = agreed[1] ? size - agreed[1] : -1;   // lowest rank seeing one
  const int sharing = agreed[2] ? size - agreed[2] : -1;  // lowest rank sharing a device
  const std::string of = " of " + std::to_string(size);

  DeviceChoice c;
  if (device == DeviceKind::cuda) {
    if (!built_with_cuda) {
      throw InputError("train.device: \"cuda\" but this fsdp_train was built without CUDA "
                       "(configure with -DFSDP_CUDA=ON)");
    }
    if (lacking >= 0) {
      throw InputError("train.device: \"cuda\" but rank " + std::to_string(lacking) + of +
                       " sees no CUDA device (check the driver and CUDA_VISIBLE_DEVICES)");
    }
    c.cuda = true;
  } else if (device == DeviceKind::auto_ && built_with_cuda) {
    if (lacking >= 0 && having >= 0) {
      throw InputError("train.device: \"auto\" but rank " + std::to_string(having) + of +
                       " sees a CUDA device and rank " + std::to_string(lacking) +
                       " none; every rank must run the same backend (set \"cpu\" or \"cuda\")");
    }
    c.cuda = lacking < 0;
  }
  if (comm == CommBackend::nccl && !c.cuda) {
    throw InputError("comm.backend: \"nccl\" needs the CUDA backend (train.device)");
  }
  if (comm == CommBackend::nccl && sharing >= 0) {
    throw InputError("comm.backend: \"nccl\" but rank " + std::to_string(sharing) + of +
                     " shares a GPU with other ranks of its node (NCCL needs one GPU per rank; "
                     "use \"mpi\")");
  }
  c.nccl = c.cuda && (comm == CommBackend::nccl || (comm == CommBackend::auto_ && sharing < 0));
  return c;
}

#ifdef FSDP_WITH_CUDA
namespace {
// fsdp.cpu_offload's host memory on CUDA: page-locked (fast copies to and from the device);
// where the driver cannot pin more, pageable aligned memory instead (slower copies, same
// results: aligned_host_allocator). Each pointer is freed the way it was allocated. Large
// blocks are first touched by `threads` threads (cuda::pinned_host_alloc).
HostAllocator pinned_or_pageable(int threads) {
  struct Pageable {
    HostAllocator aligned = aligned_host_allocator();
    std::mutex mu;
    std::set<void*> ptrs;
  };
  auto pageable = std::make_shared<Pageable>();
  HostAllocator a;
  a.allocate = [pageable, threads](std::size_t bytes) -> void* {
    if (void* p = cuda::pinned_host_alloc(bytes, threads)) return p;
    void* p = pageable->aligned.allocate(bytes);
    if (p) {
      std::lock_guard<std::mutex> lock(pageable->mu);
      pageable->ptrs.insert(p);
    }
    return p;
  };
  a.free = [pageable](void* p) {
    {
      std::lock_guard<std::mutex> lock(pageable->mu);
      if (pageable->ptrs.erase(p) != 0) {
        pageable->aligned.free(p);
        return;
      }
    }
    cuda::pinned_host_free(p);
  };
  return a;
}
}  // namespace
#endif

void Runtime::configure(Communicator& group, const Config& config) {
  offload_.reset();
  backend_.reset();
  mesh_.reset();
  host_mesh_.reset();
  memory_budget_ = {};
  watch_->set_timeout(config.comm.timeout_s);
  host_mesh_ = std::make_unique<DeviceMesh>(DeviceMesh::create(group, config.mesh.shard_size));
  const DeviceMesh& hm = *host_mesh_;
  {
    const int local = std::max(1, hm.local_size());
    const HostMemory host = read_host_memory();
    host_memory_budget_.bytes = host.available() < 0 ? -1 : host.available() / local;
    host_memory_budget_.source = host.describe() + " / " + std::to_string(local) +
                                 (local == 1 ? " rank" : " ranks") + " on this node";
  }
#ifdef FSDP_WITH_CUDA
  const int devices = cuda::visible_device_count();
  constexpr bool built_with_cuda = true;
#else
  constexpr int devices = 0;
  constexpr bool built_with_cuda = false;
#endif
  const DeviceChoice choice = choose_device(group, config.train.device, config.comm.backend,
                                            devices, hm.local_size(), built_with_cuda);
  if (!choice.cuda) {
    // Thread count and core binding (fsdp/backend/cpu_threads.hpp): Open MPI's default
    // one-core binding would put every OpenMP thread of the rank on one core.
    const int local = std::max(1, hm.local_size());
    const CpuThreadPlan plan =
        setup_cpu_threads(static_cast<int>(config.train.num_threads), hm.local_rank(), local);
    const int threads = plan.threads;
    memory_budget_ = host_memory_budget_;
    backend_ = make_cpu_backend(threads);
    if (config.fsdp.offloaded()) offload_ = make_cpu_backend(threads);
    mesh_ = std::move(host_mesh_);  // host memory: the MPI groups are the mesh
    peak_flops_ = peak_or_device(config, [&] {
      return cpu_peak_flops(read_cpu_info(),
                            std::min<double>(threads, static_cast<double>(plan.node_cores) / local));
    });
    device_description_ = "cpu (" + std::to_string(threads) + (threads == 1 ? " thread" : " threads") +
                          " per rank; rank " + std::to_string(group.rank()) + " on CPUs " +
                          format_cpu_list(plan.cpus) +
                          (plan.note.empty() ? "" : "; " + plan.note) + "), mpi";
    return;
  }
#ifdef FSDP_WITH_CUDA
  const int device = cuda::select_device(hm.local_rank());
  // Ranks of this node that share `device` (round-robin: local_rank % devices).
  const int sharing = (hm.local_size() - 1 - device) / devices + 1;
  {
    const cuda::DeviceMemory dm = cuda::device_memory(device);
    memory_budget_.bytes = dm.free / sharing;
    memory_budget_.source = "cuda:" + std::to_string(device) + " free " +
                            human_bytes(static_cast<double>(dm.free)) + " / " +
                            std::to_string(sharing) + (sharing == 1 ? " rank" : " ranks");
  }
  backend_ = cuda::make_cuda_backend(device);
  if (config.fsdp.offloaded()) {  // the optimizer's cores: train.num_threads, bound as on CPU
    const CpuThreadPlan plan = setup_cpu_threads(static_cast<int>(config.train.num_threads),
                                                 hm.local_rank(), std::max(1, hm.local_size()));
    offload_ = make_cpu_backend(plan.threads, pinned_or_pageable(plan.threads));
  }
  const bool nccl = choice.nccl;
  const double timeout = config.comm.timeout_s;
  mesh_ = std::make_unique<DeviceMesh>(hm.map([&](Communicator& host) -> std::unique_ptr<Communicator> {
    if (nccl) return cuda::NcclCommunicator::create(host, device, timeout);
    return cuda::StagedCommunicator::create(host);
  }));
  peak_flops_ = peak_or_device(config, [&] {
    auto peak = gpu_peak_flops(cuda::device_name(device), config.mixed_precision.param_dtype);
    if (peak && sharing > 1) {  // ranks sharing the GPU each get their share
      peak->flops_per_s /= sharing;
      peak->source += " / " + std::to_string(sharing) + " ranks sharing it";
    }
    return peak;
  });
  device_description_ = "cuda:" + std::to_string(device) + " " + cuda::device_name(device) +
                        (nccl ? ", nccl" : ", mpi (staged through host memory)");
#endif
}

const DeviceMesh& Runtime::mesh() const {
  if (!mesh_) throw Error("Runtime: mesh() before configure()");
  return *mesh_;
}

Backend& Runtime::backend() {
  if (!backend_) throw Error("Runtime: backend() before configure()");
  return *backend_;
}

void Runtime::abort(int exit_code) noexcept {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();  // MPI_Abort does not return; keep [[noreturn]] honest
}

}  // namespace fsdp
