// NCCL implementation of the Communicator interface over device buffers: unique-id exchange
// over a host bootstrap communicator, non-blocking init, collectives on a communication
// stream gated by events, and bounded host waits plus a watchdog thread that abort the NCCL
// communicator on a timeout or an asynchronous error (see fsdp/cuda/nccl_communicator.hpp).
#include "fsdp/cuda/nccl_communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>

#include "fsdp/core/error.hpp"
#include "fsdp/core/process.hpp"
#include "fsdp/cuda/check.hpp"

namespace fsdp::cuda {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat;
    case DType::f64: return ncclDouble;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclHalf;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
  }
  throw Error("NcclCommunicator: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::avg: return ncclAvg;
  }
  throw Error("NcclCommunicator: unknown reduce op");
}

std::string seconds(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// Sleeps a little longer each time a host poll finds the work still pending: spin first
// (a barrier usually completes in microseconds), then back off to 1 ms.
void backoff(int& polls) {
  ++polls;
  if (polls < 64) return;
  if (polls < 256) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(polls < 1024 ? 50 : 1000));
}

// One collective in flight: its completion event (recorded on the communication stream) and
// its deadline.
struct Flight {
  Flight(const char* n, Clock::time_point d) : name(n), deadline(d) {}
  CudaEvent done;
  const char* name;
  Clock::time_point deadline;
};

}  // namespace

// Shared by the communicator, its Works and its watchdog thread.
struct NcclCommunicator::State {
  std::mutex mu;               // guards everything below but `failed`, and every NCCL call
  std::condition_variable cv;  // wakes the watchdog (new flight, stop)
  ncclComm_t comm = nullptr;   // nullptr once aborted or destroyed
  std::atomic<bool> failed{false};
  std::string error;  // the failure every later call throws (set once, with `failed`)
  std::deque<std::shared_ptr<Flight>> in_flight;  // issue order = completion order
  bool stop = false;
  int device = 0;
  double timeout_s = 0;
  std::string where;  // "rank R on HOST"

  std::string timeout_message(const std::string& what) const {
    return what + " did not finish within " + seconds(timeout_s) + " s on " + where +
           "; communicator aborted";
  }
  // `rc` an asynchronous NCCL error; call with mu held and comm valid.
  std::string async_message(const std::string& what, ncclResult_t rc) const {
    std::string msg = what + " failed on " + where + ": " + ncclGetErrorString(rc);
    if (const char* last = ncclGetLastError(comm); last && *last) msg += std::string(" (") + last + ")";
    return msg + "; communicator aborted";
  }

  // Records the failure (the first one wins) and aborts the NCCL communicator. `lk` holds
  // mu; it is released during ncclCommAbort (which may wait for the device) and re-taken.
  // Returns whether this call recorded the failure.
  bool fail(std::unique_lock<std::mutex>& lk, std::string message) noexcept {
    if (failed.load()) return false;
    error = std::move(message);  // written once, before `failed`: readers need no lock
    failed.store(true);
    ncclComm_t doomed = comm;
    comm = nullptr;  // nobody calls NCCL on it from now on
    in_flight.clear();
    if (doomed) {
      lk.unlock();
      ncclCommAbort(doomed);
      lk.lock();
    }
    return true;
  }

  [[noreturn]] void throw_error() const { throw Error(error); }  // only once `failed`
  void check() const {
    if (failed.load()) throw_error();
  }

  // Polls ncclCommGetAsyncError until the communicator's pending non-blocking call (init, a
  // collective that returned ncclInProgress, finalize) has settled; throws on an error or at
  // the deadline (after aborting).
  void settle(const std::string& what, Clock::time_point deadline) {
    for (int polls = 0;; backoff(polls)) {
      {
        std::unique_lock<std::mutex> lk(mu);
        if (failed.load()) throw_error();
        ncclResult_t state = ncclSuccess;
        const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
        if (rc != ncclSuccess) state = rc;
        if (state == ncclSuccess) return;
        if (state != ncclInProgress) {
          fail(lk, async_message(what, state));
        } else if (Clock::now() >= deadline) {
          fail(lk, timeout_message(what));
        } else {
          continue;
        }
      }
      throw_error();
    }
  }

