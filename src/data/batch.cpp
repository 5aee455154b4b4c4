// Batches of shifted token windows for training and validation (see batch.hpp).
#include "fsdp/data/batch.hpp"

#include <algorithm>
#include <string>

#include "fsdp/config/config.hpp"  // below_minimum
#include "fsdp/core/error.hpp"

namespace fsdp::data {

int64_t Batch::num_targets() const {
  return static_cast<int64_t>(std::count_if(targets.begin(), targets.end(),
                                            [](int32_t t) { return t != kIgnoreIndex; }));
}

Batch Batch::rows(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || begin + count > B) {
    throw Error("Batch::rows: rows [" + std::to_string(begin) + ", " +
                std::to_string(begin + count) + ") outside a batch of " + std::to_string(B));
  }
  Batch out;
  out.B = count;
  out.L = L;
  out.target_len = target_len;
  out.inputs.assign(inputs.begin() + begin * L, inputs.begin() + (begin + count) * L);
  out.targets.assign(targets.begin() + begin * target_len,
                     targets.begin() + (begin + count) * target_len);
  if (!position_ids.empty()) {
    out.position_ids.assign(position_ids.begin() + begin * L,
                            position_ids.begin() + (begin + count) * L);
  }
  out.reset_position_ids = reset_position_ids;
  return out;
}

void set_document_positions(Batch& b, int32_t eos_id) {
  if (eos_id < 0) {
    throw Error("set_document_positions: EOS id " + std::to_string(eos_id) + " (expected >= 0)");
  }
  if (b.B < 0 || b.L < 0 || static_cast<int64_t>(b.inputs.size()) != b.B * b.L) {
    throw Error("set_document_positions: " + std::to_string(b.inputs.size()) +
                " inputs for a batch of " + std::to_string(b.B) + " x " + std::to_string(b.L));
  }
  b.position_ids.resize(b.inputs.size());
  for (int64_t r = 0; r < b.B; ++r) {
    const int32_t* in = b.inputs.data() + r * b.L;
    int32_t* pos = b.position_ids.data() + r * b.L;
    for (int64_t t = 0; t < b.L; ++t) pos[t] = (t == 0 || in[t - 1] == eos_id) ? 0 : pos[t - 1] + 1;
  }
}

Batch load_batch(const TokenSource& source, const std::vector<int64_t>& sample_indices, int64_t seq_len) {
  if (seq_len < 1) throw InputError("data.seq_len: " + std::to_string(seq_len) + " (expected >= 1)");
  Batch b;
  b.B = static_cast<int64_t>(sample_indices.size());
  b.L = seq_len;
  b.target_len = seq_len;
  b.inputs.resize(static_cast<std::size_t>(b.B * b.L));
  b.targets.resize(static_cast<std::size_t>(b.B * b.L));
  std::vector<int32_t> window(static_cast<std::size_t>(seq_len + 1));
  for (int64_t r = 0; r < b.B; ++r) {
    const int64_t i = sample_indices[static_cast<std::size_t>(r)];
    if (i < 0 || i > (source.num_tokens() - 1) / seq_len - 1) {
      throw Error("load_batch: sample " + std::to_string(i) + " of " + std::to_string(seq_len + 1) +
                  " tokens lies outside the " + std::to_string(source.num_tokens()) + "-token source");
    }
    source.read(i * seq_len, seq_len + 1, window.data());
    std::copy(window.begin(), window.end() - 1, b.inputs.begin() + r * seq_len);
    std::copy(window.begin() + 1, window.end(), b.targets.begin() + r * seq_len);
  }
  return b;
}

int64_t num_val_windows(int64_t num_tokens, int64_t seq_len, int64_t max_windows) {
  if (seq_len < 1) throw InputError("data.seq_len: " + std::to_string(seq_len) + " (expected >= 1)");
  if (max_windows < 0) {
    throw InputError("eval.max_windows: " + below_minimum(max_windows, 0));
  }
  const int64_t n = num_tokens < 1 ? 0 : (num_tokens - 1) / seq_len;
  return max_windows > 0 ? std::min(n, max_windows) : n;
}

WindowRange rank_windows(int64_t num_windows, int dp_rank, int dp_size) {
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    throw Error("rank_windows: data-parallel rank " + std::to_string(dp_rank) + " of " + std::to_string(dp_size));
  }
  return WindowRange{num_windows * dp_rank / dp_size, num_windows * (dp_rank + 1) / dp_size};
}

std::vector<int64_t> WindowRange::indices() const {
  std::vector<int64_t> idx;
  idx.reserve(static_cast<std::size_t>(std::max<int64_t>(0, size())));
  for (int64_t w = begin; w < end; ++w) idx.push_back(w);
  return idx;
}

}  // namespace fsdp::data
