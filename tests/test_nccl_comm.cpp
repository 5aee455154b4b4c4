// GPU tests of the device communicators: the conformance checks of tests/comm_conformance.hpp
// with buffers in CUDA device memory, on
//   - the NcclCommunicator, when every node has at least as many visible devices as ranks
//     (NCCL refuses two ranks of one communicator on one device): "<test>/nccl";
//   - the StagedCommunicator (MPI through pinned host memory) always: "<test>/staged".
// At np 2 on one GPU the NCCL cases are therefore not registered at all (rank 0 prints that
// and why); they are never skipped-as-passed. ctest runs this at np 1 and 2 (label gpu);
// tests/gpu_main.cpp exits 77 (not run) where no device is visible.
//
// Timeouts (NcclTimeout): a collective that cannot finish must make the communicator abort
// and throw, not hang. On one GPU the hang is made deterministically on a group of one: the
// issuing stream is stalled by a host function (cudaLaunchHostFunc) that returns only when
// released or after a few seconds, so the collective ordered after it cannot complete within
// the 1 s timeout. With 2 ranks and 2 visible devices, a real NCCL hang is tested too: only
// rank 0 of a 2-rank communicator issues a collective (NcclHang.PeerNeverJoins: a suite of its
// own, since a gtest suite's tests must all be TEST or all TEST_F of one fixture).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm_conformance.hpp"
#include "fsdp/comm/communicator.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/process.hpp"
#include "fsdp/cuda/device.hpp"
#include "fsdp/cuda/nccl_communicator.hpp"
#include "fsdp/cuda/staged_communicator.hpp"
#include "fsdp/cuda/stream.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kTimeoutS = 120;  // conformance runs: generous, a hang still ends

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(rc) + ": " +
                             cudaGetErrorString(rc));
  }
}

// Device memory for the conformance bodies. upload() synchronizes the device: cudaMemcpy
// from pageable memory may return before the data has landed, and the collectives run on
// non-blocking streams that do not wait for the legacy default stream.
class DeviceMemory final : public conformance::TestMemory {
 public:
  void* alloc(std::size_t bytes) override {
    void* p = nullptr;
    if (bytes) check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void release(void* p) override {
    if (p) cudaFree(p);
  }
  void upload(void* dst, const void* src, std::size_t bytes) override {
    if (!bytes) return;
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  void download(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
};

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// This rank's index and the rank count on its node (MPI_COMM_TYPE_SHARED). Collective the first
// time only (MPI_Comm_split_type), then cached, so that a later call one rank makes alone (a
// message) makes no MPI call: an uncached split in a rank-0-only message was the H100 run's
// MPI_ERR_TRUNCATE at 2 ranks on 1 GPU (rank 0 in MPI_Comm_split_type against rank 1's next
// MPI_Allreduce). Every rank makes the first call at the same point (the first test's SetUp).
std::pair<int, int> node_rank_size() {
  static const std::pair<int, int> cached = [] {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int r = 0, s = 1;
    MPI_Comm_rank(node, &r);
    MPI_Comm_size(node, &s);
    MPI_Comm_free(&node);
    return std::pair<int, int>{r, s};
  }();
  return cached;
}

// Whether NCCL can run over the world: on every node, ranks <= visible devices. Agreed by
// all ranks once, at the first call (every rank reaches it in the same test), so every rank
// skips the same NCCL cases and later calls make no MPI call.
bool nccl_fits_world() {
  static const bool fits = [] {
    const int devices = fsdp::cuda::visible_device_count();
    int mine = node_rank_size().second <= devices ? 1 : 0, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all != 0;
  }();
  return fits;
}

enum class Kind { nccl, staged };

std::string kind_name(const testing::TestParamInfo<Kind>& info) {
  return info.param == Kind::nccl ? "nccl" : "staged";
}

// Why the NCCL cases cannot run in this world (reported as each case's skip reason, so a run
// with more ranks than GPUs says what it did not test instead of registering fewer tests).
std::string nccl_skip_reason() {
  return "NCCL needs one CUDA device per rank; a node runs " +
         std::to_string(node_rank_size().second) + " ranks but sees " +
         std::to_string(fsdp::cuda::visible_device_count()) +
         " device(s) (the StagedCommunicator cases run the same checks)";
}

class DeviceComm : public testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == Kind::nccl && !nccl_fits_world()) GTEST_SKIP() << nccl_skip_reason();
    device_ = fsdp::cuda::select_device(node_rank_size().first);
    comm_ = make(world_);
  }
  // The kind's communicator over the host group `g` (for splits and DeviceMesh::map too).
  std::unique_ptr<fsdp::Communicator> make(fsdp::Communicator& g) {
    if (GetParam() == Kind::nccl) return fsdp::cuda::NcclCommunicator::create(g, device_, kTimeoutS);
    return fsdp::cuda::StagedCommunicator::create(g);
  }

