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

}  // namespace
