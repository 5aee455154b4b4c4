// open_samples / batch_shape: every data.objective behind data::SampleSource
// (see fsdp/data/samples.hpp and docs/data.md).
#include "fsdp/data/samples.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "fsdp/core/error.hpp"
#include "fsdp/core/rng.hpp"
#include "fsdp/data/batch.hpp"
#include "fsdp/data/sampler.hpp"
#include "fsdp/data/span_corruption.hpp"
#include "fsdp/data/token_dataset.hpp"
#include "fsdp/data/token_source.hpp"
#include "fsdp/h5/hdf5.hpp"

namespace fsdp::data {

namespace {

void check_index(const char* what, int64_t i, int64_t n) {
  if (i < 0 || i >= n) {
    throw Error(std::string(what) + ": sample " + std::to_string(i) + " is outside [0, " + std::to_string(n) + ")");
  }
}

// At most max_windows of n samples (0 = all; config validation keeps it >= 0).
int64_t cap(int64_t n, int64_t max_windows) {
  return max_windows > 0 ? std::min(n, max_windows) : n;
}

// The stream sources of causal_lm and span_corruption, as the trainer builds them: a
// synthetic train stream of 1024 global batches (independent of train.max_steps, so
// --resume sees the same batches), a 64-sample val stream seeded train.seed + 1.
int64_t synthetic_tokens(const Config& c, Split split, int64_t per_sample, int64_t extra) {
  const int64_t samples = split == Split::train ? 1024 * c.train.global_batch_size : 64;
  return samples * per_sample + extra;
}
uint64_t synthetic_seed(const Config& c, Split split) {
  return split == Split::train ? c.train.seed : c.train.seed + 1;
}

// ---------------------------------------------------------------- causal_lm

// eos_id >= 0: data.attn_mask_type = "block_causal", each batch gets the position_ids of
// its documents (set_document_positions) and reset_position_ids (data.reset_position_ids),
// and with eod_mask_loss (data.eod_mask_loss) the target after each EOS input is ignored (the
// number of targets then varies); -1: causal, none.
class CausalLmSamples final : public SampleSource {
 public:
  CausalLmSamples(std::unique_ptr<TokenSource> src, int64_t L, int64_t num_samples, int32_t eos_id,
                  bool reset_position_ids, bool eod_mask_loss)
      : src_(std::move(src)),
        L_(L),
        n_(num_samples),
        eos_(eos_id),
        reset_(eos_id >= 0 && reset_position_ids),
        mask_eod_(eos_id >= 0 && eod_mask_loss) {}
  int64_t num_samples() const override { return n_; }
  int64_t num_tokens() const override { return src_->num_tokens(); }
  BatchShape shape() const override { return {L_, L_, eos_ >= 0, reset_}; }
  int64_t fixed_targets_per_sample() const override { return mask_eod_ ? 0 : L_; }
  Batch load(const std::vector<int64_t>& indices) const override {
    for (int64_t i : indices) check_index("causal_lm", i, n_);
    Batch b = load_batch(*src_, indices, L_);
    if (eos_ >= 0) {
      set_document_positions(b, eos_);
      b.reset_position_ids = reset_;
    }
    if (mask_eod_) {
      for (std::size_t i = 0; i < b.inputs.size(); ++i) {
        if (b.inputs[i] == eos_) b.targets[i] = kIgnoreIndex;
      }
    }
    return b;
  }

