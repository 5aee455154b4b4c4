// fsdp/checkpoint/async_writer.hpp: one background thread writing one shard file
// (checkpoint.async_save, docs/checkpoint.md "Asynchronous saves").
//
// The trainer stages this rank's shards (parameters and optimizer state) into host buffers
// the writer owns and reuses from one save to the next, then start()s a thread that runs
// write_shard_file on them while training goes on. The thread makes no MPI call; whether
// every rank's write succeeded is agreed by the main thread (collective_guard around wait()).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/checkpoint/checkpoint.hpp"

namespace fsdp::ckpt {

// Owns the staging buffers and at most one writer thread. Destruction joins the thread
// (never throws; an error it had is dropped). Not copyable or movable (the thread points
// at the buffers). All members are called from one (the main) thread.
class AsyncShardWriter {
 public:
  AsyncShardWriter() = default;
  AsyncShardWriter(const AsyncShardWriter&) = delete;
  AsyncShardWriter& operator=(const AsyncShardWriter&) = delete;
  ~AsyncShardWriter();

  // Staging buffer `i` resized to `numel` floats (its capacity is kept between saves, so a
  // save of the same model allocates nothing after the first). Throws fsdp::Error while a
  // write is in flight (busy()): the thread may be reading the buffers.
  float* buffer(std::size_t i, int64_t numel);

  // Starts a thread running write_shard_file(path, meta, units); `units` must point into
  // buffer()s (or other memory that stays unchanged until wait() returns). Throws
  // fsdp::Error if a write is already in flight. If the HDF5 library is not thread-safe
  // (hdf5_threadsafe() false) the write runs in the calling thread before start() returns
  // (the main thread may use HDF5 meanwhile); wait() then reports it the same way.
  void start(std::string path, CheckpointMeta meta, std::vector<UnitShardView> units);

  // Bytes of the staging buffers as last sized (numel x 4 each): after a save, one copy of
  // this rank's shard file's datasets.
  int64_t staged_bytes() const;

  // True between start() and the wait() that joins it.
  bool busy() const { return thread_.joinable(); }
  // True when no write is in flight or the thread has finished (successfully or not):
  // wait() will not block. Cheap (one atomic load): polled at every step boundary.
  bool finished() const { return !busy() || done_.load(std::memory_order_acquire); }
  // Joins the thread (blocks until the file is written or the write failed), then rethrows
  // the write's exception if it had one (once). No-op when nothing was started.
  void wait();
  // Milliseconds the last finished write took in the thread (0 before any).
  double last_write_ms() const { return write_ms_; }
  // Whether the HDF5 library was built thread-safe (H5is_library_threadsafe; Debian's is):
  // only then does the write run beside the main thread.
  static bool hdf5_threadsafe();

 private:
  std::vector<std::vector<float>> buffers_;
  std::string path_;
  CheckpointMeta meta_;
  std::vector<UnitShardView> units_;
  std::exception_ptr error_;
  std::atomic<bool> done_{false};
  double write_ms_ = 0.0;
  std::thread thread_;  // last: joined by the destructor before the members it reads go
};

}  // namespace fsdp::ckpt