  // Blocks the host until `f` completes; throws (after aborting) on a timeout or an
  // asynchronous NCCL error, or if the communicator has failed.
  void wait_host(const Flight& f) {
    for (int polls = 0;; backoff(polls)) {
      check();
      const cudaError_t rc = cudaEventQuery(f.done.handle());
      if (rc == cudaSuccess) {
        check();  // completed because an abort stopped it: the buffers are garbage
        return;
      }
      if (rc != cudaErrorNotReady) FSDP_CHECK_CUDA(rc);
      const bool late = Clock::now() >= f.deadline;
      if (!late && polls % 256 != 255) continue;
      {
        std::unique_lock<std::mutex> lk(mu);
        if (late) {
          fail(lk, timeout_message(std::string("NCCL collective ") + f.name));
        } else if (comm) {
          ncclResult_t state = ncclSuccess;
          if (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state != ncclSuccess &&
              state != ncclInProgress) {
            fail(lk, async_message(std::string("NCCL collective ") + f.name, state));
          }
        }
      }
    }
  }
};

namespace {

// The watchdog: completes flights, aborts on a deadline or an asynchronous error. No MPI.
void watchdog_main(std::shared_ptr<NcclCommunicator::State> s) noexcept {
  cudaSetDevice(s->device);
  const double tick_s = std::min(0.5, std::max(0.01, s->timeout_s / 20));
  const auto tick = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(tick_s));
  std::unique_lock<std::mutex> lk(s->mu);
  while (!s->stop) {
    if (s->in_flight.empty() || s->failed.load()) {
      s->cv.wait(lk, [&] { return s->stop || (!s->in_flight.empty() && !s->failed.load()); });
      continue;
    }
    std::string failure;
    while (!s->in_flight.empty()) {
      const Flight& f = *s->in_flight.front();
      const cudaError_t rc = cudaEventQuery(f.done.handle());
      if (rc == cudaSuccess) {
        s->in_flight.pop_front();
        continue;
      }
      if (rc != cudaErrorNotReady) {
        failure = std::string("NCCL collective ") + f.name + " failed on " + s->where +
                  ": CUDA error " + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc) +
                  "; communicator aborted";
      } else if (Clock::now() >= f.deadline) {
        failure = s->timeout_message(std::string("NCCL collective ") + f.name);
      }
      break;
    }
    if (failure.empty() && !s->in_flight.empty() && s->comm) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(s->comm, &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress) {
        failure = s->async_message(std::string("NCCL collective ") + s->in_flight.front()->name, state);
      }
    }
    if (!failure.empty() && s->fail(lk, failure)) {
      // The main thread may be blocked in a synchronize outside this communicator: say why
      // now; the next call on the communicator throws the same message.
      std::fprintf(stderr, "[NCCL watchdog] %s\n", failure.c_str());
      std::fflush(stderr);
    }
    s->cv.wait_for(lk, tick);
  }
}

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator::State> s, std::shared_ptr<Flight> f,
           cudaStream_t issuing)
      : s_(std::move(s)), f_(std::move(f)), issuing_(issuing) {}

  ~NcclWork() override {
    if (waited_ || s_->failed.load()) return;
    try {
      s_->wait_host(*f_);
    } catch (const std::exception& e) {  // the communicator is aborted; later calls throw
      std::fprintf(stderr, "%s\n", e.what());
      std::fflush(stderr);
    }
  }

  void wait() override {
    s_->check();  // first: a Work waited before the abort throws on every later wait too
    if (waited_) return;
    FSDP_CHECK_CUDA(cudaStreamWaitEvent(issuing_, f_->done.handle(), 0));
    waited_ = true;
  }

  std::shared_ptr<Event> done() override { return std::shared_ptr<Event>(f_, &f_->done); }

  void host_wait() {
    s_->wait_host(*f_);
    waited_ = true;
  }

 private:
  std::shared_ptr<NcclCommunicator::State> s_;
  std::shared_ptr<Flight> f_;
  cudaStream_t issuing_;
  bool waited_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> bootstrap, int device,
                                   double timeout_s)
    : bootstrap_(std::move(bootstrap)),
      rank_(bootstrap_->rank()),
      size_(bootstrap_->size()),
      device_(device),
      timeout_s_(timeout_s),
      state_(std::make_shared<State>()) {
  state_->device = device;
  state_->timeout_s = timeout_s;
  state_->where = fsdp::where();  // "rank R on HOST", kept for the watchdog
  FSDP_CHECK_CUDA(cudaSetDevice(device));
  int least = 0, greatest = 0;
  FSDP_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  default_stream_ = std::make_unique<CudaStream>();
  comm_stream_ = std::make_unique<CudaStream>(greatest);
  ready_ = std::make_unique<CudaEvent>();
  FSDP_CHECK_CUDA(cudaMallocAsync(&scratch_, sizeof(int32_t), comm_stream_->handle()));
  FSDP_CHECK_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(int32_t), comm_stream_->handle()));
}

