// tests/test_runtime.cpp: fsdp::choose_device (fsdp/train/runtime.hpp), the backend and
// communicator choice every rank of a group must agree on. Under mpirun at 1, 2 and 4
// ranks, with the MPI communicator standing in and each rank told a different number of
// visible devices, so the disagreements of a heterogeneous cluster (or of two ranks on one
// GPU) are reproduced without a GPU: on the GPU machine, two ranks deciding independently
// picked NCCL on one rank and the staged MPI path on another and failed with
// MPI_ERR_TRUNCATE.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/train/runtime.hpp"

namespace {

using fsdp::CommBackend;
using fsdp::DeviceKind;

struct Outcome {
  bool threw = false;
  std::string message;
  int exit_code = 0;
  fsdp::DeviceChoice choice;
};

Outcome choose(fsdp::Communicator& g, DeviceKind d, CommBackend c, int devices, int local,
               bool built = true) {
  Outcome o;
  try {
    o.choice = fsdp::choose_device(g, d, c, devices, local, built);
  } catch (const fsdp::Error& e) {
    o.threw = true;
    o.message = e.what();
    o.exit_code = e.exit_code();
  }
  return o;
}

// Every rank got the same outcome (a throw with the same message, or the same choice).
void expect_agreed(fsdp::Communicator& g, const Outcome& o) {
  int32_t mine[3] = {o.threw, o.choice.cuda, o.choice.nccl}, lo[3], hi[3];
  g.all_reduce(mine, lo, 3, fsdp::DType::i32, fsdp::ReduceOp::max)->wait();
  for (int32_t& x : mine) x = -x;
  g.all_reduce(mine, hi, 3, fsdp::DType::i32, fsdp::ReduceOp::max)->wait();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(lo[i], -hi[i]) << "ranks disagree on field " << i;
  int32_t len = static_cast<int32_t>(o.message.size()), max_len = 0, neg = -len, min_len = 0;
  g.all_reduce(&len, &max_len, 1, fsdp::DType::i32, fsdp::ReduceOp::max)->wait();
  g.all_reduce(&neg, &min_len, 1, fsdp::DType::i32, fsdp::ReduceOp::max)->wait();
  EXPECT_EQ(max_len, -min_len) << "messages differ between ranks: " << o.message;
}

class ChooseDevice : public testing::Test {
 protected:
  fsdp::MpiCommunicator g{MPI_COMM_WORLD};
  int rank = g.rank(), size = g.size();
};

TEST_F(ChooseDevice, CpuIgnoresDevices) {
  const Outcome o = choose(g, DeviceKind::cpu, CommBackend::auto_, 8, 1);
  EXPECT_FALSE(o.threw) << o.message;
  EXPECT_FALSE(o.choice.cuda);
  EXPECT_FALSE(o.choice.nccl);
  expect_agreed(g, o);
}

TEST_F(ChooseDevice, AutoWithAGpuPerRankIsNccl) {
  const Outcome o = choose(g, DeviceKind::auto_, CommBackend::auto_, size, size);
  EXPECT_TRUE(o.choice.cuda);
  EXPECT_TRUE(o.choice.nccl);
  expect_agreed(g, o);
  const Outcome mpi = choose(g, DeviceKind::auto_, CommBackend::mpi, size, size);
  EXPECT_TRUE(mpi.choice.cuda);
  EXPECT_FALSE(mpi.choice.nccl);
}

TEST_F(ChooseDevice, AutoWithoutCudaBuiltIsCpu) {
  const Outcome o = choose(g, DeviceKind::auto_, CommBackend::auto_, 1, 1, /*built=*/false);
  EXPECT_FALSE(o.threw) << o.message;
  EXPECT_FALSE(o.choice.cuda);
  expect_agreed(g, o);
}

// Ranks sharing one GPU (the GPU machine: 2 ranks, 1 device): the staged MPI path everywhere.
TEST_F(ChooseDevice, SharedGpuIsStagedMpi) {
  const Outcome o = choose(g, DeviceKind::cuda, CommBackend::auto_, 1, size);
  EXPECT_TRUE(o.choice.cuda);
  EXPECT_EQ(o.choice.nccl, size == 1);
  expect_agreed(g, o);
}

// The last rank's node has fewer GPUs than ranks, the others have one each: judged per node
// the first ranks would pick NCCL and the last MPI. Agreed: MPI everywhere.
TEST_F(ChooseDevice, OneNodeShortOfGpusMakesEveryRankUseMpi) {
  const bool last = rank == size - 1;
  const Outcome o = choose(g, DeviceKind::cuda, CommBackend::auto_, last ? 1 : 2, last ? 2 : 1);
  EXPECT_FALSE(o.threw) << o.message;
  EXPECT_TRUE(o.choice.cuda);
  EXPECT_FALSE(o.choice.nccl);
  expect_agreed(g, o);
  const Outcome n = choose(g, DeviceKind::cuda, CommBackend::nccl, last ? 1 : 2, last ? 2 : 1);
  EXPECT_TRUE(n.threw);
  EXPECT_EQ(n.exit_code, fsdp::kExitInputError);
  EXPECT_EQ(n.message, "comm.backend: \"nccl\" but rank " + std::to_string(size - 1) + " of " +
                           std::to_string(size) +
                           " shares a GPU with other ranks of its node (NCCL needs one GPU per "
                           "rank; use \"mpi\")");
  expect_agreed(g, n);
}

// A GPU on rank 0 only: "auto" would run CUDA on rank 0 and the CPU elsewhere. (At one
// rank that is simply a GPU everywhere.)
TEST_F(ChooseDevice, AutoWithGpusOnSomeRanksIsAnInputErrorEverywhere) {
  const Outcome o = choose(g, DeviceKind::auto_, CommBackend::auto_, rank == 0 ? 1 : 0, 1);
  if (size == 1) {
    EXPECT_FALSE(o.threw) << o.message;
    EXPECT_TRUE(o.choice.cuda);
    return;
  }
  EXPECT_TRUE(o.threw);
  EXPECT_EQ(o.exit_code, fsdp::kExitInputError);
  EXPECT_EQ(o.message, "train.device: \"auto\" but rank 0 of " + std::to_string(size) +
                           " sees a CUDA device and rank 1 none; every rank must run the same "
                           "backend (set \"cpu\" or \"cuda\")");
  expect_agreed(g, o);
}

TEST_F(ChooseDevice, CudaWithARankSeeingNoDeviceIsAnInputErrorEverywhere) {
  const Outcome o = choose(g, DeviceKind::cuda, CommBackend::auto_, rank == size - 1 ? 0 : 1, 1);
  EXPECT_TRUE(o.threw);
  EXPECT_EQ(o.message, "train.device: \"cuda\" but rank " + std::to_string(size - 1) + " of " +
                           std::to_string(size) +
                           " sees no CUDA device (check the driver and CUDA_VISIBLE_DEVICES)");
  expect_agreed(g, o);
  const Outcome nb = choose(g, DeviceKind::cuda, CommBackend::auto_, 1, 1, /*built=*/false);
  EXPECT_TRUE(nb.threw);
  EXPECT_NE(nb.message.find("built without CUDA"), std::string::npos) << nb.message;
  const Outcome nc = choose(g, DeviceKind::cpu, CommBackend::nccl, 1, 1);
  EXPECT_EQ(nc.message, "comm.backend: \"nccl\" needs the CUDA backend (train.device)");
  expect_agreed(g, nc);
}

}  // namespace