 private:
  std::unique_ptr<TokenSource> src_;
  int64_t L_, n_;
  int32_t eos_;
  bool reset_, mask_eod_;
};

const std::string kBlockCausal = "data.attn_mask_type = \"block_causal\": ";

// An EOS id read from `path` (data.eos_token_id = -1) checked against the model's vocabulary.
int32_t file_eos_below(const std::string& path, int64_t V) {
  const int32_t eos = document_eos_id(path);
  if (eos >= V) {
    throw InputError(kBlockCausal + path + " has eos_id " + std::to_string(eos) +
                     ", outside model.vocab_size = " + std::to_string(V) +
                     " (expected eos_id < model.vocab_size)");
  }
  return eos;
}

// The token that ends a document for block_causal (docs/data.md "Document masking"):
// data.eos_token_id when set, else the data file's eos_id; -1 for causal (no file read).
int32_t block_causal_eos(const Config& c, int64_t V) {
  if (c.data.attn_mask_type != AttnMaskType::block_causal) return -1;
  const int64_t eos = c.data.eos_token_id;
  if (eos >= 0) {
    if (eos >= V) {
      throw InputError(
          "data.eos_token_id: " + std::to_string(eos) +
          " is out of range (expected -1 <= x < model.vocab_size = " + std::to_string(V) + ")");
    }
    return static_cast<int32_t>(eos);
  }
  if (c.data.source == DataSource::synthetic) {
    throw InputError(kBlockCausal + "synthetic data has no EOS; set data.eos_token_id");
  }
  return file_eos_below(c.data.path, V);
}

std::unique_ptr<SampleSource> open_causal_lm(const Config& c, Split split, int64_t V) {
  const int64_t L = c.data.seq_len;
  if (L < 1) throw InputError("data.seq_len: " + std::to_string(L) + " (expected >= 1)");
  std::unique_ptr<TokenSource> src;
  if (c.data.source == DataSource::synthetic) {
    src = std::make_unique<SyntheticTokens>(synthetic_tokens(c, split, L, 1), V, synthetic_seed(c, split));
  } else {
    src = std::make_unique<TokenDataset>(c.data.path, split, V, L);
  }
  const int32_t eos = block_causal_eos(c, V);
  const int64_t n = split == Split::train ? num_samples_of(src->num_tokens(), L)
                                     : num_val_windows(src->num_tokens(), L, c.eval.max_windows);
  return std::make_unique<CausalLmSamples>(std::move(src), L, n, eos, c.data.reset_position_ids,
                                           c.data.eod_mask_loss);
}

// ---------------------------------------------------------------- span_corruption

class SpanCorruptionSamples final : public SampleSource {
 public:
  // Token t of the source is used as t + id_offset (3 for byte files: ByT5 ids).
  SpanCorruptionSamples(std::unique_ptr<TokenSource> src, int32_t id_offset, SpanCounts counts,
                        int64_t num_samples, int64_t vocab_size, uint64_t seed, Split split)
      : src_(std::move(src)), offset_(id_offset), counts_(counts), n_(num_samples), vocab_(vocab_size),
        seed_(seed), split_key_(rng::key_of(split == Split::train ? "data.span_corruption.train"
                                                             : "data.span_corruption.val")) {}
  int64_t num_samples() const override { return n_; }
  int64_t num_tokens() const override { return src_->num_tokens(); }
  BatchShape shape() const override { return {counts_.input_len(), counts_.target_len()}; }
  int64_t fixed_targets_per_sample() const override { return counts_.target_len(); }
  Batch load(const std::vector<int64_t>& indices) const override {
    for (int64_t i : indices) check_index("span_corruption", i, n_);
    Batch b;
    b.B = static_cast<int64_t>(indices.size());
    b.L = counts_.input_len();
    b.target_len = counts_.target_len();
    b.inputs.resize(static_cast<std::size_t>(b.B * b.L));
    b.targets.resize(static_cast<std::size_t>(b.B * b.target_len));
    const int64_t L = counts_.L;
    std::vector<int32_t> window(static_cast<std::size_t>(L));
    for (int64_t r = 0; r < b.B; ++r) {
      const int64_t i = indices[static_cast<std::size_t>(r)];
      src_->read(i * L, L, window.data());
      if (offset_ != 0) {
        for (auto& t : window) t += offset_;
      }
      const uint64_t stream = rng::mix64(split_key_ ^ static_cast<uint64_t>(i));
      const SpanLayout layout = random_span_layout(counts_, seed_, stream);
      corrupt_spans(window.data(), counts_, layout, vocab_, b.inputs.data() + r * b.L,
                    b.targets.data() + r * b.target_len);
    }
    return b;
  }