NcclCommunicator::~NcclCommunicator() { shutdown(); }

namespace {
// The same arguments on every rank give the same verdict, so no rank is left in a collective.
void check_create_arguments(const Communicator& bootstrap, int device, double timeout_s) {
  if (bootstrap.device() != Device::cpu) {
    throw Error("NcclCommunicator::create: the bootstrap communicator must carry host memory "
                "(an MPI communicator); it carries device memory");
  }
  if (!(timeout_s > 0)) {
    throw Error("NcclCommunicator::create: timeout " + seconds(timeout_s) +
                " s must be positive");
  }
  if (device < 0) {
    throw Error("NcclCommunicator::create: device " + std::to_string(device) + " is negative");
  }
}
}  // namespace

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(Communicator& bootstrap, int device,
                                                           double timeout_s) {
  check_create_arguments(bootstrap, device, timeout_s);
  return create_owned(bootstrap.split(0, bootstrap.rank()), device, timeout_s);
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create_owned(
    std::unique_ptr<Communicator> bootstrap, int device, double timeout_s) {
  check_create_arguments(*bootstrap, device, timeout_s);
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(std::move(bootstrap), device, timeout_s));
  c->init();
  return c;
}

void NcclCommunicator::init() {
  // A group of one makes no NCCL communicator: every collective on it is local_impl's copy
  // and barrier() returns at once, so none would ever be called, while ncclCommInitRank and
  // its destruction cost ~0.5 s per group (the H200 of 2026-11-28: each NCCL case of
  // test_nccl_comm at 1 rank took 0.52 s, the staged ones 0-0.1 s; a world of one builds
  // four groups, world, shard, replicate and self, 2 s a run). The flights, the watchdog and
  // the timeouts are those of every other group.
  if (size_ == 1) {
    watchdog_ = std::thread(watchdog_main, state_);
    return;
  }
  // 1. Rank 0 makes the unique id and broadcasts it with a success flag (so a failure there
  //    is reported on every rank instead of leaving them in the broadcast).
  struct {
    ncclUniqueId id;
    int32_t ok;
  } hello{};
  std::string failure;
  if (rank_ == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&hello.id);
    hello.ok = rc == ncclSuccess;
    if (rc != ncclSuccess) {
      failure = std::string("ncclGetUniqueId failed on ") + state_->where + ": " + ncclGetErrorString(rc);
    }
  }
  bootstrap_->broadcast(&hello, sizeof hello, DType::u8, 0)->wait();
  if (!hello.ok) {
    throw Error(rank_ == 0 ? failure
                           : "NCCL communicator initialisation: ncclGetUniqueId failed on rank 0 "
                             "of the group (" + std::to_string(size_) + " ranks); seen on " +
                                 state_->where);
  }

  // 2. Non-blocking init, bounded by the timeout.
  const std::string what = "NCCL communicator initialisation (" + std::to_string(size_) + " ranks)";
  try {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm, size_, hello.id, rank_, &config);
    {
      std::lock_guard<std::mutex> lk(state_->mu);
      state_->comm = comm;
    }
    if (rc != ncclSuccess && rc != ncclInProgress) {
      {
        std::unique_lock<std::mutex> lk(state_->mu);
        state_->fail(lk, state_->comm ? state_->async_message(what, rc)
                                      : what + " failed on " + state_->where + ": " +
                                            ncclGetErrorString(rc));
      }
      state_->throw_error();
    }
    state_->settle(what, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(timeout_s_)));
  } catch (const Error& e) {
    failure = e.what();
  }

  // 3. Agreement: every rank learns whether any init failed.
  int32_t bad = failure.empty() ? 0 : 1;
  bootstrap_->all_reduce(&bad, &bad, 1, DType::i32, ReduceOp::max)->wait();
  if (!failure.empty()) throw Error(failure);
  if (bad) {
    {
      std::unique_lock<std::mutex> lk(state_->mu);
      state_->fail(lk, what + " failed on another rank of the group; communicator aborted on " +
                           state_->where);
    }
    state_->throw_error();
  }
  watchdog_ = std::thread(watchdog_main, state_);
}

