// fsdp/data/token_source.hpp: where training tokens come from.
//
// A TokenSource is a flat, read-only stream of integer tokens in [0, vocab_size). Samples
// and validation windows are windows of that stream (see sampler.hpp, batch.hpp). Two
// implementations: TokenDataset (an HDF5 split, token_dataset.hpp) and SyntheticTokens
// (counter-based random tokens, so benchmarks need no file).
#pragma once

#include <cstdint>

namespace fsdp::data {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Tokens in the stream (>= 0).
  virtual int64_t num_tokens() const = 0;
  // Exclusive upper bound of the token ids: every token t satisfies 0 <= t < vocab_size().
  virtual int64_t vocab_size() const = 0;
  // Copies tokens [offset, offset + count) into out[0 .. count) as int32.
  // Throws fsdp::Error if the range is outside [0, num_tokens()).
  virtual void read(int64_t offset, int64_t count, int32_t* out) const = 0;
};

// Random tokens for benchmarks: token at position p is
//   rng::below(vocab_size, seed, rng::key_of("data.synthetic"), p),
// a pure function of (seed, p), so any window reads the same tokens on every rank and for
// any world size. Uniform random tokens carry no signal: the loss stays near ln(vocab_size).
class SyntheticTokens final : public TokenSource {
 public:
  // Throws fsdp::InputError if vocab_size < 1 or num_tokens < 0.
  SyntheticTokens(int64_t num_tokens, int64_t vocab_size, uint64_t seed);
  int64_t num_tokens() const override { return num_tokens_; }
  int64_t vocab_size() const override { return vocab_size_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override;

 private:
  int64_t num_tokens_;
  int64_t vocab_size_;
  uint64_t seed_;
};

}  // namespace fsdp::data