  fsdp::MpiCommunicator world_{MPI_COMM_WORLD};
  int device_ = 0;
  std::unique_ptr<fsdp::Communicator> comm_;
  DeviceMemory mem_;
};

TEST_P(DeviceComm, AllGather) { conformance::all_gather(*comm_, mem_); }
TEST_P(DeviceComm, ReduceScatter) { conformance::reduce_scatter(*comm_, mem_); }
TEST_P(DeviceComm, AllReduce) { conformance::all_reduce(*comm_, mem_); }
TEST_P(DeviceComm, Broadcast) { conformance::broadcast(*comm_, mem_); }
TEST_P(DeviceComm, BadArguments) { conformance::bad_arguments(*comm_, mem_); }
TEST_P(DeviceComm, WorkDoneEvent) { conformance::work_done_event(*comm_, mem_); }
TEST_P(DeviceComm, WorkDestructorCompletes) { conformance::work_destructor_completes(*comm_, mem_); }
TEST_P(DeviceComm, Split) { conformance::split(*comm_, mem_); }
TEST_P(DeviceComm, TrivialCases) { conformance::trivial_cases(*comm_, mem_); }

TEST_P(DeviceComm, ConformanceOnSplitCommunicators) {
  auto parity = comm_->split(comm_->rank() % 2, comm_->rank());
  auto reversed = comm_->split(0, -comm_->rank());
  for (fsdp::Communicator* c : {parity.get(), reversed.get()}) {
    conformance::all_gather(*c, mem_, /*large=*/false);
    conformance::reduce_scatter(*c, mem_, false);
    conformance::all_reduce(*c, mem_, false);
    conformance::broadcast(*c, mem_, false);
  }
}

// A device mesh made from the host one with DeviceMesh::map.
TEST_P(DeviceComm, DeviceMeshMap) {
  conformance::mesh_map(world_, mem_, [this](fsdp::Communicator& g) { return make(g); });
}

TEST_P(DeviceComm, BarrierAndStreams) {
  EXPECT_EQ(comm_->device(), fsdp::Device::cuda);
  EXPECT_EQ(comm_->default_stream().device(), fsdp::Device::cuda);
  comm_->barrier();
  comm_->barrier();
  // Another CUDA stream is accepted; a host stream is refused before anything is issued.
  fsdp::cuda::CudaStream other;
  EXPECT_EQ(conformance::sum_over(*comm_, mem_, 1), comm_->size());
  conformance::Buffer d(mem_, 8);
  fsdp::HostStream host;
  EXPECT_THROW(comm_->all_reduce(d.get(), d.get(), 1, fsdp::DType::i32, fsdp::ReduceOp::sum, host),
               fsdp::Error);
  EXPECT_THROW(comm_->all_gather(d.get(), d.get(), 1, fsdp::DType::i32, host), fsdp::Error);
  int32_t v = comm_->rank(), got = 0;
  mem_.upload(d.get(), &v, 4);
  comm_->all_reduce(d.get(), d.get(), 1, fsdp::DType::i32, fsdp::ReduceOp::sum, other)->wait();
  other.synchronize();
  mem_.download(&got, d.get(), 4);
  EXPECT_EQ(got, comm_->size() * (comm_->size() - 1) / 2);
  // avg on integers throws on every rank before anything is issued: still usable after.
  for (fsdp::DType t : {fsdp::DType::i32, fsdp::DType::i64, fsdp::DType::u8}) {
    EXPECT_THROW(comm_->all_reduce(d.get(), d.get(), 1, t, fsdp::ReduceOp::avg), fsdp::Error);
  }
  EXPECT_EQ(conformance::sum_over(*comm_, mem_, 1), comm_->size());
}

// Keeps a stream busy in a host function until released (or max_s passed), then returns.
class Stall {
 public:
  Stall(fsdp::cuda::CudaStream& stream, double max_s) : stream_(stream), max_s_(max_s) {
    check(cudaLaunchHostFunc(stream.handle(), &Stall::run, this), "cudaLaunchHostFunc");
  }
  ~Stall() {
    release();
    cudaStreamSynchronize(stream_.handle());
  }
  void release() { released_.store(true); }

