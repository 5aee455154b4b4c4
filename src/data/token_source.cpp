// Synthetic random tokens (see fsdp/data/token_source.hpp): a counter-based stream.
#include "fsdp/data/token_source.hpp"

#include <string>

#include "fsdp/core/error.hpp"
#include "fsdp/core/rng.hpp"

namespace fsdp::data {

SyntheticTokens::SyntheticTokens(int64_t num_tokens, int64_t vocab_size, uint64_t seed)
    : num_tokens_(num_tokens), vocab_size_(vocab_size), seed_(seed) {
  if (vocab_size < 1 || vocab_size > (int64_t{1} << 31) - 1) {
    throw InputError("model.vocab_size: " + std::to_string(vocab_size) +
                     " is not a valid vocabulary size for synthetic data (expected 1 .. 2^31-1)");
  }
  if (num_tokens < 0) {
    throw InputError("synthetic data: negative token count " + std::to_string(num_tokens));
  }
}

void SyntheticTokens::read(int64_t offset, int64_t count, int32_t* out) const {
  if (offset < 0 || count < 0 || offset > num_tokens_ - count) {
    throw Error("synthetic data: read of [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                ") is out of range (" + std::to_string(num_tokens_) + " tokens)");
  }
  constexpr uint64_t stream = rng::key_of("data.synthetic");
  for (int64_t i = 0; i < count; ++i) {
    out[i] = static_cast<int32_t>(rng::below(static_cast<uint64_t>(vocab_size_), seed_, stream,
                                             static_cast<uint64_t>(offset + i)));
  }
}

}  // namespace fsdp::data
