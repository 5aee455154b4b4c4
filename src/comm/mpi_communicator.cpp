// MPI implementation of the Communicator interface over host buffers: non-blocking MPI
// collectives, user-defined MPI_Ops for bf16/fp16 reductions, the avg division and the
// in-place reduce-scatter move applied on completion (see fsdp/comm/mpi_communicator.hpp).
#include "fsdp/comm/mpi_communicator.hpp"

#include <time.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "fsdp/comm/mpi_check.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {
namespace detail {

// bf16/fp16 reductions: widen to fp32, combine, round back to nearest even. Commutative.
template <bool kBf16>
float half_load(uint16_t h) {
  return kBf16 ? bf16_to_f32(h) : f16_to_f32(h);
}
template <bool kBf16>
uint16_t half_store(float f) {
  return kBf16 ? f32_to_bf16(f) : f32_to_f16(f);
}

template <bool kBf16>
void half_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    b[i] = half_store<kBf16>(half_load<kBf16>(a[i]) + half_load<kBf16>(b[i]));
  }
}

template <bool kBf16>
void half_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = half_load<kBf16>(a[i]), y = half_load<kBf16>(b[i]);
    if (x > y || std::isnan(x)) b[i] = a[i];  // NaN propagates
  }
}

// Owns the user-defined MPI_Ops; shared by a communicator, its splits and pending Works.
class MpiReduceOps {
 public:
  MpiReduceOps() {
    try {
      FSDP_CHECK_MPI(MPI_Op_create(&half_sum<true>, 1, &bf16_sum_));
      FSDP_CHECK_MPI(MPI_Op_create(&half_max<true>, 1, &bf16_max_));
      FSDP_CHECK_MPI(MPI_Op_create(&half_sum<false>, 1, &f16_sum_));
      FSDP_CHECK_MPI(MPI_Op_create(&half_max<false>, 1, &f16_max_));
    } catch (...) {
      release();
      throw;
    }
  }
  ~MpiReduceOps() { release(); }
  MpiReduceOps(const MpiReduceOps&) = delete;
  MpiReduceOps& operator=(const MpiReduceOps&) = delete;

  // The MPI_Op computing `op` on `dtype` (avg: the sum; the division comes on completion).
  MPI_Op get(DType dtype, ReduceOp op) const {
    const bool max = op == ReduceOp::max;
    if (dtype == DType::bf16) return max ? bf16_max_ : bf16_sum_;
    if (dtype == DType::f16) return max ? f16_max_ : f16_sum_;
    return max ? MPI_MAX : MPI_SUM;
  }

 private:
  void release() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    for (MPI_Op* op : {&bf16_sum_, &bf16_max_, &f16_sum_, &f16_max_}) {
      if (*op != MPI_OP_NULL && !finalized) MPI_Op_free(op);
      *op = MPI_OP_NULL;
    }
  }

  MPI_Op bf16_sum_ = MPI_OP_NULL, bf16_max_ = MPI_OP_NULL;
  MPI_Op f16_sum_ = MPI_OP_NULL, f16_max_ = MPI_OP_NULL;
};

}  // namespace detail

namespace {

// Element type on the wire: 16-bit floats travel as 16-bit words.
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
  }
  throw Error("MpiCommunicator: unknown dtype");
}

int mpi_count(std::size_t count, const char* what) {
  if (count > static_cast<std::size_t>(INT_MAX)) {
    throw Error(std::string("MpiCommunicator::") + what + ": count " + std::to_string(count) +
                " exceeds MPI's int counts (INT_MAX elements)");
  }
  return static_cast<int>(count);
}

// The collective is ordered after `stream`: a host stream is synchronized (a no-op for
// HostStream); a device stream means device buffers, which MPI does not take here.
void enter_stream(Stream& stream, const char* what) {
  if (stream.device() != Device::cpu) {
    throw Error(std::string("MpiCommunicator::") + what +
                ": the stream is on a CUDA device; MPI over device buffers is not supported "
                "(host buffers and a host stream only)");
  }
  stream.synchronize();
}

// x[count] /= size, as documented in the header (fp32 and 16-bit floats multiply by the
// fp32 reciprocal, fp64 divides).
void divide(void* buf, std::size_t count, DType dtype, int size) {
  const float inv = 1.0f / static_cast<float>(size);
  switch (dtype) {
    case DType::f32: {
      auto* x = static_cast<float*>(buf);
      for (std::size_t i = 0; i < count; ++i) x[i] *= inv;
      break;
    }
    case DType::f64: {
      auto* x = static_cast<double*>(buf);
      const double d = size;
      for (std::size_t i = 0; i < count; ++i) x[i] /= d;
      break;
    }
    case DType::bf16: {
      auto* x = static_cast<uint16_t*>(buf);
      for (std::size_t i = 0; i < count; ++i) x[i] = f32_to_bf16(bf16_to_f32(x[i]) * inv);
      break;
    }
    case DType::f16: {
      auto* x = static_cast<uint16_t*>(buf);
      for (std::size_t i = 0; i < count; ++i) x[i] = f32_to_f16(f16_to_f32(x[i]) * inv);
      break;
    }
    default: break;  // integers never get here (Communicator::check_op)
  }
}

