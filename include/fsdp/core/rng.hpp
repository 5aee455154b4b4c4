// fsdp/core/rng.hpp: counter-based random numbers.
//
// Every random number in fsdp_train is a pure function of (seed, stream key, counter), in
// the spirit of Philox/Threefry (Salmon et al., SC'11) but built from the SplitMix64 finaliser
// (Steele et al. 2014), which passes BigCrush as a counter-mode generator. Because nothing
// depends on call order, rank r can initialise only its own shard of a parameter (counter =
// element index), data order does not depend on the world size, and a resumed run draws the
// same numbers as an uninterrupted one.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace fsdp::rng {

// SplitMix64 finaliser: a bijective 64-bit mix.
constexpr uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Stable 64-bit key of a name (FNV-1a), e.g. a parameter name "h.3.mlp.c_fc.weight".
constexpr uint64_t key_of(std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001B3ull;
  }
  return h;
}

// 64 random bits for (seed, stream, counter).
constexpr uint64_t bits(uint64_t seed, uint64_t stream, uint64_t counter) {
  return mix64(mix64(mix64(seed) ^ stream) ^ counter);
}

// Uniform in [0, 1) from the top 53 random bits.
inline double uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
  return static_cast<double>(bits(seed, stream, counter) >> 11) * 0x1.0p-53;
}

// Standard normal for (seed, stream, counter) by Box-Muller on two derived uniforms.
inline double normal(uint64_t seed, uint64_t stream, uint64_t counter) {
  const uint64_t c = counter * 2;
  const double u1 = 1.0 - uniform(seed, stream, c);  // (0, 1]
  const double u2 = uniform(seed, stream, c + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Uniform integer in [0, n) (n > 0), by multiply-shift on 64 random bits.
inline uint64_t below(uint64_t n, uint64_t seed, uint64_t stream, uint64_t counter) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits(seed, stream, counter)) * n) >> 64);
}

}  // namespace fsdp::rng
