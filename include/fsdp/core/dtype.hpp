// fsdp/core/dtype.hpp: element types of tensors, collectives and checkpoints, and the
// 16-bit float conversions every layer shares.
//
// bf16 is bfloat16 (8-bit exponent, 7-bit mantissa; torch.bfloat16), f16 is IEEE 754
// binary16 (torch.float16). Conversions from f32 round to nearest even, as PyTorch's
// `.to(dtype)` and CUDA's __float2bfloat16 / __float2half do; NaN stays NaN, values beyond
// the f16 range (>= 65520 in magnitude) become infinities.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fsdp/core/enum_names.hpp"

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

constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}

// The config spelling for floats (mixed_precision.*_dtype accepts fp32, bf16, fp16).
template <>
struct EnumNames<DType> {
  static constexpr EnumName<DType> table[] = {
      {DType::f32, "fp32"},   {DType::f64, "fp64"},   {DType::bf16, "bf16"}, {DType::f16, "fp16"},
      {DType::i32, "int32"}, {DType::i64, "int64"}, {DType::u8, "uint8"}};
};
// Its table's name; "unknown" for a value outside it.
constexpr std::string_view to_string(DType t) { return enum_name(t, "unknown"); }

enum class Device : int { cpu, cuda };

// ---- 16-bit floats, stored as their bit patterns ----
inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in f32
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // inf or NaN (keep a quiet NaN payload bit)
    return static_cast<uint16_t>(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u));
  }
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 -> inf
  if (a < 0x38800000u) {  // below 2^-14: f16 subnormal m * 2^-24 (m = 1024 encodes 2^-14)
    const float scaled = std::bit_cast<float>(a) * 16777216.0f;  // exact power-of-two scaling
    // Round to nearest even by hand (independent of the FP rounding mode).
    auto m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

// Rounds `f` to the nearest value representable in `t` (f32: unchanged). For tests and
// for the CPU backend's "store in t, compute in f32" rule.
inline float round_to(DType t, float f) {
  if (t == DType::bf16) return bf16_to_f32(f32_to_bf16(f));
  if (t == DType::f16) return f16_to_f32(f32_to_f16(f));
  return f;
}

}  // namespace fsdp