void NcclCommunicator::shutdown() noexcept {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    if (state_->comm && !state_->failed.load()) {
      // Finalize (flushes collectives in flight; completes when the group is quiescent),
      // bounded by the timeout; destroy on success, abort otherwise.
      const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(timeout_s_));
      ncclResult_t state = ncclCommFinalize(state_->comm);
      for (int polls = 0; state == ncclSuccess || state == ncclInProgress; backoff(polls)) {
        if (ncclCommGetAsyncError(state_->comm, &state) != ncclSuccess) state = ncclInternalError;
        if (state != ncclInProgress || Clock::now() >= deadline) break;
      }
      if (state == ncclSuccess) {
        ncclCommDestroy(state_->comm);
      } else {
        ncclCommAbort(state_->comm);
      }
    } else if (state_->comm) {
      ncclCommAbort(state_->comm);
    }
    state_->comm = nullptr;
    state_->in_flight.clear();
  }
  if (scratch_) cudaFreeAsync(scratch_, comm_stream_->handle());
  scratch_ = nullptr;
}

void NcclCommunicator::abort() noexcept {
  std::unique_lock<std::mutex> lk(state_->mu);
  state_->fail(lk, "NCCL communicator aborted (abort() called) on " + state_->where);
}

bool NcclCommunicator::aborted() const noexcept { return state_->failed.load(); }

// Orders the collective after `after`, enqueues it on the communication stream (enqueue is
// called with the mutex held, the NCCL communicator and the stream), settles a non-blocking
// ncclInProgress, records the completion event and hands it to the watchdog.
template <class Enqueue>
std::unique_ptr<Work> NcclCommunicator::issue(const char* name, cudaStream_t after,
                                              Enqueue&& enqueue) {
  state_->check();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s_));
  auto flight = std::make_shared<Flight>(name, deadline);
  const cudaStream_t cs = comm_stream_->handle();
  if (after != cs) {
    FSDP_CHECK_CUDA(cudaEventRecord(ready_->handle(), after));
    FSDP_CHECK_CUDA(cudaStreamWaitEvent(cs, ready_->handle(), 0));
  }
  ncclResult_t rc = ncclSuccess;
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->check();
    rc = enqueue(state_->comm, cs);
  }
  if (rc == ncclInProgress) {
    state_->settle(std::string("NCCL collective ") + name, deadline);
  } else if (rc != ncclSuccess) {
    detail::throw_nccl_error(rc, name, __FILE__, __LINE__);
  }
  FSDP_CHECK_CUDA(cudaEventRecord(flight->done.handle(), cs));
  bool wake = false;  // the watchdog sleeps while nothing is in flight
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    wake = state_->in_flight.empty();
    state_->in_flight.push_back(flight);
  }
  if (wake) state_->cv.notify_one();
  return std::make_unique<NcclWork>(state_, std::move(flight), after);
}

