// fsdp/core/tensor.hpp: a non-owning typed view of backend memory (pointer, dtype, shape),
// the argument type of every Backend kernel and of ModuleHooks::param/grad.
//
// Views are row-major and contiguous. They carry no device: a view's pointer belongs to the
// backend that produced it (host memory for the CPU backend, device memory for CUDA).
// Owning storage is DeviceBuffer (fsdp/backend/buffer.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {

// Up to 4 dimensions, stored inline.
class Shape {
 public:
  static constexpr int kMaxDims = 4;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    if (dims.size() > kMaxDims) throw Error("Shape: more than 4 dimensions");
    for (int64_t d : dims) d_[nd_++] = d;
  }
  int ndim() const { return nd_; }
  int64_t operator[](int i) const { return d_[static_cast<std::size_t>(i)]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < nd_; ++i) n *= d_[static_cast<std::size_t>(i)];
    return n;
  }
  std::string str() const;  // "[2, 3]"
  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.nd_ != b.nd_) return false;
    for (int i = 0; i < a.nd_; ++i)
      if (a.d_[static_cast<std::size_t>(i)] != b.d_[static_cast<std::size_t>(i)]) return false;
    return true;
  }

 private:
  std::array<int64_t, kMaxDims> d_{};
  int nd_ = 0;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;

  TensorView() = default;
  TensorView(void* p, DType t, Shape s) : data(p), dtype(t), shape(s) {}
  TensorView(const void* p, DType t, Shape s) : data(const_cast<void*>(p)), dtype(t), shape(s) {}

  int64_t numel() const { return shape.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  explicit operator bool() const { return data != nullptr; }

  // Elements [offset, offset + n) as a 1-D view.
  TensorView slice(int64_t offset, int64_t n) const {
    return {static_cast<char*>(data) + offset * static_cast<int64_t>(dtype_size(dtype)), dtype, {n}};
  }
  // The same memory with another shape of equal numel.
  TensorView reshape(Shape s) const {
    if (s.numel() != numel()) throw Error("TensorView::reshape: " + shape.str() + " -> " + s.str());
    return {data, dtype, s};
  }
  // Typed pointer; throws fsdp::Error if the dtype is not `want`.
  template <class T>
  T* as(DType want) const {
    if (dtype != want) {
      throw Error(std::string("TensorView: expected ") + std::string(to_string(want)) + ", got " +
                  std::string(to_string(dtype)));
    }
    return static_cast<T*>(data);
  }
  float* f32() const { return as<float>(DType::f32); }
  double* f64() const { return as<double>(DType::f64); }
  int32_t* i32() const { return as<int32_t>(DType::i32); }
};

}  // namespace fsdp