 private:
  std::unique_ptr<TokenSource> src_;
  int32_t offset_;
  SpanCounts counts_;
  int64_t n_, vocab_;
  uint64_t seed_, split_key_;
};

// Synthetic span-corruption tokens: ids in [3, vocab_size - 125) (ByT5's byte-id range for
// vocab 384), i.e. SyntheticTokens over vocab_size - 128 ids shifted by 3.
constexpr int64_t kSyntheticReserved = 128;  // 3 special ids below, 125 sentinel ids above

std::unique_ptr<SampleSource> open_span_corruption(const Config& c, Split split, int64_t V) {
  const SpanCounts counts = span_counts(c.data.seq_len, c.data.noise_density, c.data.mean_noise_span_length);
  const int64_t L = counts.L;
  std::unique_ptr<TokenSource> src;
  int32_t id_offset = 0;
  int64_t id_bound = 0;  // every (mapped) token id is < id_bound
  std::string what;      // for the error message
  if (c.data.source == DataSource::synthetic) {
    if (V <= kSyntheticReserved) {
      throw InputError("model.vocab_size: " + std::to_string(V) +
                       " is too small for synthetic span_corruption data (expected > 128: ids 3 .. vocab_size-126 "
                       "plus 125 sentinel ids)");
    }
    src = std::make_unique<SyntheticTokens>(synthetic_tokens(c, split, L, 0), V - kSyntheticReserved,
                                            synthetic_seed(c, split));
    id_offset = kByteOffset;
    id_bound = V - 125;
    what = "synthetic data (ids below " + std::to_string(id_bound) + ")";
  } else {
    auto ds = std::make_unique<TokenDataset>(c.data.path, split, 0, 0);
    if (ds->tokenizer() == "bytes") {
      id_offset = kByteOffset;  // byte b -> ByT5 id b + 3
      id_bound = ds->vocab_size() + kByteOffset;
      what = c.data.path + " (bytes, read as ByT5 ids b + 3 < " + std::to_string(id_bound) + ")";
    } else {
      id_bound = ds->vocab_size();
      what = c.data.path + " (vocab_size " + std::to_string(id_bound) + ")";
    }
    if (id_bound > V) {
      throw InputError("data.path: " + what + " has token ids up to " + std::to_string(id_bound - 1) +
                       " but model.vocab_size is " + std::to_string(V) + " (expected model.vocab_size >= " +
                       std::to_string(id_bound) + ")");
    }
    src = std::move(ds);
  }
  int64_t n = src->num_tokens() / L;
  if (n < 1) {
    throw InputError("data.seq_len: " + std::to_string(L) + " needs at least " + std::to_string(L) +
                     " tokens per sample but " + what + " /" + to_string(split) + "/tokens has " +
                     std::to_string(src->num_tokens()));
  }
  // Sentinels are V - 1 .. V - num_spans; they must lie above every token id.
  if (V - counts.num_spans < id_bound) {
    throw InputError("data.seq_len: " + std::to_string(L) + " with data.noise_density " +
                     format_number(c.data.noise_density) + " and data.mean_noise_span_length " +
                     format_number(c.data.mean_noise_span_length) + " needs " + std::to_string(counts.num_spans) +
                     " sentinel ids (model.vocab_size - 1 downwards) but model.vocab_size " + std::to_string(V) +
                     " leaves only " + std::to_string(std::max<int64_t>(0, V - id_bound)) + " above the ids of " +
                     what + " (expected fewer spans or a larger vocabulary)");
  }
  if (split == Split::val) n = cap(n, c.eval.max_windows);
  return std::make_unique<SpanCorruptionSamples>(std::move(src), id_offset, counts, n, V, c.train.seed, split);
}

// ---------------------------------------------------------------- seq2seq

// One side (inputs or targets) of a split of a pairs file, read whole and validated.
struct Side {
  std::vector<int32_t> tokens;
  std::vector<int64_t> offsets;  // n + 1
  int64_t len(int64_t i) const {
    return offsets[static_cast<std::size_t>(i) + 1] - offsets[static_cast<std::size_t>(i)];
  }
};

Side read_side(const h5::File& f, const std::string& group, const std::string& name, int64_t V) {
  const std::string tok = group + "/" + name, off = group + "/" + name.substr(0, name.size() - 1) + "_offsets";
  const std::string& path = f.path();
  for (const std::string* d : {&tok, &off}) {
    if (!f.exists(*d)) {
      throw InputError(path + ": " + *d + ": dataset not found (expected the seq2seq schema of docs/data.md; "
                       "make one with fsdp_prepare --pairs)");
    }
    const auto dims = f.dims(*d);
    if (dims.size() != 1) {
      throw InputError(path + ": " + *d + ": dataset has " + std::to_string(dims.size()) + " dimensions (expected 1)");
    }
  }
  check_token_type(f, tok);
  if (f.type_class(off) != H5T_INTEGER || f.type_size(off) != 8) {
    throw InputError(path + ": " + off + ": offsets are not 64-bit integers (expected int64)");
  }
  Side s;
  const auto nt = static_cast<int64_t>(f.dims(tok)[0]);
  const auto no = static_cast<int64_t>(f.dims(off)[0]);
  s.tokens.resize(static_cast<std::size_t>(nt));
  if (nt > 0) f.read_i32(tok, s.tokens.data(), 0, static_cast<hsize_t>(nt));
  s.offsets = f.read_all_i64(off);
  if (no < 2) {
    throw InputError(path + ": " + off + ": " + std::to_string(no) +
                     " offsets (expected n + 1 >= 2 for n >= 1 examples)");
  }
  if (s.offsets.front() != 0) {
    throw InputError(path + ": " + off + ": first offset is " + std::to_string(s.offsets.front()) + " (expected 0)");
  }
  for (int64_t i = 0; i + 1 < no; ++i) {
    if (s.offsets[static_cast<std::size_t>(i) + 1] < s.offsets[static_cast<std::size_t>(i)]) {
      throw InputError(path + ": " + off + ": offsets[" + std::to_string(i + 1) + "] = " +
                       std::to_string(s.offsets[static_cast<std::size_t>(i) + 1]) + " < offsets[" +
                       std::to_string(i) + "] = " + std::to_string(s.offsets[static_cast<std::size_t>(i)]) +
                       " (expected non-decreasing offsets)");
    }
  }
  if (s.offsets.back() != nt) {
    throw InputError(path + ": " + off + ": last offset is " + std::to_string(s.offsets.back()) + " but " + tok +
                     " has " + std::to_string(nt) + " tokens (expected equal)");
  }
  for (int64_t p = 0; p < nt; ++p) {
    const int32_t t = s.tokens[static_cast<std::size_t>(p)];
    if (t < 0 || t >= V) token_range_error(path, tok, t, p, V, "model.vocab_size");
  }
  return s;
}

class Seq2SeqSamples final : public SampleSource {
 public:
  Seq2SeqSamples(Side in, Side tgt, int64_t num_samples, int64_t max_in, int64_t max_tgt)
      : in_(std::move(in)), tgt_(std::move(tgt)), n_(num_samples), max_in_(max_in), max_tgt_(max_tgt) {
    for (int64_t i = 0; i < n_; ++i) {
      if (in_.len(i) > max_in_ || tgt_.len(i) > max_tgt_) ++truncated_;
    }
  }
  int64_t num_samples() const override { return n_; }
  int64_t num_tokens() const override {
    return static_cast<int64_t>(in_.tokens.size() + tgt_.tokens.size());
  }
  BatchShape shape() const override { return {max_in_, max_tgt_}; }
  int64_t num_truncated() const override { return truncated_; }
  Batch load(const std::vector<int64_t>& indices) const override {
    for (int64_t i : indices) check_index("seq2seq", i, n_);
    Batch b;
    b.B = static_cast<int64_t>(indices.size());
    b.L = max_in_;
    b.target_len = max_tgt_;
    b.inputs.assign(static_cast<std::size_t>(b.B * b.L), kPadId);
    b.targets.assign(static_cast<std::size_t>(b.B * b.target_len), kIgnoreIndex);
    for (int64_t r = 0; r < b.B; ++r) {
      const int64_t i = indices[static_cast<std::size_t>(r)];
      copy_row(in_, i, max_in_, b.inputs.data() + r * b.L);
      copy_row(tgt_, i, max_tgt_, b.targets.data() + r * b.target_len);
    }
    return b;
  }

