// Communicator conformance tests (nccl-tests style) for the MpiCommunicator with host
// buffers, run by ctest under mpirun at 1, 2 and 4 ranks, and the DeviceMesh built on it.
// The checks themselves live in tests/comm_conformance.hpp (namespace conformance), shared
// with the device communicators' test (tests/test_nccl_comm.cpp).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm_conformance.hpp"
#include "fsdp/comm/communicator.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/core/error.hpp"

namespace {

// Every test runs on a fresh duplicate of MPI_COMM_WORLD, with host buffers.
class MpiComm : public testing::Test {
 protected:
  fsdp::MpiCommunicator comm{MPI_COMM_WORLD};
  conformance::HostMemory mem;
};

TEST_F(MpiComm, AllGather) { conformance::all_gather(comm, mem); }
TEST_F(MpiComm, ReduceScatter) { conformance::reduce_scatter(comm, mem); }
TEST_F(MpiComm, AllReduce) { conformance::all_reduce(comm, mem); }
TEST_F(MpiComm, Broadcast) { conformance::broadcast(comm, mem); }
TEST_F(MpiComm, BadArguments) { conformance::bad_arguments(comm, mem); }
TEST_F(MpiComm, WorkDoneEvent) { conformance::work_done_event(comm, mem); }
TEST_F(MpiComm, WorkDestructorCompletes) { conformance::work_destructor_completes(comm, mem); }
TEST_F(MpiComm, Split) { conformance::split(comm, mem); }
TEST_F(MpiComm, TrivialCases) { conformance::trivial_cases(comm, mem); }
TEST_F(MpiComm, DeviceMesh) { conformance::device_mesh(comm, mem); }
// DeviceMesh::map with a make that duplicates each host group (as a device mesh would wrap it).
TEST_F(MpiComm, DeviceMeshMap) {
  conformance::mesh_map(comm, mem, [](fsdp::Communicator& g) { return g.split(0, g.rank()); });
}

// The collectives on communicators made by split(): the parity groups (sizes differ when the
// world is odd) and the world with ranks reversed (all_gather's rank order follows the key).
TEST_F(MpiComm, ConformanceOnSplitCommunicators) {
  auto parity = comm.split(comm.rank() % 2, comm.rank());
  auto reversed = comm.split(0, -comm.rank());
  for (fsdp::Communicator* c : {parity.get(), reversed.get()}) {
    conformance::all_gather(*c, mem, /*large=*/false);
    conformance::reduce_scatter(*c, mem, false);
    conformance::all_reduce(*c, mem, false);
    conformance::broadcast(*c, mem, false);
  }
}

TEST_F(MpiComm, ToStringReduceOp) {
  EXPECT_STREQ(fsdp::to_string(fsdp::ReduceOp::sum), "sum");
  EXPECT_STREQ(fsdp::to_string(fsdp::ReduceOp::max), "max");
  EXPECT_STREQ(fsdp::to_string(fsdp::ReduceOp::avg), "avg");
}

// avg on integers is refused on every rank before anything is issued, so the communicator
// stays usable.
TEST_F(MpiComm, AvgOnIntegersThrows) {
  int32_t x[4] = {1, 2, 3, 4};
  std::vector<int32_t> big(4 * comm.size());
  for (fsdp::DType t : {fsdp::DType::i32, fsdp::DType::i64, fsdp::DType::u8}) {
    EXPECT_THROW(comm.all_reduce(x, x, 1, t, fsdp::ReduceOp::avg), fsdp::Error);
    EXPECT_THROW(comm.reduce_scatter(big.data(), x, 1, t, fsdp::ReduceOp::avg), fsdp::Error);
  }
  EXPECT_EQ(conformance::sum_over(comm, mem, 1), comm.size());
}

// Any host stream is accepted; a device stream is refused (no device buffers through MPI).
TEST_F(MpiComm, Streams) {
  EXPECT_EQ(comm.device(), fsdp::Device::cpu);
  EXPECT_EQ(comm.default_stream().device(), fsdp::Device::cpu);
  fsdp::HostStream other;
  int32_t v = comm.rank();
  comm.all_reduce(&v, &v, 1, fsdp::DType::i32, fsdp::ReduceOp::sum, other)->wait();
  EXPECT_EQ(v, comm.size() * (comm.size() - 1) / 2);

  struct DeviceStream final : fsdp::Stream {
    fsdp::Device device() const override { return fsdp::Device::cuda; }
    void wait(fsdp::Event&) override {}
    void synchronize() override {}
  } dev;
  int32_t buf[2] = {0, 0};
  EXPECT_THROW(comm.all_gather(buf, buf, 1, fsdp::DType::i32, dev), fsdp::Error);
  EXPECT_THROW(comm.reduce_scatter(buf, buf, 1, fsdp::DType::i32, fsdp::ReduceOp::sum, dev), fsdp::Error);
  EXPECT_THROW(comm.all_reduce(buf, buf, 1, fsdp::DType::i32, fsdp::ReduceOp::sum, dev), fsdp::Error);
  EXPECT_THROW(comm.broadcast(buf, 1, fsdp::DType::i32, 0, dev), fsdp::Error);
  EXPECT_EQ(conformance::sum_over(comm, mem, 1), comm.size());
}

// The cases with nothing to exchange keep MpiCommunicator's own checks: a device stream is
// refused and a count above INT_MAX too (before any buffer is touched), at count 0 and on a
// group of one as for any other call.
TEST_F(MpiComm, TrivialCasesKeepTheStreamAndCountChecks) {
  struct DeviceStream final : fsdp::Stream {
    fsdp::Device device() const override { return fsdp::Device::cuda; }
    void wait(fsdp::Event&) override {}
    void synchronize() override {}
  } dev;
  int32_t buf[2] = {0, 0};
  EXPECT_THROW(comm.all_gather(buf, buf, 0, fsdp::DType::i32, dev), fsdp::Error);
  EXPECT_THROW(comm.reduce_scatter(buf, buf, 0, fsdp::DType::i32, fsdp::ReduceOp::sum, dev), fsdp::Error);
  EXPECT_THROW(comm.all_reduce(buf, buf, 0, fsdp::DType::i32, fsdp::ReduceOp::sum, dev), fsdp::Error);
  EXPECT_THROW(comm.broadcast(buf, 0, fsdp::DType::i32, 0, dev), fsdp::Error);
  auto alone = comm.split(comm.rank(), 0);
  ASSERT_EQ(alone->size(), 1);
  const std::size_t huge = std::size_t{1} << 31;  // INT_MAX + 1 elements: never read
  for (fsdp::Communicator* c : {static_cast<fsdp::Communicator*>(&comm), alone.get()}) {
    try {
      c->all_reduce(buf, buf, huge, fsdp::DType::u8, fsdp::ReduceOp::sum);
      ADD_FAILURE() << "a count above INT_MAX was accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("MpiCommunicator::all_reduce: count 2147483648 exceeds"),
                std::string::npos) << e.what();
    }
    EXPECT_THROW(c->broadcast(buf, huge, fsdp::DType::u8, 0), fsdp::Error);
  }
  EXPECT_EQ(conformance::sum_over(comm, mem, 1), comm.size());
}

