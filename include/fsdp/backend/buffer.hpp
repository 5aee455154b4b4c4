// fsdp/backend/buffer.hpp: an owning, move-only buffer of backend memory with a dtype,
// tagged with a MemCategory so the tracker sees it. Memory comes from the backend's caching
// allocator; the destructor returns it there and never throws.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

#include "fsdp/backend/device_runtime.hpp"

namespace fsdp {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `numel` elements of `dtype`, uninitialised.
  DeviceBuffer(DeviceRuntime& backend, DType dtype, int64_t numel, MemCategory category)
      : be_(&backend), dtype_(dtype), numel_(numel), category_(category) {
    if (bytes() > 0) ptr_ = be_->allocate(bytes(), category_);
  }
  // A buffer of `count` fp32 elements.
  static DeviceBuffer floats(DeviceRuntime& backend, int64_t count, MemCategory category) {
    return DeviceBuffer(backend, DType::f32, count, category);
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

  // Frees now, or once `pending` completes (the memory may still be read by queued work).
  void reset(std::shared_ptr<Event> pending = nullptr) noexcept {
    if (ptr_) be_->deallocate(ptr_, bytes(), category_, std::move(pending));
    ptr_ = nullptr;
    numel_ = 0;
  }
  void* data() const { return ptr_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  std::size_t bytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
  explicit operator bool() const { return ptr_ != nullptr; }
  // The whole buffer as a 1-D view, or with `shape` (numel must not exceed the buffer's).
  TensorView view() const { return {ptr_, dtype_, {numel_}}; }
  TensorView view(Shape shape) const {
    if (shape.numel() > numel_) throw Error("DeviceBuffer::view: " + shape.str() + " exceeds the buffer");
    return {ptr_, dtype_, shape};
  }

 private:
  void swap(DeviceBuffer& o) noexcept {
    std::swap(be_, o.be_);
    std::swap(ptr_, o.ptr_);
    std::swap(dtype_, o.dtype_);
    std::swap(numel_, o.numel_);
    std::swap(category_, o.category_);
  }
  DeviceRuntime* be_ = nullptr;
  void* ptr_ = nullptr;
  DType dtype_ = DType::f32;
  int64_t numel_ = 0;
  MemCategory category_ = MemCategory::other;
};

}  // namespace fsdp
