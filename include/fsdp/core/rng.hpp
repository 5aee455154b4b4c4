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

// Standard normals for one stream, e.g. a parameter's initial values (element k of the
// parameter = at(k)). Box-Muller in float on a pair of 32-bit uniforms: pair i = elements
// 2i and 2i+1 = r cos(pi a), r sin(pi a) with a uniform in [-1, 1) (the low 32 bits of
// SplitMix64 output i of the stream, i.e. mix64(base + i * golden gamma)) and r =
// sqrt(-2 ln b), b uniform in (0, 1) (the top 24 bits, offset by half a step). One 64-bit mix,
// one logf and one sincosf per two normals: 8.4 ns a normal per core on the 2-core CI VM
// (x86-64-v3), against 25.4 ns for the double-precision draw it replaced, so GPT 7B's 6.7e9
// take ~3.5 s on 16 cores (docs/benchmarks.md, "Start-up"). Tails are cut at
// sqrt(-2 ln 2^-25) = 5.9 standard deviations (for an initialisation of std 0.02, at 0.12).
// Each value is a function of (seed, stream, k) alone: any split of [0, n) into ranks,
// shards or threads gives the same values.
class NormalStream {
 public:
  NormalStream(uint64_t seed, uint64_t stream) : base_(mix64(mix64(seed) ^ stream)) {}

  // Element k.
  float at(uint64_t k) const {
    float c, s;
    pair(k >> 1, c, s);
    return (k & 1) ? s : c;
  }

  // out[j] = scale * at(first + j) for j in [0, n): elements [first, first + n).
  void fill(uint64_t first, int64_t n, float scale, float* out) const {
    if (n <= 0) return;
    uint64_t k = first;
    const uint64_t end = first + static_cast<uint64_t>(n);
    if (k & 1) *out++ = scale * at(k++);  // an odd start: the second half of a pair
    for (; k + 1 < end; k += 2) {
      float c, s;
      pair(k >> 1, c, s);
      *out++ = scale * c;
      *out++ = scale * s;
    }
    if (k < end) *out = scale * at(k);  // an odd end: the first half of a pair
  }

 private:
  void pair(uint64_t i, float& c, float& s) const {
    const uint64_t z = mix64(base_ + i * 0x9E3779B97F4A7C15ull);
    const float a = static_cast<float>(static_cast<int32_t>(static_cast<uint32_t>(z))) * 0x1p-31f;
    const float b = (static_cast<float>(z >> 40) + 0.5f) * 0x1p-24f;
    const float r = std::sqrt(-2.f * std::log(b));
    ::sincosf(3.14159265358979f * a, &s, &c);
    c *= r;
    s *= r;
  }

  uint64_t base_;
};

// Uniform integer in [0, n) (n > 0), by multiply-shift on 64 random bits.
inline uint64_t below(uint64_t n, uint64_t seed, uint64_t stream, uint64_t counter) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits(seed, stream, counter)) * n) >> 64);
}

}  // namespace fsdp::rng