// Communicator's public collectives decide the trivial cases once (count 0, a group of one):
// those go to local_impl with the collective's name, the others to the collective's *_impl,
// and the argument checks come first either way.
class Dispatch final : public fsdp::Communicator {
 public:
  explicit Dispatch(int size, fsdp::Device device = fsdp::Device::cpu)
      : size_(size), device_(device) {}
  std::vector<std::string> calls;  // "all_gather_impl", "local_impl all_gather", ...
  int rank() const override { return 0; }
  int size() const override { return size_; }
  fsdp::Device device() const override { return device_; }
  const char* kind() const override { return "Dispatch"; }
  fsdp::Stream& default_stream() override { return stream_; }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }
  std::unique_ptr<Communicator> split_node() override { return nullptr; }
  // The base class's local_impl (host memory: a copy) for a test to call through the public
  // collectives.
  bool use_default_local = false;

 protected:
  struct Done final : fsdp::Work {
    void wait() override {}
    std::shared_ptr<fsdp::Event> done() override { return std::make_shared<fsdp::HostEvent>(); }
  };
  std::unique_ptr<fsdp::Work> record(std::string what) {
    calls.push_back(std::move(what));
    return std::make_unique<Done>();
  }
  std::unique_ptr<fsdp::Work> all_gather_impl(const void*, void*, std::size_t, fsdp::DType,
                                              fsdp::Stream&) override {
    return record("all_gather_impl");
  }
  std::unique_ptr<fsdp::Work> reduce_scatter_impl(const void*, void*, std::size_t, fsdp::DType,
                                                  fsdp::ReduceOp, fsdp::Stream&) override {
    return record("reduce_scatter_impl");
  }
  std::unique_ptr<fsdp::Work> all_reduce_impl(const void*, void*, std::size_t, fsdp::DType,
                                              fsdp::ReduceOp, fsdp::Stream&) override {
    return record("all_reduce_impl");
  }
  std::unique_ptr<fsdp::Work> broadcast_impl(void*, std::size_t, fsdp::DType, int,
                                             fsdp::Stream&) override {
    return record("broadcast_impl");
  }
  std::unique_ptr<fsdp::Work> local_impl(const char* what, const void* send, void* recv,
                                         std::size_t count, fsdp::DType dtype,
                                         fsdp::Stream& stream) override {
    calls.push_back(std::string("local_impl ") + what + " count=" + std::to_string(count) +
                    (send == recv ? " in-place" : ""));
    if (use_default_local) return Communicator::local_impl(what, send, recv, count, dtype, stream);
    return std::make_unique<Done>();
  }

 private:
  int size_;
  fsdp::Device device_;
  fsdp::HostStream stream_;
};