// Completes `request` by polling MPI_Test: spinning for the first millisecond (short
// collectives finish at full speed), then sleeping ~50 us between tests (a waiting rank
// yields its core), calling `hook` every kWaitHookInterval_s. Returns MPI_Test's error code.
int poll_request(MPI_Request* request, const char* what, WaitHook* hook) noexcept {
  using Clock = std::chrono::steady_clock;
  int flag = 0;
  int rc = MPI_Test(request, &flag, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS || flag) return rc;
  const auto start = Clock::now();
  const auto spin = std::chrono::milliseconds(1);
  const auto interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(kWaitHookInterval_s));
  auto next_hook = start + interval;
  for (;;) {
    rc = MPI_Test(request, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || flag) return rc;
    const auto now = Clock::now();
    if (now - start < spin) continue;
    if (hook != nullptr && now >= next_hook) {
      hook->waiting(what, std::chrono::duration<double>(now - start).count());
      next_hook = now + interval;
    }
    const timespec nap{0, 50 * 1000};
    nanosleep(&nap, nullptr);  // EINTR (a signal): simply test again
  }
}

// A collective in flight, shared by its Work and the Work's events: the MPI request and
// what completion must do afterwards (move an in-place reduce-scatter result, divide).
struct Pending {
  MPI_Request request = MPI_REQUEST_NULL;
  const char* what = "collective";  // for the wait hook
  std::shared_ptr<WaitHook> hook;
  bool finished = false;
  const char* move_from = nullptr;  // in-place reduce_scatter: result at the buffer's start
  char* move_to = nullptr;
  std::size_t move_bytes = 0;
  void* avg_buf = nullptr;  // avg: recv[avg_count] /= avg_size
  std::size_t avg_count = 0;
  DType dtype = DType::f32;
  int avg_size = 1;
  std::shared_ptr<detail::MpiReduceOps> ops;  // keeps a user op alive while in flight

  void finish() {
    if (move_bytes > 0 && move_from != move_to) std::memmove(move_to, move_from, move_bytes);
    if (avg_buf != nullptr) divide(avg_buf, avg_count, dtype, avg_size);
    finished = true;
    ops.reset();
  }
  void complete() {
    if (finished) return;
    if (request != MPI_REQUEST_NULL) FSDP_CHECK_MPI(poll_request(&request, what, hook.get()));
    finish();
  }
  bool test() {
    if (finished) return true;
    int flag = 1;
    if (request != MPI_REQUEST_NULL) FSDP_CHECK_MPI(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
    if (flag) finish();
    return flag != 0;
  }
  void complete_noexcept() noexcept {
    if (finished) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
      finished = true;
      return;
    }
    if (request != MPI_REQUEST_NULL && poll_request(&request, what, hook.get()) != MPI_SUCCESS) {
      finished = true;  // nothing sensible to do with the buffers
      return;
    }
    finish();
  }
};

class MpiEvent final : public Event {
 public:
  explicit MpiEvent(std::shared_ptr<Pending> p) : p_(std::move(p)) {}
  void record(Stream&) override {}
  void synchronize() override { p_->complete(); }
  bool query() override { return p_->test(); }

 private:
  std::shared_ptr<Pending> p_;
};

class MpiWork final : public Work {
 public:
  explicit MpiWork(std::shared_ptr<Pending> p) : p_(std::move(p)) {}
  ~MpiWork() override { p_->complete_noexcept(); }
  void wait() override { p_->complete(); }
  std::shared_ptr<Event> done() override { return std::make_shared<MpiEvent>(p_); }

 private:
  std::shared_ptr<Pending> p_;
};

// The completion state of collective `what`, watched by `hook`.
std::shared_ptr<Pending> new_pending(const char* what, const std::shared_ptr<WaitHook>& hook) {
  auto p = std::make_shared<Pending>();
  p->what = what;
  p->hook = hook;
  return p;
}

// A Work that is already complete (a collective that exchanges nothing: local_impl).
std::unique_ptr<Work> finished_work() {
  auto p = std::make_shared<Pending>();
  p->finished = true;
  return std::make_unique<MpiWork>(std::move(p));
}

