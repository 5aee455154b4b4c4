// Background shard-file writer (see fsdp/checkpoint/async_writer.hpp).
#include "fsdp/checkpoint/async_writer.hpp"

#include <hdf5.h>

#include <chrono>
#include <utility>

#include "fsdp/core/error.hpp"

namespace fsdp::ckpt {

AsyncShardWriter::~AsyncShardWriter() {
  if (thread_.joinable()) thread_.join();
}

float* AsyncShardWriter::buffer(std::size_t i, int64_t numel) {
  if (busy()) throw Error("checkpoint: staging buffer requested while a write is in flight");
  if (buffers_.size() <= i) buffers_.resize(i + 1);
  buffers_[i].resize(static_cast<std::size_t>(numel));
  return buffers_[i].data();
}

int64_t AsyncShardWriter::staged_bytes() const {
  int64_t bytes = 0;
  for (const std::vector<float>& b : buffers_) {
    bytes += static_cast<int64_t>(b.size() * sizeof(float));
  }
  return bytes;
}

void AsyncShardWriter::start(std::string path, CheckpointMeta meta,
                             std::vector<UnitShardView> units) {
  if (busy()) throw Error("checkpoint: " + path + ": a shard write is already in flight");
  path_ = std::move(path);
  meta_ = std::move(meta);
  units_ = std::move(units);
  error_ = nullptr;
  done_.store(false, std::memory_order_relaxed);
  auto body = [this] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      write_shard_file(path_, meta_, units_);
    } catch (...) {
      error_ = std::current_exception();
    }
    write_ms_ =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    done_.store(true, std::memory_order_release);
  };
  if (!hdf5_threadsafe()) {
    // HDF5 built without its global lock: the main thread may use HDF5 meanwhile (data
    // loading), so the write runs here, synchronously; wait() still reports its result.
    thread_ = std::thread([] {});
    body();
    return;
  }
  thread_ = std::thread(body);
}

bool AsyncShardWriter::hdf5_threadsafe() {
  static const bool threadsafe = [] {
    hbool_t ts = false;
    return H5is_library_threadsafe(&ts) >= 0 && ts;
  }();
  return threadsafe;
}

void AsyncShardWriter::wait() {
  if (!thread_.joinable()) return;
  thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace fsdp::ckpt