TEST(CommunicatorDispatch, TrivialCasesGoToLocalImplOnce) {
  float a[8] = {}, b[8] = {};
  using fsdp::DType;
  using fsdp::ReduceOp;
  Dispatch two(2);
  two.all_gather(a, b, 4, DType::f32);
  two.reduce_scatter(a, b, 4, DType::f32, ReduceOp::avg);
  two.all_reduce(a, b, 4, DType::f32, ReduceOp::sum);
  two.broadcast(a, 4, DType::f32, 1);
  two.all_gather(a, b, 0, DType::f32);
  two.reduce_scatter(a, b, 0, DType::bf16, ReduceOp::max);
  two.all_reduce(a, a, 0, DType::i64, ReduceOp::sum);
  two.broadcast(a, 0, DType::u8, 1);
  EXPECT_EQ(two.calls, (std::vector<std::string>{
                           "all_gather_impl", "reduce_scatter_impl", "all_reduce_impl",
                           "broadcast_impl", "local_impl all_gather count=0",
                           "local_impl reduce_scatter count=0",
                           "local_impl all_reduce count=0 in-place",
                           "local_impl broadcast count=0 in-place"}));
  Dispatch one(1);
  one.all_gather(a, b, 4, DType::f32);
  one.reduce_scatter(a, a, 4, DType::f32, ReduceOp::avg);
  one.all_reduce(a, b, 4, DType::f64, ReduceOp::max);
  one.broadcast(a, 4, DType::f32, 0);
  EXPECT_EQ(one.calls, (std::vector<std::string>{
                           "local_impl all_gather count=4", "local_impl reduce_scatter count=4 in-place",
                           "local_impl all_reduce count=4", "local_impl broadcast count=4 in-place"}));
  // The argument checks come first, trivial or not: nothing is called.
  one.calls.clear();
  EXPECT_THROW(one.all_reduce(a, a, 4, DType::i32, ReduceOp::avg), fsdp::Error);
  EXPECT_THROW(one.reduce_scatter(a, a, 0, DType::u8, ReduceOp::avg), fsdp::Error);
  EXPECT_THROW(one.broadcast(a, 0, DType::f32, 1), fsdp::Error);
  EXPECT_THROW(two.broadcast(a, 0, DType::f32, -1), fsdp::Error);
  EXPECT_TRUE(one.calls.empty());
}

TEST(CommunicatorDispatch, DefaultLocalImplCopiesHostMemoryAndRefusesDeviceMemory) {
  using fsdp::DType;
  Dispatch host(1);
  host.use_default_local = true;
  int32_t send[3] = {1, -2, 3}, recv[3] = {7, 7, 7};
  auto w = host.all_reduce(send, recv, 3, DType::i32, fsdp::ReduceOp::max);
  w->wait();
  EXPECT_TRUE(w->done()->query());
  EXPECT_EQ(recv[0], 1);
  EXPECT_EQ(recv[1], -2);
  EXPECT_EQ(recv[2], 3);
  int32_t keep[3] = {7, 7, 7};
  host.all_gather(send, keep, 0, DType::i32)->wait();  // count 0: nothing copied
  EXPECT_EQ(keep[0], 7);
  Dispatch device(1, fsdp::Device::cuda);
  device.use_default_local = true;
  try {
    device.all_gather(send, recv, 3, DType::i32);
    ADD_FAILURE() << "the default local_impl accepted device memory";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "Dispatch::all_gather: a communicator of device memory must implement local_impl");
  }
}

}  // namespace
