// fsdp/core/dtype.hpp: element types moved by collectives and stored in checkpoints.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fsdp {

enum class DType : int { f32, f64, bf16, f16, i32, i64, u8 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

enum class Device : int { cpu, cuda };

}  // namespace fsdp