 private:
  // Example i into out[0 .. max): whole if it fits, else its first max - 1 tokens and eos.
  static void copy_row(const Side& s, int64_t i, int64_t max, int32_t* out) {
    const int64_t n = s.len(i);
    const int32_t* src = s.tokens.data() + s.offsets[static_cast<std::size_t>(i)];
    if (n <= max) {
      std::copy(src, src + n, out);
    } else {
      std::copy(src, src + (max - 1), out);
      out[max - 1] = kEosId;
    }
  }

  Side in_, tgt_;
  int64_t n_, max_in_, max_tgt_;
  int64_t truncated_ = 0;
};

// Decoder SFT on prompt-completion pairs (TRL's SFTTrainer with completion_only_loss; the
// pairs file's inputs are the prompts, its targets the completions): a row is the example's
// prompt ++ completion, cut to its first L + 1 tokens (TRL's truncation keeps the start);
// inputs are its first L tokens (padded with 0), targets[t] its token t + 1 where that token
// is a completion token, kIgnoreIndex on the prompt and the padding. An example cut short is
// counted in num_truncated().
// Packing (data.packing; TRL's SFTConfig packing="bfd" with padding_free): example i fills m_i
// = min(len_i, L + 1) - 1 positions (its inputs; its last token is only a target), and a row
// holds several, placed by best-fit decreasing over the split at open (examples by m_i
// descending, index ascending among equals, each into the open row with the least room that
// fits it, else a new row; an example of one token fills nothing and is left out). A sample is
// a row: its examples one after the other in the order they were placed, then padding, with
// position_ids restarting at 0 at each example (and at the padding), so under block_causal
// each attends only to itself; reset_position_ids is data.reset_position_ids.
class SftSamples final : public SampleSource {
 public:
  SftSamples(Side prompt, Side completion, int64_t num_examples, int64_t L, bool packing,
             bool reset_position_ids)
      : prompt_(std::move(prompt)), completion_(std::move(completion)), L_(L),
        packing_(packing), reset_(packing && reset_position_ids) {
    for (int64_t i = 0; i < num_examples; ++i) {
      if (prompt_.len(i) + completion_.len(i) > L_ + 1) ++truncated_;
    }
    if (!packing_) {
      for (int64_t i = 0; i < num_examples; ++i) rows_.push_back({i});
      return;
    }
    std::vector<int64_t> order;
    for (int64_t i = 0; i < num_examples; ++i) {
      if (positions(i) > 0) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return positions(a) > positions(b); });
    std::multimap<int64_t, std::size_t> room;  // free positions -> row (best fit: the least)
    for (int64_t i : order) {
      const auto it = room.lower_bound(positions(i));
      std::size_t row = rows_.size();
      int64_t left = L_;
      if (it != room.end()) {
        row = it->second;
        left = it->first;
        room.erase(it);
      } else {
        rows_.emplace_back();
      }
      rows_[row].push_back(i);
      if (left - positions(i) > 0) room.emplace(left - positions(i), row);
    }
  }
  int64_t num_samples() const override { return static_cast<int64_t>(rows_.size()); }
  int64_t num_tokens() const override {
    return static_cast<int64_t>(prompt_.tokens.size() + completion_.tokens.size());
  }
  BatchShape shape() const override { return {L_, L_, packing_, reset_}; }
  int64_t num_truncated() const override { return truncated_; }
  Batch load(const std::vector<int64_t>& indices) const override {
    for (int64_t i : indices) check_index("sft", i, num_samples());
    Batch b;
    b.B = static_cast<int64_t>(indices.size());
    b.L = b.target_len = L_;
    b.inputs.assign(static_cast<std::size_t>(b.B * L_), kPadId);
    b.targets.assign(static_cast<std::size_t>(b.B * L_), kIgnoreIndex);
    if (packing_) {
      b.position_ids.assign(static_cast<std::size_t>(b.B * L_), 0);
      b.reset_position_ids = reset_;
    }
    for (int64_t r = 0; r < b.B; ++r) {
      int64_t t0 = 0;  // the row's next position
      for (int64_t i : rows_[static_cast<std::size_t>(indices[static_cast<std::size_t>(r)])]) {
        const int64_t np = prompt_.len(i), m = positions(i);
        const int32_t* p = prompt_.tokens.data() + prompt_.offsets[static_cast<std::size_t>(i)];
        const int32_t* c =
            completion_.tokens.data() + completion_.offsets[static_cast<std::size_t>(i)];
        auto token = [&](int64_t k) { return k < np ? p[k] : c[k - np]; };
        int32_t* in = b.inputs.data() + r * L_ + t0;
        int32_t* tgt = b.targets.data() + r * L_ + t0;
        for (int64_t t = 0; t < m; ++t) {
          in[t] = token(t);
          if (t + 1 >= np) tgt[t] = token(t + 1);  // a completion token: its loss counts
          if (packing_) b.position_ids[static_cast<std::size_t>(r * L_ + t0 + t)] =
              static_cast<int32_t>(t);
        }
        t0 += m;
      }
      for (int64_t t = t0; packing_ && t < L_; ++t) {  // the padding: a document of its own
        b.position_ids[static_cast<std::size_t>(r * L_ + t)] = static_cast<int32_t>(t - t0);
      }
    }
    return b;
  }

