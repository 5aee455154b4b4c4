// fsdp/comm/mpi_communicator.hpp: Communicator over an MPI communicator (host buffers),
// with non-blocking MPI collectives (MPI_Iallgather, MPI_Ireduce_scatter_block,
// MPI_Iallreduce, MPI_Ibcast). The CPU backend's communicator, and the fallback on one GPU.
//
// Buffers are host memory (device() == Device::cpu). The Stream& of a collective must be a
// host stream (Stream::device() == Device::cpu): it is synchronized before the collective is
// issued (a no-op for HostStream); any other stream throws fsdp::Error, since device buffers
// through MPI are not supported. Counts are elements of the dtype and must fit MPI's int
// (<= INT_MAX, else fsdp::Error); count 0 issues nothing on any rank.
//
// Dtypes: all_gather and broadcast move any dtype as raw bytes (bf16/fp16 as 16-bit words).
// Reductions: fp32, fp64, int32, int64, uint8 use MPI_SUM / MPI_MAX (uint8 sums wrap);
// bf16 and fp16 use user-defined commutative MPI_Ops that widen each element to fp32, add
// (or compare) and round back to nearest even, so every partial sum is rounded to 16 bits
// as a native half add would. ReduceOp::avg (floating dtypes only; fsdp::Error for integer
// dtypes, thrown on every rank before anything is issued) is a sum followed, when the
// collective completes, by an element-wise division by size() of recv[count]:
//   fp32: x * (1.0f / size);  fp64: x / size;  bf16/fp16: round(float(x) * (1.0f / size)).
// With a power-of-two size() this is exact (barring underflow), as is NCCL's pre-multiplied
// average; otherwise the two may differ by rounding.
//
// In-place reduce_scatter (recv == send + rank * count) runs MPI_Ireduce_scatter_block with
// MPI_IN_PLACE, which leaves the result at the start of the buffer; on completion it is
// moved to recv. The chunks of send other than recv are therefore scratch in place: their
// contents afterwards are unspecified (out of place, send is left untouched).
//
// Work: completion (Work::wait(), Work::done()->synchronize(), a Work::done()->query() that
// returns true, or the Work's destructor) polls MPI_Test and then applies the in-place move
// and the avg division exactly once. A blocking wait (and barrier(), an MPI_Ibarrier) spins
// on MPI_Test for its first millisecond, then sleeps about 50 us between tests, so a rank
// waiting for a slower peer leaves its core to it instead of spinning at 100% as MPI_Wait
// does; while it waits, the communicator's WaitHook (if any) is called every 0.25 s.
// record() on the event is a no-op. A Work or its event may outlive the communicator, not
// MPI_Finalize.
//
// split()/split_node() return MpiCommunicators that own the new MPI_Comm (no second dup).
// The bf16/fp16 MPI_Ops are shared by a communicator, its splits and their pending Works,
// and freed (MPI_Op_free) with the last of them, unless MPI is already finalized.
#pragma once

#include <mpi.h>

#include <memory>

#include "fsdp/comm/communicator.hpp"

namespace fsdp {

namespace detail {
class MpiReduceOps;  // owner of the user-defined MPI_Ops (src/comm/mpi_communicator.cpp)
}  // namespace detail

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm` (MPI_Comm_dup, collective over it), so our traffic never mixes with
  // the caller's.
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;  // MPI_Comm_free unless MPI is finalized; never throws
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "MpiCommunicator"; }
  Device device() const override { return Device::cpu; }
  Stream& default_stream() override { return stream_; }
  MPI_Comm comm() const { return comm_; }
  // Watches this communicator's waits, and those of the communicators split from it later
  // (null: none). Set it before issuing collectives; not thread-safe.
  void set_wait_hook(std::shared_ptr<WaitHook> hook) { hook_ = std::move(hook); }

  void barrier() override;
  // MPI_Comm_split(color, key): color must be >= 0 (MPI reports an error otherwise).
  std::unique_ptr<Communicator> split(int color, int key) override;
  // MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), ordered by rank here.
  std::unique_ptr<Communicator> split_node() override;

 protected:
  std::unique_ptr<Work> all_gather_impl(const void* send, void* recv, std::size_t count,
                                        DType dtype, Stream& stream) override;
  std::unique_ptr<Work> reduce_scatter_impl(const void* send, void* recv, std::size_t count,
                                            DType dtype, ReduceOp op, Stream& stream) override;
  std::unique_ptr<Work> all_reduce_impl(const void* send, void* recv, std::size_t count,
                                        DType dtype, ReduceOp op, Stream& stream) override;
  std::unique_ptr<Work> broadcast_impl(void* buf, std::size_t count, DType dtype, int root,
                                       Stream& stream) override;
  // Count 0 or a group of one: the stream and count checks of the collectives, a memmove
  // when send != recv, and a complete Work.
  std::unique_ptr<Work> local_impl(const char* what, const void* send, void* recv,
                                   std::size_t count, DType dtype, Stream& stream) override;

 private:
  // Adopts `comm` (already a new communicator, e.g. from MPI_Comm_split): no dup; frees it
  // if construction fails.
  MpiCommunicator(MPI_Comm comm, std::shared_ptr<detail::MpiReduceOps> ops,
                  std::shared_ptr<WaitHook> hook);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  HostStream stream_;
  std::shared_ptr<detail::MpiReduceOps> ops_;
  std::shared_ptr<WaitHook> hook_;
};

}  // namespace fsdp