std::unique_ptr<Work> NcclCommunicator::all_gather_impl(const void* send, void* recv,
                                                        std::size_t count, DType dtype,
                                                        Stream& stream) {
  const cudaStream_t after = native(stream);
  const ncclDataType_t type = nccl_type(dtype);
  return issue("all_gather", after, [&](ncclComm_t comm, cudaStream_t s) -> ncclResult_t {
    return ncclAllGather(send, recv, count, type, comm, s);
  });
}

std::unique_ptr<Work> NcclCommunicator::reduce_scatter_impl(const void* send, void* recv,
                                                            std::size_t count, DType dtype,
                                                            ReduceOp op, Stream& stream) {
  const cudaStream_t after = native(stream);
  const ncclDataType_t type = nccl_type(dtype);
  const ncclRedOp_t red = nccl_op(op);
  return issue("reduce_scatter", after, [&](ncclComm_t comm, cudaStream_t s) -> ncclResult_t {
    return ncclReduceScatter(send, recv, count, type, red, comm, s);
  });
}

std::unique_ptr<Work> NcclCommunicator::all_reduce_impl(const void* send, void* recv,
                                                        std::size_t count, DType dtype,
                                                        ReduceOp op, Stream& stream) {
  const cudaStream_t after = native(stream);
  const ncclDataType_t type = nccl_type(dtype);
  const ncclRedOp_t red = nccl_op(op);
  return issue("all_reduce", after, [&](ncclComm_t comm, cudaStream_t s) -> ncclResult_t {
    return ncclAllReduce(send, recv, count, type, red, comm, s);
  });
}

std::unique_ptr<Work> NcclCommunicator::broadcast_impl(void* buf, std::size_t count, DType dtype,
                                                       int root, Stream& stream) {
  const cudaStream_t after = native(stream);
  const ncclDataType_t type = nccl_type(dtype);
  return issue("broadcast", after, [&](ncclComm_t comm, cudaStream_t s) -> ncclResult_t {
    return ncclBroadcast(buf, buf, count, type, root, comm, s);
  });
}

// Count 0 or a group of one: no NCCL call, but the same path as a collective (ordered after
// `stream` on the communication stream, a completion event watched by the watchdog and bound
// by the timeout, refused once aborted), with a device-to-device copy when send != recv.
std::unique_ptr<Work> NcclCommunicator::local_impl(const char* what, const void* send,
                                                   void* recv, std::size_t count, DType dtype,
                                                   Stream& stream) {
  const cudaStream_t after = native(stream);
  nccl_type(dtype);  // the collectives' dtype check
  const std::size_t bytes = count * dtype_size(dtype);
  return issue(what, after, [&](ncclComm_t, cudaStream_t s) -> ncclResult_t {
    if (bytes > 0 && send != recv) {
      FSDP_CHECK_CUDA(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, s));
    }
    return ncclSuccess;
  });
}

void NcclCommunicator::barrier() {
  const cudaStream_t cs = comm_stream_->handle();
  auto work = issue("barrier", cs, [&](ncclComm_t comm, cudaStream_t s) -> ncclResult_t {
    if (size_ == 1) return ncclSuccess;
    return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm, s);
  });
  static_cast<NcclWork&>(*work).host_wait();
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  state_->check();
  return create_owned(bootstrap_->split(color, key), device_, timeout_s_);
}

std::unique_ptr<Communicator> NcclCommunicator::split_node() {
  state_->check();
  return create_owned(bootstrap_->split_node(), device_, timeout_s_);
}

}  // namespace fsdp::cuda
