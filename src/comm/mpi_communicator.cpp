// MPI implementation of the Communicator interface (see fsdp/comm/mpi_communicator.hpp).
#include "fsdp/comm/mpi_communicator.hpp"

#include <cstring>

#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::bf16:
    case DType::f16: break;  // no MPI reduction for 16-bit floats
  }
  throw Error("MPI communicator: dtype not supported");
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::sum ? MPI_SUM : MPI_MAX; }

// A pending non-blocking MPI collective.
class MpiWork final : public Work {
 public:
  MpiWork() = default;
  explicit MpiWork(MPI_Request r) : request_(r) {}
  ~MpiWork() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);  // never throws
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL) FSDP_CHECK_MPI(MPI_Wait(&request_, MPI_STATUS_IGNORE));
  }

 private:
  MPI_Request request_ = MPI_REQUEST_NULL;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  FSDP_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  FSDP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  FSDP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

std::unique_ptr<Work> MpiCommunicator::all_gather(const void* send, void* recv, std::size_t count,
                                                  DType dtype) {
  const std::size_t bytes = count * dtype_size(dtype);
  const void* in_place = static_cast<const char*>(recv) + rank_ * bytes;
  if (size_ == 1) {
    if (send != recv) std::memmove(recv, send, bytes);
    return std::make_unique<MpiWork>();
  }
  MPI_Request r;
  FSDP_CHECK_MPI(MPI_Iallgather(send == in_place ? MPI_IN_PLACE : send, static_cast<int>(count),
                                mpi_type(dtype), recv, static_cast<int>(count), mpi_type(dtype),
                                comm_, &r));
  return std::make_unique<MpiWork>(r);
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter(const void* send, void* recv,
                                                      std::size_t count, DType dtype,
                                                      ReduceOp op) {
  if (size_ == 1) {
    std::memcpy(recv, send, count * dtype_size(dtype));
    return std::make_unique<MpiWork>();
  }
  MPI_Request r;
  FSDP_CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), mpi_type(dtype),
                                           mpi_op(op), comm_, &r));
  return std::make_unique<MpiWork>(r);
}

std::unique_ptr<Work> MpiCommunicator::all_reduce(const void* send, void* recv, std::size_t count,
                                                  DType dtype, ReduceOp op) {
  if (size_ == 1) {
    if (send != recv) std::memcpy(recv, send, count * dtype_size(dtype));
    return std::make_unique<MpiWork>();
  }
  MPI_Request r;
  FSDP_CHECK_MPI(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                                mpi_type(dtype), mpi_op(op), comm_, &r));
  return std::make_unique<MpiWork>(r);
}

void MpiCommunicator::broadcast(void* buf, std::size_t count, DType dtype, int root) {
  if (size_ == 1) return;
  FSDP_CHECK_MPI(MPI_Bcast(buf, static_cast<int>(count), mpi_type(dtype), root, comm_));
}

void MpiCommunicator::barrier() {
  if (size_ > 1) FSDP_CHECK_MPI(MPI_Barrier(comm_));
}

}  // namespace fsdp
