// The distributed runtime: MPI, the world communicator, the mesh and the backend
// (see fsdp/train/runtime.hpp).
#include "fsdp/train/runtime.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {
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
  world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
  self_ = std::make_unique<MpiCommunicator>(MPI_COMM_SELF);
}

Runtime::~Runtime() {
  backend_.reset();
  mesh_.reset();
  self_.reset();
  world_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) MPI_Finalize();
}

Communicator& Runtime::world() { return *world_; }
Communicator& Runtime::self() { return *self_; }
int Runtime::rank() { return world_->rank(); }

void Runtime::configure(Communicator& group, const Config& config) {
  backend_.reset();
  mesh_.reset();
  mesh_ = std::make_unique<DeviceMesh>(DeviceMesh::create(group, config.mesh.shard_size));
  int threads = static_cast<int>(config.train.num_threads);
  if (threads <= 0) {
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, hw / std::max(1, mesh_->local_size()));
  }
  backend_ = make_cpu_backend(threads);
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