// The completion state of a reduction into recv[count]: keeps the user ops alive and, for
// avg, divides recv by the group size once the request completes.
std::shared_ptr<Pending> reduction_pending(const std::shared_ptr<detail::MpiReduceOps>& ops,
                                           int size, void* recv, std::size_t count, DType dtype,
                                           ReduceOp op) {
  auto p = std::make_shared<Pending>();
  p->ops = ops;
  if (op == ReduceOp::avg) {
    p->avg_buf = recv;
    p->avg_count = count;
    p->dtype = dtype;
    p->avg_size = size;
  }
  return p;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm)
    : ops_(std::make_shared<detail::MpiReduceOps>()) {
  FSDP_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  try {
    FSDP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    FSDP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  } catch (...) {
    MPI_Comm_free(&comm_);
    throw;
  }
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::shared_ptr<detail::MpiReduceOps> ops,
                                 std::shared_ptr<WaitHook> hook)
    : comm_(comm), ops_(std::move(ops)), hook_(std::move(hook)) {
  try {
    FSDP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    FSDP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  } catch (...) {
    MPI_Comm_free(&comm_);
    throw;
  }
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

std::unique_ptr<Work> MpiCommunicator::all_gather_impl(const void* send, void* recv,
                                                       std::size_t count, DType dtype,
                                                       Stream& stream) {
  enter_stream(stream, "all_gather");
  const int n = mpi_count(count, "all_gather");
  const void* in_place = static_cast<const char*>(recv) + rank_ * count * dtype_size(dtype);
  auto p = new_pending("all_gather", hook_);
  FSDP_CHECK_MPI(MPI_Iallgather(send == in_place ? MPI_IN_PLACE : send, n, mpi_type(dtype), recv,
                                n, mpi_type(dtype), comm_, &p->request));
  return std::make_unique<MpiWork>(std::move(p));
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter_impl(const void* send, void* recv,
                                                           std::size_t count, DType dtype,
                                                           ReduceOp op, Stream& stream) {
  enter_stream(stream, "reduce_scatter");
  const int n = mpi_count(count, "reduce_scatter");
  const std::size_t bytes = count * dtype_size(dtype);
  const char* mine = static_cast<const char*>(send) + rank_ * bytes;
  auto p = reduction_pending(ops_, size_, recv, count, dtype, op);
  p->what = "reduce_scatter";
  p->hook = hook_;
  if (recv == mine) {
    // MPI_IN_PLACE: send[size * count] in, result in send[0 : count]; moved to recv on
    // completion (the other chunks of send are scratch).
    p->move_from = static_cast<const char*>(send);
    p->move_to = static_cast<char*>(recv);
    p->move_bytes = bytes;
    FSDP_CHECK_MPI(MPI_Ireduce_scatter_block(MPI_IN_PLACE, const_cast<void*>(send), n,
                                             mpi_type(dtype), ops_->get(dtype, op), comm_,
                                             &p->request));
  } else {
    FSDP_CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(dtype),
                                             ops_->get(dtype, op), comm_, &p->request));
  }
  return std::make_unique<MpiWork>(std::move(p));
}

std::unique_ptr<Work> MpiCommunicator::all_reduce_impl(const void* send, void* recv,
                                                       std::size_t count, DType dtype,
                                                       ReduceOp op, Stream& stream) {
  enter_stream(stream, "all_reduce");
  const int n = mpi_count(count, "all_reduce");
  auto p = reduction_pending(ops_, size_, recv, count, dtype, op);
  p->what = "all_reduce";
  p->hook = hook_;
  FSDP_CHECK_MPI(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, n, mpi_type(dtype),
                                ops_->get(dtype, op), comm_, &p->request));
  return std::make_unique<MpiWork>(std::move(p));
}

std::unique_ptr<Work> MpiCommunicator::broadcast_impl(void* buf, std::size_t count, DType dtype,
                                                      int root, Stream& stream) {
  enter_stream(stream, "broadcast");
  const int n = mpi_count(count, "broadcast");
  auto p = new_pending("broadcast", hook_);
  FSDP_CHECK_MPI(MPI_Ibcast(buf, n, mpi_type(dtype), root, comm_, &p->request));
  return std::make_unique<MpiWork>(std::move(p));
}

// Count 0 or a group of one (see Communicator::local_impl): the collectives' own stream and
// count checks first, so that such a call fails where the collective would; then the copy.
std::unique_ptr<Work> MpiCommunicator::local_impl(const char* what, const void* send, void* recv,
                                                  std::size_t count, DType dtype,
                                                  Stream& stream) {
  enter_stream(stream, what);
  mpi_count(count, what);
  if (count > 0 && send != recv) std::memmove(recv, send, count * dtype_size(dtype));
  return finished_work();
}

void MpiCommunicator::barrier() {
  if (size_ <= 1) return;
  MPI_Request request = MPI_REQUEST_NULL;
  FSDP_CHECK_MPI(MPI_Ibarrier(comm_, &request));
  FSDP_CHECK_MPI(poll_request(&request, "barrier", hook_.get()));
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  MPI_Comm out = MPI_COMM_NULL;
  FSDP_CHECK_MPI(MPI_Comm_split(comm_, color, key, &out));
  return std::unique_ptr<Communicator>(new MpiCommunicator(out, ops_, hook_));
}

std::unique_ptr<Communicator> MpiCommunicator::split_node() {
  MPI_Comm out = MPI_COMM_NULL;
  FSDP_CHECK_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out));
  return std::unique_ptr<Communicator>(new MpiCommunicator(out, ops_, hook_));
}

}  // namespace fsdp