 private:
  // The positions example i fills: its first min(len, L + 1) tokens less the last.
  int64_t positions(int64_t i) const {
    return std::min(prompt_.len(i) + completion_.len(i), L_ + 1) - 1;
  }
  Side prompt_, completion_;
  int64_t L_;
  bool packing_, reset_;
  std::vector<std::vector<int64_t>> rows_;  // each sample's examples
  int64_t truncated_ = 0;
};

// A split of a pairs file (seq2seq, sft), read whole and checked: its inputs and targets and
// the number of examples (val capped at eval.max_windows). `objective` names the key's value
// in the messages.
struct PairSides {
  Side in, tgt;
  int64_t n = 0;
};
PairSides read_pair_split(const Config& c, Split split, int64_t V, const char* objective) {
  if (c.data.source != DataSource::hdf5) {
    throw InputError(std::string("data.source: \"") + to_string(c.data.source) +
                     "\" is not supported with data.objective = \"" + objective +
                     "\" (expected \"hdf5\": a pairs file made by fsdp_prepare --pairs)");
  }
  const h5::File f = h5::File::open_read(c.data.path);
  const std::string group = std::string("/") + to_string(split);
  if (!f.exists(group)) {
    throw InputError(c.data.path + ": " + group + ": group not found (expected " + group + "/inputs, " + group +
                     "/input_offsets, " + group + "/targets, " + group +
                     "/target_offsets; make one with fsdp_prepare --pairs)");
  }
  if (f.has_attr("/", "vocab_size")) {
    const int64_t fv = f.attr_i64("/", "vocab_size");
    if (fv > V) {
      throw InputError("data.path: " + c.data.path + " has vocab_size " + std::to_string(fv) +
                       " but model.vocab_size is " + std::to_string(V) +
                       " (expected model.vocab_size >= the file's vocab_size)");
    }
  }
  Side in = read_side(f, group, "inputs", V);
  Side tgt = read_side(f, group, "targets", V);
  if (in.offsets.size() != tgt.offsets.size()) {
    throw InputError(c.data.path + ": " + group + "/input_offsets has " + std::to_string(in.offsets.size()) +
                     " entries but " + group + "/target_offsets has " + std::to_string(tgt.offsets.size()) +
                     " (expected one input and one target per example)");
  }
  int64_t n = static_cast<int64_t>(in.offsets.size()) - 1;
  if (split == Split::val) n = cap(n, c.eval.max_windows);
  return {std::move(in), std::move(tgt), n};
}

std::unique_ptr<SampleSource> open_seq2seq(const Config& c, Split split, int64_t V) {
  PairSides s = read_pair_split(c, split, V, "seq2seq");
  return std::make_unique<Seq2SeqSamples>(std::move(s.in), std::move(s.tgt), s.n,
                                          c.data.max_input_len, c.data.max_target_len);
}

std::unique_ptr<SampleSource> open_sft(const Config& c, Split split, int64_t V) {
  PairSides s = read_pair_split(c, split, V, "sft");
  return std::make_unique<SftSamples>(std::move(s.in), std::move(s.tgt), s.n, c.data.seq_len,
                                      c.data.packing, c.data.reset_position_ids);
}

// ---------------------------------------------------------------- data mixtures

// The samples of several files one after the other: part d owns indices offset_d + [0, n_d)
// (the order DistributedSampler's mixture mode indexes). A load reads each part's rows in
// one call and puts them back in the order asked.
class ConcatSamples final : public SampleSource {
 public:
  explicit ConcatSamples(std::vector<std::unique_ptr<SampleSource>> parts)
      : parts_(std::move(parts)) {
    for (const auto& p : parts_) {
      offsets_.push_back(n_);
      n_ += p->num_samples();
    }
  }
  int64_t num_samples() const override { return n_; }
  int64_t num_tokens() const override {
    int64_t t = 0;
    for (const auto& p : parts_) t += p->num_tokens();
    return t;
  }
  BatchShape shape() const override { return parts_.front()->shape(); }
  int64_t fixed_targets_per_sample() const override {
    return parts_.front()->fixed_targets_per_sample();
  }
  int64_t num_truncated() const override {
    int64_t t = 0;
    for (const auto& p : parts_) t += p->num_truncated();
    return t;
  }
  std::vector<int64_t> part_samples() const override {
    std::vector<int64_t> n;
    for (const auto& p : parts_) n.push_back(p->num_samples());
    return n;
  }
  Batch load(const std::vector<int64_t>& indices) const override {
    const BatchShape sh = shape();
    Batch b;
    b.B = static_cast<int64_t>(indices.size());
    b.L = sh.L;
    b.target_len = sh.target_len;
    b.inputs.resize(static_cast<std::size_t>(b.B * b.L));
    b.targets.resize(static_cast<std::size_t>(b.B * b.target_len));
    bool positions = false;  // the parts' batches carry position_ids (block_causal): all or none
    for (std::size_t d = 0; d < parts_.size(); ++d) {
      std::vector<int64_t> local, rows;  // part d's sample indices and their rows in b
      for (std::size_t r = 0; r < indices.size(); ++r) {
        const int64_t i = indices[r];
        check_index("data.paths", i, n_);
        if (i >= offsets_[d] && i - offsets_[d] < parts_[d]->num_samples()) {
          local.push_back(i - offsets_[d]);
          rows.push_back(static_cast<int64_t>(r));
        }
      }
      if (local.empty()) continue;
      const Batch part = parts_[d]->load(local);
      for (std::size_t k = 0; k < rows.size(); ++k) {
        std::copy_n(part.inputs.begin() + static_cast<std::ptrdiff_t>(k) * b.L, b.L,
                    b.inputs.begin() + rows[k] * b.L);
        std::copy_n(part.targets.begin() + static_cast<std::ptrdiff_t>(k) * b.target_len,
                    b.target_len, b.targets.begin() + rows[k] * b.target_len);
      }
      if (!part.position_ids.empty()) {
        if (!positions) b.position_ids.resize(b.inputs.size());
        positions = true;
        b.reset_position_ids = part.reset_position_ids;
        for (std::size_t k = 0; k < rows.size(); ++k) {
          std::copy_n(part.position_ids.begin() + static_cast<std::ptrdiff_t>(k) * b.L, b.L,
                      b.position_ids.begin() + rows[k] * b.L);
        }
      }
    }
    return b;
  }

