// TEMPORARY (replaced by the data branch): causal_lm samples only.
#include <memory>

#include "fsdp/core/error.hpp"
#include "fsdp/data/samples.hpp"
#include "fsdp/data/sampler.hpp"
#include "fsdp/data/token_dataset.hpp"

namespace fsdp::data {
namespace {
class CausalSamples final : public SampleSource {
 public:
  CausalSamples(std::unique_ptr<TokenSource> src, int64_t L, int64_t n) : src_(std::move(src)), L_(L), n_(n) {}
  int64_t num_samples() const override { return n_; }
  int64_t num_tokens() const override { return src_->num_tokens(); }
  BatchShape shape() const override { return {L_, L_}; }
  Batch load(const std::vector<int64_t>& idx) const override { return load_batch(*src_, idx, L_); }
 private:
  std::unique_ptr<TokenSource> src_;
  int64_t L_, n_;
};
}  // namespace

BatchShape batch_shape(const Config& c) { return {c.data.seq_len, c.data.seq_len}; }

std::unique_ptr<SampleSource> open_samples(const Config& cfg, const std::string& split, int64_t V) {
  const int64_t L = cfg.data.seq_len;
  std::unique_ptr<TokenSource> src;
  if (cfg.data.source == "synthetic") {
    const int64_t n = split == "train" ? 1024 * cfg.train.global_batch_size * L + 1 : 64 * L + 1;
    src = std::make_unique<SyntheticTokens>(n, V, cfg.train.seed + (split == "train" ? 0 : 1));
  } else {
    src = std::make_unique<TokenDataset>(cfg.data.path, split, V, L);
  }
  const int64_t n = split == "train" ? num_samples_of(src->num_tokens(), L)
                                     : num_val_windows(src->num_tokens(), L, cfg.eval.max_windows);
  return std::make_unique<CausalSamples>(std::move(src), L, n);
}
}  // namespace fsdp::data
