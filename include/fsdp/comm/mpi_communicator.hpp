// fsdp/comm/mpi_communicator.hpp: Communicator over an MPI communicator (host buffers),
// with non-blocking MPI collectives (MPI_Iallgather, MPI_Ireduce_scatter_block,
// MPI_Iallreduce). The CPU backend's communicator, and the fallback on one GPU.
#pragma once

#include <mpi.h>

#include <memory>

#include "fsdp/comm/communicator.hpp"

namespace fsdp {

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm` (MPI_Comm_dup), so our traffic never mixes with the caller's.
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }

  std::unique_ptr<Work> all_gather(const void* send, void* recv, std::size_t count,
                                   DType dtype) override;
  std::unique_ptr<Work> reduce_scatter(const void* send, void* recv, std::size_t count,
                                       DType dtype, ReduceOp op) override;
  std::unique_ptr<Work> all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                                   ReduceOp op) override;
  void broadcast(void* buf, std::size_t count, DType dtype, int root) override;
  void barrier() override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace fsdp