 private:
  std::vector<std::unique_ptr<SampleSource>> parts_;
  std::vector<int64_t> offsets_;
  int64_t n_ = 0;
};

std::unique_ptr<SampleSource> open_one(const Config& config, Split split, int64_t vocab_size) {
  switch (config.data.objective) {
    case Objective::causal_lm: return open_causal_lm(config, split, vocab_size);
    case Objective::seq2seq: return open_seq2seq(config, split, vocab_size);
    case Objective::span_corruption: return open_span_corruption(config, split, vocab_size);
    case Objective::sft: return open_sft(config, split, vocab_size);
  }
  throw Error("open_samples: unknown data.objective");
}

}  // namespace

BatchShape batch_shape(const Config& config) {
  const DataConfig& d = config.data;
  switch (d.objective) {
    case Objective::causal_lm:
      return {d.seq_len, d.seq_len, d.attn_mask_type == AttnMaskType::block_causal,
              d.attn_mask_type == AttnMaskType::block_causal && d.reset_position_ids};
    case Objective::sft:
      return {d.seq_len, d.seq_len, d.packing, d.packing && d.reset_position_ids};
    case Objective::seq2seq:
      return {d.max_input_len, d.max_target_len};
    case Objective::span_corruption: {
      const SpanCounts c = span_counts(d.seq_len, d.noise_density, d.mean_noise_span_length);
      return {c.input_len(), c.target_len()};
    }
  }
  throw Error("batch_shape: unknown data.objective");
}