 private:
  static void CUDART_CB run(void* p) {
    auto* self = static_cast<Stall*>(p);
    const auto end = Clock::now() + std::chrono::duration<double>(self->max_s_);
    while (!self->released_.load() && Clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  fsdp::cuda::CudaStream& stream_;
  double max_s_;
  std::atomic<bool> released_{false};
};

// The collective waits for the work its issuing stream had queued (here: a 200 ms host
// function, then the upload of its input), and wait() orders the result before that stream.
TEST_P(DeviceComm, OrderedAfterIssuingStream) {
  fsdp::cuda::CudaStream s;
  const std::size_t n = std::size_t{1} << 16;
  float *in = nullptr, *out = nullptr;
  check(cudaMallocHost(&in, n * 4), "cudaMallocHost");
  check(cudaMallocHost(&out, n * 4), "cudaMallocHost");
  conformance::Buffer d(mem_, n * 4);
  std::vector<float> zeros(n, 0.f);
  mem_.upload(d.get(), zeros.data(), n * 4);
  for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<float>(comm_->rank() + 1);
  {
    Stall stall(s, 0.2);
    check(cudaMemcpyAsync(d.get(), in, n * 4, cudaMemcpyHostToDevice, s.handle()), "upload");
    comm_->all_reduce(d.get(), d.get(), n, fsdp::DType::f32, fsdp::ReduceOp::sum, s)->wait();
    check(cudaMemcpyAsync(out, d.get(), n * 4, cudaMemcpyDeviceToHost, s.handle()), "download");
    check(cudaStreamSynchronize(s.handle()), "cudaStreamSynchronize");
  }
  const int size = comm_->size();
  conformance::Case c{"all_reduce fp32 sum after a stalled issuing stream"};
  for (std::size_t i = 0; i < n; ++i) c.wrong += out[i] != static_cast<float>(size * (size + 1) / 2);
  cudaFreeHost(in);
  cudaFreeHost(out);
  conformance::expect_all_zero(*comm_, mem_, {c});
}

INSTANTIATE_TEST_SUITE_P(Communicators, DeviceComm, testing::Values(Kind::nccl, Kind::staged), kind_name);

// ---- NCCL only ----
class NcclComm : public DeviceComm {};

TEST_P(NcclComm, CreateRejectsBadArguments) {
  // A device-memory bootstrap, a non-positive timeout: refused on every rank, nothing created.
  EXPECT_THROW(fsdp::cuda::NcclCommunicator::create(*comm_, device_, kTimeoutS), fsdp::Error);
  EXPECT_THROW(fsdp::cuda::NcclCommunicator::create(world_, device_, 0), fsdp::Error);
  EXPECT_EQ(conformance::sum_over(*comm_, mem_, 1), comm_->size());
}

TEST_P(NcclComm, AbortThenEveryCallThrows) {
  auto& nccl = static_cast<fsdp::cuda::NcclCommunicator&>(*comm_);
  EXPECT_FALSE(nccl.aborted());
  nccl.abort();
  nccl.abort();  // idempotent
  EXPECT_TRUE(nccl.aborted());
  conformance::Buffer d(mem_, 4);
  try {
    nccl.all_reduce(d.get(), d.get(), 1, fsdp::DType::i32, fsdp::ReduceOp::sum);
    ADD_FAILURE() << "all_reduce on an aborted communicator did not throw";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.exit_code(), fsdp::kExitRuntimeError);
    EXPECT_NE(std::string(e.what()).find("NCCL communicator aborted"), std::string::npos) << e.what();
  }
  EXPECT_THROW(nccl.barrier(), fsdp::Error);
  EXPECT_THROW(nccl.split(0, 0), fsdp::Error);
}

INSTANTIATE_TEST_SUITE_P(Communicators, NcclComm, testing::Values(Kind::nccl), kind_name);

// ---- timeouts ----
std::string timeout_message(const char* collective, const char* seconds) {
  return std::string("NCCL collective ") + collective + " did not finish within " + seconds +
         " s on rank " + std::to_string(world_rank()) + " on " + fsdp::host_name() +
         "; communicator aborted";
}

// A group of one per rank (works on a shared device), 1 s timeout.
class NcclTimeout : public testing::Test {
 protected:
  void SetUp() override {
    device_ = fsdp::cuda::select_device(node_rank_size().first);
    self_ = world_.split(world_.rank(), 0);
    comm_ = fsdp::cuda::NcclCommunicator::create(*self_, device_, 1.0);
  }
  fsdp::MpiCommunicator world_{MPI_COMM_WORLD};
  std::unique_ptr<fsdp::Communicator> self_;
  int device_ = 0;
  std::unique_ptr<fsdp::cuda::NcclCommunicator> comm_;
  DeviceMemory mem_;
};

// A host wait of the communicator (barrier) past the deadline aborts and throws; later calls
// throw the same error. Issuing after a stalled stream never blocks the host.
TEST_F(NcclTimeout, BarrierThrowsAfterTimeout) {
  conformance::Buffer d(mem_, 1024 * 4);
  fsdp::cuda::CudaStream s;
  Stall stall(s, 3.0);  // bounded: an abort that waits for the device waits <= 3 s
  const auto t0 = Clock::now();
  auto work = comm_->all_reduce(d.get(), d.get(), 1024, fsdp::DType::f32, fsdp::ReduceOp::sum, s);
  work->wait();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 0.5)
      << "issue + wait() blocked the host";
  std::string first;
  try {
    comm_->barrier();
    ADD_FAILURE() << "barrier after a stalled collective did not throw";
  } catch (const fsdp::Error& e) {
    first = e.what();
    EXPECT_EQ(e.exit_code(), fsdp::kExitRuntimeError);
  }
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(waited, 0.9);
  EXPECT_LT(waited, 5.0) << "the timeout did not end the wait";
  // The watchdog (all_reduce's deadline comes first) or the barrier's own wait saw it.
  EXPECT_TRUE(first == timeout_message("all_reduce", "1") || first == timeout_message("barrier", "1"))
      << first;
  EXPECT_TRUE(comm_->aborted());
  try {
    work->wait();
    ADD_FAILURE() << "Work::wait on an aborted communicator did not throw";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(std::string(e.what()), first);
  }
  EXPECT_THROW(comm_->all_reduce(d.get(), d.get(), 1, fsdp::DType::f32, fsdp::ReduceOp::sum), fsdp::Error);
  work.reset();  // aborted: returns at once
  stall.release();
}

