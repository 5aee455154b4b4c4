// fsdp/backend/buffer.hpp: an owning, move-only buffer of backend memory, tagged with a
// MemCategory so the tracker sees it. The destructor never throws.
#pragma once

#include <cstddef>
#include <utility>

#include "fsdp/backend/backend.hpp"

namespace fsdp {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& backend, std::size_t bytes, MemCategory category)
      : be_(&backend), bytes_(bytes), category_(category) {
    if (bytes_ > 0) ptr_ = be_->allocate(bytes_, category_);
  }
  // A buffer of `count` floats.
  static DeviceBuffer floats(Backend& backend, std::size_t count, MemCategory category) {
    return DeviceBuffer(backend, count * sizeof(float), category);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    DeviceBuffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void reset() noexcept {
    if (ptr_) be_->deallocate(ptr_, bytes_, category_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* data() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  std::size_t bytes() const { return bytes_; }
  std::size_t floats_count() const { return bytes_ / sizeof(float); }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  void swap(DeviceBuffer& o) noexcept {
    std::swap(be_, o.be_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    std::swap(category_, o.category_);
  }
  Backend* be_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  MemCategory category_ = MemCategory::other;
};

}  // namespace fsdp