std::unique_ptr<SampleSource> open_samples(const Config& config, Split split, int64_t vocab_size) {
  if (config.data.paths.empty()) return open_one(config, split, vocab_size);
  std::vector<std::unique_ptr<SampleSource>> parts;
  // block_causal without data.eos_token_id: every file's eos_id, one for all.
  const bool file_eos = config.data.objective == Objective::causal_lm &&
                        config.data.attn_mask_type == AttnMaskType::block_causal &&
                        config.data.eos_token_id < 0;
  int32_t first_eos = -1;
  for (std::size_t d = 0; d < config.data.paths.size(); ++d) {
    // Each file opened as data.path would be; its errors name it as data.paths[d].
    const std::string key = "data.paths[" + std::to_string(d) + "]";
    Config one = config;
    one.data.path = config.data.paths[d];
    one.data.paths.clear();
    one.data.weights.clear();
    int32_t eos = -1;
    try {
      if (file_eos) {
        eos = file_eos_below(one.data.path, vocab_size);
        one.data.eos_token_id = eos;  // read once
      }
      parts.push_back(open_one(one, split, vocab_size));
    } catch (const Error& e) {
      std::string m = e.what();
      if (m.rfind("data.path: ", 0) == 0) m.erase(0, 11);
      throw Error(key + ": " + m, e.exit_code());
    }
    if (d == 0) first_eos = eos;
    if (file_eos && eos != first_eos) {
      throw InputError(kBlockCausal + "data.paths[0] " + config.data.paths[0] + " has eos_id " +
                       std::to_string(first_eos) + " but " + key + " " + one.data.path +
                       " has eos_id " + std::to_string(eos) +
                       " (expected one EOS id for every file: files of one tokenizer)");
    }
  }
  return std::make_unique<ConcatSamples>(std::move(parts));
}

}  // namespace fsdp::data