// Nobody waits on the host: the watchdog alone aborts at the deadline, and the next call
// throws, naming the collective.
TEST_F(NcclTimeout, WatchdogAbortsWithoutAHostWait) {
  conformance::Buffer d(mem_, 1024 * 4);
  fsdp::cuda::CudaStream s;
  Stall stall(s, 3.0);  // bounded: an abort that waits for the device waits <= 3 s
  auto work = comm_->all_reduce(d.get(), d.get(), 1024, fsdp::DType::f32, fsdp::ReduceOp::sum, s);
  work->wait();
  const auto t0 = Clock::now();
  while (!comm_->aborted() && Clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(comm_->aborted()) << "the watchdog did not abort within 5 s (timeout 1 s)";
  try {
    comm_->all_reduce(d.get(), d.get(), 1, fsdp::DType::f32, fsdp::ReduceOp::sum);
    ADD_FAILURE() << "all_reduce on an aborted communicator did not throw";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(std::string(e.what()), timeout_message("all_reduce", "1"));
  }
  stall.release();
}

// A real NCCL hang: only rank 0 of a 2-rank communicator (2 devices) issues a collective.
TEST(NcclHang, PeerNeverJoins) {
  if (world_size() != 2) GTEST_SKIP() << "needs exactly 2 ranks (runs in test_nccl_comm_np2)";
  if (!nccl_fits_world()) GTEST_SKIP() << nccl_skip_reason();
  fsdp::MpiCommunicator world(MPI_COMM_WORLD);
  const int device = fsdp::cuda::select_device(node_rank_size().first);
  DeviceMemory mem;
  conformance::Buffer d(mem, 1024 * 4);
  {
    auto comm = fsdp::cuda::NcclCommunicator::create(world, device, 2.0);
    EXPECT_EQ(conformance::sum_over(*comm, mem, 1), 2);  // the communicator works
    if (world.rank() == 0) {
      const auto t0 = Clock::now();
      comm->all_reduce(d.get(), d.get(), 1024, fsdp::DType::f32, fsdp::ReduceOp::sum)->wait();
      try {
        comm->barrier();
        ADD_FAILURE() << "a collective rank 1 never joined did not time out";
      } catch (const fsdp::Error& e) {
        const std::string what = e.what();
        EXPECT_TRUE(what == timeout_message("all_reduce", "2") || what == timeout_message("barrier", "2"))
            << what;
      }
      EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
    }
    // Rank 1's destructor: finalize cannot complete with rank 0 aborted; bounded, then abort.
  }
  MPI_Barrier(MPI_COMM_WORLD);
}


}  // namespace
