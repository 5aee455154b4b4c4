// T5 forward and backward on fsdp::Kernels (see fsdp/model/t5.hpp).
// Shapes: B batch, Te encoder length, Td decoder length, D = d_model, I = num_heads * d_kv,
// F = d_ff, H heads, V vocabulary, Vp the padded vocabulary (rows of shared and lm_head,
// columns of the logits; model.pad_vocab_multiple); Re = B*Te and Rd = B*Td rows.
#include "fsdp/model/t5.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {

// ---- relative position buckets (HF T5Attention._relative_position_bucket, float32) ----

int32_t t5_relative_position_bucket(int64_t relative_position, bool bidirectional,
                                    int64_t num_buckets, int64_t max_distance) {
  int64_t buckets = num_buckets, bucket = 0, n = 0;
  if (bidirectional) {
    buckets /= 2;
    if (relative_position > 0) bucket += buckets;
    n = relative_position < 0 ? -relative_position : relative_position;
  } else {
    n = relative_position < 0 ? -relative_position : 0;
  }
  const int64_t max_exact = buckets / 2;
  if (n < max_exact) return static_cast<int32_t>(bucket + n);
  // torch: log(n.float() / max_exact) / math.log(max_distance / max_exact) * (buckets -
  // max_exact), each op on a float32 tensor (Python scalars enter as float32), then .to(long).
  const float ratio = static_cast<float>(n) / static_cast<float>(max_exact);
  const float denom = static_cast<float>(
      std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const float scaled = std::log(ratio) / denom * static_cast<float>(buckets - max_exact);
  const int64_t large = std::min<int64_t>(max_exact + static_cast<int64_t>(scaled), buckets - 1);
  return static_cast<int32_t>(bucket + large);
}

std::vector<int32_t> t5_relative_position_buckets(int64_t query_length, int64_t key_length,
                                                  bool bidirectional, int64_t num_buckets,
                                                  int64_t max_distance) {
  // [P]: element o holds relative position j - i = o - (query_length - 1).
  const int64_t P = relative_positions(query_length, key_length);
  std::vector<int32_t> out(static_cast<std::size_t>(P));
  for (int64_t o = 0; o < P; ++o) {
    out[static_cast<std::size_t>(o)] =
        t5_relative_position_bucket(o - (query_length - 1), bidirectional, num_buckets,
                                    max_distance);
  }
  return out;
}

std::vector<int32_t> t5_shift_right(const std::vector<int32_t>& labels, int64_t B, int64_t T) {
  if (static_cast<int64_t>(labels.size()) != B * T) throw Error("t5_shift_right: labels size != B*T");
  std::vector<int32_t> out(labels.size(), 0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 1; t < T; ++t) {
      const int32_t y = labels[static_cast<std::size_t>(b * T + t - 1)];
      out[static_cast<std::size_t>(b * T + t)] = y == kIgnoreIndex ? 0 : y;
    }
  }
  return out;
}

// ---- modules and parameter ids ----


namespace {

// Parameter ids (indices into the declaration order) of one T5Block; -1 when absent.
struct BlockIds {
  int q = -1, k = -1, v = -1, o = -1, rel_bias = -1, ln0 = -1;  // layer.0 SelfAttention
  int cq = -1, ck = -1, cv = -1, co = -1, ln1 = -1;             // decoder layer.1 EncDecAttention
  int wi = -1, wi0 = -1, wi1 = -1, wo = -1, ln_ff = -1;         // last layer: DenseReluDense
};

// Parameter ids and module indices of the whole model.
struct IdTable {
  int shared = 0, enc_final = -1, dec_final = -1, lm_head = -1;  // parameter ids
  std::vector<BlockIds> enc, dec;
  int m_shared = 0, m_enc_final = -1, m_dec_final = -1, m_lm_head = -1;  // module indices
  int m_enc(int64_t l) const { return static_cast<int>(1 + l); }
  int m_dec(int64_t l) const { return m_enc_final + 1 + static_cast<int>(l); }
};

ParamSpec normal(std::string name, std::vector<int64_t> shape, double std, bool decay,
                 int64_t vocab_rows = 0) {
  return {std::move(name), std::move(shape), InitKind::normal, static_cast<float>(std), decay,
          vocab_rows};
}
ParamSpec norm_weight(std::string name, int64_t n) {
  return {std::move(name), {n}, InitKind::ones, 0.f, false};
}

// The one builder of the module declarations and of the parameter ids (HF _init_weights stds).
std::vector<ModuleDecl> build_modules(const T5Config& c, IdTable& t) {
  validate_t5_config(c);
  const int64_t D = c.d_model, I = c.num_heads * c.d_kv, F = c.d_ff, V = c.vocab_size;
  const int64_t Vp = c.padded_vocab();
  const double std_d = 1.0 / std::sqrt(static_cast<double>(D));
  const double std_q = 1.0 / std::sqrt(static_cast<double>(D * c.d_kv));
  const double std_o = 1.0 / std::sqrt(static_cast<double>(I));
  const double std_wo = 1.0 / std::sqrt(static_cast<double>(F));
  std::vector<ModuleDecl> mods;
  int next = 0;
  auto add = [&](ModuleDecl& m, ParamSpec p) {
    m.params.push_back(std::move(p));
    return next++;
  };
  ModuleDecl shared{"shared", "T5Embedding", {}};
  t.shared = add(shared, normal("shared.weight", {Vp, D}, 1.0, false, V));
  t.m_shared = 0;
  mods.push_back(std::move(shared));
  auto attention = [&](ModuleDecl& m, const std::string& p, int& q, int& k, int& v, int& o) {
    q = add(m, normal(p + "q.weight", {I, D}, std_q, true));
    k = add(m, normal(p + "k.weight", {I, D}, std_d, true));
    v = add(m, normal(p + "v.weight", {I, D}, std_d, true));
    o = add(m, normal(p + "o.weight", {D, I}, std_o, true));
  };
  for (const bool decoder : {false, true}) {
    const std::string stack = decoder ? "decoder" : "encoder";
    const int64_t n = decoder ? c.num_decoder_layers : c.num_layers;
    for (int64_t l = 0; l < n; ++l) {
      const std::string name = stack + ".block." + std::to_string(l);
      const std::string p = name + ".layer.";
      ModuleDecl m{name, "T5Block", {}};
      BlockIds b;
      attention(m, p + "0.SelfAttention.", b.q, b.k, b.v, b.o);
      if (l == 0) {
        b.rel_bias = add(m, normal(p + "0.SelfAttention.relative_attention_bias.weight",
                                   {c.relative_attention_num_buckets, c.num_heads}, std_d, false));
      }
      b.ln0 = add(m, norm_weight(p + "0.layer_norm.weight", D));
      if (decoder) {
        attention(m, p + "1.EncDecAttention.", b.cq, b.ck, b.cv, b.co);
        b.ln1 = add(m, norm_weight(p + "1.layer_norm.weight", D));
      }
      const std::string ff = p + (decoder ? "2." : "1.");
      if (c.feed_forward_proj == T5FeedForward::relu) {
        b.wi = add(m, normal(ff + "DenseReluDense.wi.weight", {F, D}, std_d, true));
      } else {
        b.wi0 = add(m, normal(ff + "DenseReluDense.wi_0.weight", {F, D}, std_d, true));
        b.wi1 = add(m, normal(ff + "DenseReluDense.wi_1.weight", {F, D}, std_d, true));
      }
      b.wo = add(m, normal(ff + "DenseReluDense.wo.weight", {D, F}, std_wo, true));
      b.ln_ff = add(m, norm_weight(ff + "layer_norm.weight", D));
      (decoder ? t.dec : t.enc).push_back(b);
      mods.push_back(std::move(m));
    }
    ModuleDecl fin{stack + ".final_layer_norm", "T5LayerNorm", {}};
    (decoder ? t.dec_final : t.enc_final) = add(fin, norm_weight(stack + ".final_layer_norm.weight", D));
    (decoder ? t.m_dec_final : t.m_enc_final) = static_cast<int>(mods.size());
    mods.push_back(std::move(fin));
  }
  if (!c.tie_word_embeddings) {
    ModuleDecl head{"lm_head", "T5LMHead", {}};
    t.lm_head = add(head, normal("lm_head.weight", {Vp, D}, 1.0, true, V));
    t.m_lm_head = static_cast<int>(mods.size());
    mods.push_back(std::move(head));
  }
  return mods;
}

// ---- activations: one table for the allocation and activation_bytes ----

// One block's saved internals (self-attention: ln0 .. h1; decoder cross-attention: ln1 .. h2;
// feed-forward: the norm in ln1 (encoder) / ln2 (decoder), then relu -> ff0 = relu(wi x);
// gated -> ff0 = wi_0 x, ff1 = wi_1 x (gelu_new(ff0) is recomputed by geglu_backward, not kept).
struct LayerBufs {
  DeviceBuffer ln0, rstd0, q, k, v, lse, atty, h1, ln1, rstd1;
  DeviceBuffer cq, ck, cv, clse, catty, h2, ln2, rstd2;
  DeviceBuffer ff0, ff1;
};
// Element counts of LayerBufs' fields, in the same order.
struct LayerSizes {
  int64_t ln0 = 0, rstd0 = 0, q = 0, k = 0, v = 0, lse = 0, atty = 0, h1 = 0, ln1 = 0, rstd1 = 0;
  int64_t cq = 0, ck = 0, cv = 0, clse = 0, catty = 0, h2 = 0, ln2 = 0, rstd2 = 0;
  int64_t ff0 = 0, ff1 = 0;
};

LayerSizes layer_sizes(const T5Config& c, int64_t B, int64_t Te, int64_t Td, bool decoder) {
  const int64_t D = c.d_model, I = c.num_heads * c.d_kv, F = c.d_ff, H = c.num_heads;
  const int64_t T = decoder ? Td : Te, R = B * T, Re = B * Te;
  const bool gated = c.feed_forward_proj == T5FeedForward::gated_gelu;
  LayerSizes s;
  s.ln0 = R * D; s.rstd0 = R; s.q = s.k = s.v = s.atty = R * I; s.lse = B * H * T;
  s.h1 = R * D; s.ln1 = R * D; s.rstd1 = R;
  if (decoder) {
    s.cq = s.catty = R * I; s.ck = s.cv = Re * I; s.clse = B * H * Td;
    s.h2 = R * D; s.ln2 = R * D; s.rstd2 = R;
  }
  s.ff0 = R * F;
  if (gated) s.ff1 = R * F;
  return s;
}

LayerSizes max_sizes(const LayerSizes& a, const LayerSizes& b) {
  LayerSizes m;
  auto mx = [](int64_t x, int64_t y) { return std::max(x, y); };
  m.ln0 = mx(a.ln0, b.ln0); m.rstd0 = mx(a.rstd0, b.rstd0); m.q = mx(a.q, b.q); m.k = mx(a.k, b.k);
  m.v = mx(a.v, b.v); m.lse = mx(a.lse, b.lse); m.atty = mx(a.atty, b.atty); m.h1 = mx(a.h1, b.h1);
  m.ln1 = mx(a.ln1, b.ln1); m.rstd1 = mx(a.rstd1, b.rstd1); m.cq = mx(a.cq, b.cq);
  m.ck = mx(a.ck, b.ck); m.cv = mx(a.cv, b.cv); m.clse = mx(a.clse, b.clse);
  m.catty = mx(a.catty, b.catty); m.h2 = mx(a.h2, b.h2); m.ln2 = mx(a.ln2, b.ln2);
  m.rstd2 = mx(a.rstd2, b.rstd2); m.ff0 = mx(a.ff0, b.ff0); m.ff1 = mx(a.ff1, b.ff1);
  return m;
}

struct ActBuffers {
  int64_t B = 0, Te = 0, Td = 0;   // capacity
  int64_t num_enc = 0;             // encoder blocks
  // Layers: one shared by the blocks that recompute (activation checkpointing; blocks in
  // forward order, the encoder's then the decoder's), one per other block.
  ActivationCheckpointing checkpointing;
  std::vector<DeviceBuffer> res_e;  // num_layers+1 encoder residual streams [Re,D]
  std::vector<DeviceBuffer> res_d;  // num_decoder_layers+1 decoder residual streams [Rd,D]
  std::vector<LayerBufs> layers;
  LayerBufs& enc_layer(int64_t l) {
    return layers[static_cast<std::size_t>(checkpointing.buffer_set(l))];
  }
  LayerBufs& dec_layer(int64_t l) {
    return layers[static_cast<std::size_t>(checkpointing.buffer_set(num_enc + l))];
  }
  DeviceBuffer enc_out, enc_rstd;       // encoder final norm [Re,D], fp32 [Re]
  DeviceBuffer lnf, lnf_rstd, logits;   // decoder final norm (scaled when tied) [Rd,D]; [Rd,Vp]
  // fp32 [H,Pe], [H,Pd] by relative position (Pe = relative_positions(Te, Te) = 2Te - 1,
  // Pd alike; kernels.hpp), and their gradients (fp32, same shapes).
  DeviceBuffer enc_bias, dec_bias;
  DeviceBuffer enc_dbias, dec_dbias;
  // Backward scratch (forward also uses dff0 for the feed-forward's transient product).
  DeviceBuffer dres_e, dres_d, denc_out, dln, dq, dk, dv, datty, dff0, dff1;
  // int32; enc_buckets [Pe], dec_buckets [Pd] (t5_relative_position_buckets)
  DeviceBuffer enc_ids, enc_mask, dec_ids, labels, enc_buckets, dec_buckets;
  int64_t buckets_Te = -1, buckets_Td = -1;  // lengths the uploaded buckets are for
};

enum class Kind { act, f32, i32 };

// THE activation table: calls f(DeviceBuffer* slot, Kind, numel) for every buffer of a
// micro-batch of B rows, Te encoder and Td decoder tokens (slot is null when a is null).
template <class Fn>
void activation_table(const T5Config& c, int64_t B, int64_t Te, int64_t Td,
                      ActivationCheckpointing ckpt, ActBuffers* a, Fn&& f) {
  const int64_t D = c.d_model, I = c.num_heads * c.d_kv, F = c.d_ff, H = c.num_heads;
  const int64_t Vp = c.padded_vocab(), Le = c.num_layers, Ld = c.num_decoder_layers;
  const int64_t Re = B * Te, Rd = B * Td, Rmax = std::max(Re, Rd);
  const int64_t Pe = relative_positions(Te, Te), Pd = relative_positions(Td, Td);
  const bool gated = c.feed_forward_proj == T5FeedForward::gated_gelu;
  auto at = [&](DeviceBuffer ActBuffers::*m) { return a ? &(a->*m) : nullptr; };
  if (a) {
    a->res_e.resize(static_cast<std::size_t>(Le + 1));
    a->res_d.resize(static_cast<std::size_t>(Ld + 1));
  }
  for (int64_t l = 0; l <= Le; ++l) f(a ? &a->res_e[static_cast<std::size_t>(l)] : nullptr, Kind::act, Re * D);
  for (int64_t l = 0; l <= Ld; ++l) f(a ? &a->res_d[static_cast<std::size_t>(l)] : nullptr, Kind::act, Rd * D);
  const LayerSizes enc = layer_sizes(c, B, Te, Td, false), dec = layer_sizes(c, B, Te, Td, true);
  const int64_t sets = ckpt.buffer_sets(Le + Ld), recomputed = ckpt.recomputed(Le + Ld);
  if (a) {
    a->layers.resize(static_cast<std::size_t>(sets));
    a->num_enc = Le;
    a->checkpointing = ckpt;
  }
  for (int64_t s = 0; s < sets; ++s) {
    // The shared set (ActivationCheckpointing::buffer_set) holds the largest of its blocks'
    // internals, field by field: blocks 0 .. recomputed (the first after the recomputing
    // ones included); another set, its one block's.
    const bool shared = recomputed > 0 && s == 0;
    const int64_t block = shared ? std::min(recomputed, Le + Ld - 1) : s + recomputed;
    const LayerSizes z = shared && block >= Le ? max_sizes(enc, dec) : (block < Le ? enc : dec);
    LayerBufs* y = a ? &a->layers[static_cast<std::size_t>(s)] : nullptr;
    auto L = [&](DeviceBuffer LayerBufs::*m) { return y ? &(y->*m) : nullptr; };
    f(L(&LayerBufs::ln0), Kind::act, z.ln0);     f(L(&LayerBufs::rstd0), Kind::f32, z.rstd0);
    f(L(&LayerBufs::q), Kind::act, z.q);         f(L(&LayerBufs::k), Kind::act, z.k);
    f(L(&LayerBufs::v), Kind::act, z.v);         f(L(&LayerBufs::lse), Kind::f32, z.lse);
    f(L(&LayerBufs::atty), Kind::act, z.atty);   f(L(&LayerBufs::h1), Kind::act, z.h1);
    f(L(&LayerBufs::ln1), Kind::act, z.ln1);     f(L(&LayerBufs::rstd1), Kind::f32, z.rstd1);
    f(L(&LayerBufs::cq), Kind::act, z.cq);       f(L(&LayerBufs::ck), Kind::act, z.ck);
    f(L(&LayerBufs::cv), Kind::act, z.cv);       f(L(&LayerBufs::clse), Kind::f32, z.clse);
    f(L(&LayerBufs::catty), Kind::act, z.catty); f(L(&LayerBufs::h2), Kind::act, z.h2);
    f(L(&LayerBufs::ln2), Kind::act, z.ln2);     f(L(&LayerBufs::rstd2), Kind::f32, z.rstd2);
    f(L(&LayerBufs::ff0), Kind::act, z.ff0);     f(L(&LayerBufs::ff1), Kind::act, z.ff1);
  }
  f(at(&ActBuffers::enc_out), Kind::act, Re * D);
  f(at(&ActBuffers::enc_rstd), Kind::f32, Re);
  f(at(&ActBuffers::lnf), Kind::act, Rd * D);
  f(at(&ActBuffers::lnf_rstd), Kind::f32, Rd);
  f(at(&ActBuffers::logits), Kind::act, Rd * Vp);
  f(at(&ActBuffers::enc_bias), Kind::f32, H * Pe);
  f(at(&ActBuffers::dec_bias), Kind::f32, H * Pd);
  f(at(&ActBuffers::enc_dbias), Kind::f32, H * Pe);
  f(at(&ActBuffers::dec_dbias), Kind::f32, H * Pd);
  f(at(&ActBuffers::dres_e), Kind::act, Re * D);
  f(at(&ActBuffers::dres_d), Kind::act, Rd * D);
  f(at(&ActBuffers::denc_out), Kind::act, Re * D);
  f(at(&ActBuffers::dln), Kind::act, Rmax * D);
  f(at(&ActBuffers::dq), Kind::act, Rmax * I);
  f(at(&ActBuffers::dk), Kind::act, Rmax * I);
  f(at(&ActBuffers::dv), Kind::act, Rmax * I);
  f(at(&ActBuffers::datty), Kind::act, Rmax * I);
  f(at(&ActBuffers::dff0), Kind::act, Rmax * F);
  f(at(&ActBuffers::dff1), Kind::act, gated ? Rmax * F : 0);
  f(at(&ActBuffers::enc_ids), Kind::i32, Re);
  f(at(&ActBuffers::enc_mask), Kind::i32, Re);
  f(at(&ActBuffers::dec_ids), Kind::i32, Rd);
  f(at(&ActBuffers::labels), Kind::i32, Rd);
  f(at(&ActBuffers::enc_buckets), Kind::i32, Pe);
  f(at(&ActBuffers::dec_buckets), Kind::i32, Pd);
}

DType dtype_of(Kind k, DType act) {
  return k == Kind::act ? act : (k == Kind::f32 ? DType::f32 : DType::i32);
}

}  // namespace

struct T5Model::Ids : IdTable {};
struct T5Model::Acts : ActBuffers {};

std::vector<ModuleDecl> t5_modules(const T5Config& c) {
  IdTable t;
  return build_modules(c, t);
}

int64_t T5Model::activation_bytes(const T5Config& c, int64_t B, const data::BatchShape& shape,
                                  DType act, ActivationCheckpointing activation_checkpointing) {
  int64_t bytes = 0;
  activation_table(c, B, shape.L, shape.target_len, activation_checkpointing, nullptr,
                   [&](DeviceBuffer*, Kind k, int64_t n) {
                     bytes += n * static_cast<int64_t>(dtype_size(dtype_of(k, act)));
                   });
  return bytes;
}

T5Model::T5Model(const T5Config& config, Kernels& kernels, DType activation_dtype,
                 ActivationCheckpointing activation_checkpointing)
    : cfg_(config), be_(kernels), rt_(kernels.runtime()), act_dtype_(activation_dtype),
      checkpointing_(activation_checkpointing), ids_(std::make_unique<Ids>()) {
  modules_ = build_modules(cfg_, *ids_);
}

T5Model::~T5Model() = default;

// Buffers are sized for the largest (B, Te, Td) seen; a smaller batch uses their prefixes.
void T5Model::ensure_buffers(int64_t B, int64_t Te, int64_t Td) {
  if (acts_ && B <= acts_->B && Te <= acts_->Te && Td <= acts_->Td) return;
  if (acts_) {
    B = std::max(B, acts_->B);
    Te = std::max(Te, acts_->Te);
    Td = std::max(Td, acts_->Td);
  }
  acts_.reset();
  auto a = std::make_unique<Acts>();
  a->B = B;
  a->Te = Te;
  a->Td = Td;
  activation_table(cfg_, B, Te, Td, checkpointing_, a.get(), [&](DeviceBuffer* slot, Kind k, int64_t n) {
    *slot = DeviceBuffer(rt_, dtype_of(k, act_dtype_), n, MemCategory::activations);
  });
  acts_ = std::move(a);
}

void T5Model::forward_backward(const data::Batch& batch, float grad_scale, ModuleHooks& hooks,
                               const TensorView& loss) {
  forward(batch, hooks, true, grad_scale, loss);
  backward(batch.B, batch.L, batch.target_len, hooks);
}

void T5Model::forward_loss(const data::Batch& batch, ModuleHooks& hooks, const TensorView& loss) {
  forward(batch, hooks, false, 1.f, loss);
}

void T5Model::forward(const data::Batch& batch, ModuleHooks& hooks, bool with_backward,
                      float grad_scale, const TensorView& loss) {
  const int64_t B = batch.B, Te = batch.L, Td = batch.target_len;
  if (B < 1 || Te < 1 || Td < 1) throw Error("T5 forward: empty batch (B, L and target_len must be >= 1)");
  if (static_cast<int64_t>(batch.inputs.size()) != B * Te ||
      static_cast<int64_t>(batch.targets.size()) != B * Td) {
    throw Error("T5 forward: batch inputs/targets sizes do not match [B,L] / [B,target_len]");
  }
  const int64_t V = cfg_.vocab_size, Vp = cfg_.padded_vocab(), D = cfg_.d_model, Re = B * Te,
                Rd = B * Td;
  std::vector<int32_t> mask(static_cast<std::size_t>(Re));
  for (std::size_t i = 0; i < batch.inputs.size(); ++i) {
    const int32_t x = batch.inputs[i];
    if (x < 0 || x >= V) throw Error("T5 forward: input id " + std::to_string(x) + " outside [0, vocab_size)");
    mask[i] = x != 0 ? 1 : 0;
  }
  for (int32_t y : batch.targets) {
    if (y != kIgnoreIndex && (y < 0 || y >= V)) {
      throw Error("T5 forward: label " + std::to_string(y) + " outside [0, vocab_size) and not -100");
    }
  }
  const std::vector<int32_t> dec_ids = t5_shift_right(batch.targets, B, Td);
  ensure_buffers(B, Te, Td);
  Acts& a = *acts_;
  const Ids& id = *ids_;
  rt_.copy_from_host(a.enc_ids.view({Re}), batch.inputs.data());
  rt_.copy_from_host(a.enc_mask.view({B, Te}), mask.data());
  rt_.copy_from_host(a.dec_ids.view({Rd}), dec_ids.data());
  rt_.copy_from_host(a.labels.view({Rd}), batch.targets.data());
  const int64_t NB = cfg_.relative_attention_num_buckets, MD = cfg_.relative_attention_max_distance;
  if (a.buckets_Te != Te) {
    const auto bk = t5_relative_position_buckets(Te, Te, true, NB, MD);
    rt_.copy_from_host(a.enc_buckets.view({relative_positions(Te, Te)}), bk.data());
    a.buckets_Te = Te;
  }
  if (a.buckets_Td != Td) {
    const auto bk = t5_relative_position_buckets(Td, Td, false, NB, MD);
    rt_.copy_from_host(a.dec_buckets.view({relative_positions(Td, Td)}), bk.data());
    a.buckets_Td = Td;
  }

  // shared: both embedding lookups (encoder ids and decoder input ids) in one bracket.
  hooks.pre_forward(id.m_shared);
  be_.embedding_lookup_forward(a.res_e[0].view({Re, D}), a.enc_ids.view({Re}), hooks.param(id.shared), Re, D);
  be_.embedding_lookup_forward(a.res_d[0].view({Rd, D}), a.dec_ids.view({Rd}), hooks.param(id.shared), Rd, D);
  hooks.post_forward(id.m_shared);

  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    hooks.pre_forward(id.m_enc(l));
    encoder_block_forward(l, B, Te, hooks, true, false);
    hooks.post_forward(id.m_enc(l));
  }
  const float eps = static_cast<float>(cfg_.layer_norm_epsilon);
  hooks.pre_forward(id.m_enc_final);
  be_.rmsnorm_forward(a.enc_out.view({Re, D}), a.enc_rstd.view({Re}),
                      a.res_e[static_cast<std::size_t>(cfg_.num_layers)].view({Re, D}),
                      hooks.param(id.enc_final), Re, D, eps);
  hooks.post_forward(id.m_enc_final);

  for (int64_t l = 0; l < cfg_.num_decoder_layers; ++l) {
    hooks.pre_forward(id.m_dec(l));
    decoder_block_forward(l, B, Te, Td, hooks, true, false);
    hooks.post_forward(id.m_dec(l));
  }

  // decoder.final_layer_norm, then the LM head (inside it when tied, else its own module):
  // logits [Rd,Vp], of which the loss reads the first V columns of each row.
  const TensorView lnf = a.lnf.view({Rd, D}), logits = a.logits.view({Rd, Vp});
  hooks.pre_forward(id.m_dec_final);
  be_.rmsnorm_forward(lnf, a.lnf_rstd.view({Rd}),
                      a.res_d[static_cast<std::size_t>(cfg_.num_decoder_layers)].view({Rd, D}),
                      hooks.param(id.dec_final), Rd, D, eps);
  auto head = [&](const TensorView& W) {
    be_.gemm(false, true, Rd, Vp, D, 1.f, lnf, W, 0.f, logits);
    if (with_backward) {
      be_.cross_entropy_forward_backward(loss, logits, a.labels.view({Rd}), Rd, V, Vp, grad_scale,
                                         0.f);
    } else {
      be_.cross_entropy_forward(loss, logits, a.labels.view({Rd}), Rd, V, Vp, 0.f);
    }
  };
  if (cfg_.tie_word_embeddings) {
    // HF: sequence_output * model_dim**-0.5 before the tied projection.
    be_.scale(lnf, static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))));
    head(hooks.param(id.shared));
    hooks.post_forward(id.m_dec_final);
  } else {
    hooks.post_forward(id.m_dec_final);
    hooks.pre_forward(id.m_lm_head);
    head(hooks.param(id.lm_head));
    hooks.post_forward(id.m_lm_head);
  }
}

// ---- feed-forward sub-layer (T5LayerFF's DenseReluDense), shared by both stacks ----
namespace {
struct FF {
  Kernels& be;
  const T5Config& c;
  ModuleHooks& hooks;
  const BlockIds& b;
  int64_t R;
  // out [R,D] (= when `accumulate`, out += ...) = wo(act(x)); x [R,D] = the normed input.
  // y: the block's saved ff0, ff1; scratch: [R,F] (the gated product).
  void forward(const TensorView& x, LayerBufs& y, const TensorView& scratch, const TensorView& out,
               bool write_output) const {
    const int64_t D = c.d_model, F = c.d_ff;
    if (c.feed_forward_proj == T5FeedForward::relu) {
      // ff0 = relu(x @ wi^T), the ReLU in the GEMM's epilogue where the backend has one
      be.gemm_relu(false, true, R, F, D, x, hooks.param(b.wi), y.ff0.view({R, F}));
      if (write_output) be.gemm(false, true, R, D, F, 1.f, y.ff0.view({R, F}), hooks.param(b.wo), 0.f, out);
    } else {
      // gelu_new(wi_0 x) * (wi_1 x) in one pass (geglu_forward)
      be.gemm(false, true, R, F, D, 1.f, x, hooks.param(b.wi0), 0.f, y.ff0.view({R, F}));
      be.gemm(false, true, R, F, D, 1.f, x, hooks.param(b.wi1), 0.f, y.ff1.view({R, F}));
      if (!write_output) return;
      be.geglu_forward(scratch, y.ff0.view({R, F}), y.ff1.view({R, F}));
      be.gemm(false, true, R, D, F, 1.f, scratch, hooks.param(b.wo), 0.f, out);
    }
  }
  // dout [R,D] = d(block output); writes dx [R,D] = d(normed input), accumulates weight grads.
  // s0, s1: [R,F] scratch (s1 is empty and unused for relu).
  void backward(const TensorView& dout, const TensorView& x, LayerBufs& y, const TensorView& s0,
                const DeviceBuffer& s1_buf, const TensorView& dx) const {
    const int64_t D = c.d_model, F = c.d_ff;
    if (c.feed_forward_proj == T5FeedForward::relu) {
      const TensorView a = y.ff0.view({R, F});
      be.gemm(true, false, D, F, R, 1.f, dout, a, 1.f, hooks.grad(b.wo));
      be.gemm(false, false, R, F, D, 1.f, dout, hooks.param(b.wo), 0.f, s0);  // d relu
      be.relu_backward(s0, a, s0);  // relu(h) > 0 exactly where h > 0
      be.gemm(true, false, F, D, R, 1.f, s0, x, 1.f, hooks.grad(b.wi));
      be.gemm(false, false, R, D, F, 1.f, s0, hooks.param(b.wi), 0.f, dx);
    } else {
      const TensorView g0 = y.ff0.view({R, F}), g1 = y.ff1.view({R, F});
      const TensorView s1 = s1_buf.view({R, F});
      be.geglu_forward(s0, g0, g1);  // the product wo read in forward
      be.gemm(true, false, D, F, R, 1.f, dout, s0, 1.f, hooks.grad(b.wo));
      be.gemm(false, false, R, F, D, 1.f, dout, hooks.param(b.wo), 0.f, s0);  // d prod
      be.geglu_backward(s0, s1, s0, g0, g1);  // d g0 into s0, d g1 into s1
      be.gemm(true, false, F, D, R, 1.f, s0, x, 1.f, hooks.grad(b.wi0));
      be.gemm(true, false, F, D, R, 1.f, s1, x, 1.f, hooks.grad(b.wi1));
      be.gemm(false, false, R, D, F, 1.f, s0, hooks.param(b.wi0), 0.f, dx);
      be.gemm(false, false, R, D, F, 1.f, s1, hooks.param(b.wi1), 1.f, dx);
    }
  }
};
// T5LayerSelfAttention of one block (layer.0), the same in both stacks:
// h1 [R,D] = o(mha(q, k, v; bias, key_mask, causal)), q, k, v = ln0(x) @ W^T, R = B*T; the
// caller adds the residual x in the next norm's pass (add_rmsnorm_forward), so that h1 ends
// as x + o(...) before anything reads it.
// The stack's position bias [H,P] (by relative position, P = relative_positions(T, T)) is
// computed by block 0 (`owns_bias`) from its table and read by every block; in backward every
// block adds its score gradient into dbias [H,P] and block 0 turns the sum into its table's
// gradient.
struct SelfAttention {
  Kernels& be;
  const T5Config& c;
  ModuleHooks& hooks;
  const BlockIds& b;
  int64_t B, T;
  TensorView bias;     // fp32 [H,P], P = relative_positions(T, T)
  TensorView buckets;  // int32 [P]
  // compute_bias: block 0's forward (not its recompute, which finds the bias in place).
  void forward(LayerBufs& y, const TensorView& x, const TensorView& key_mask, bool causal,
               bool compute_bias, float eps) const {
    const int64_t D = c.d_model, I = c.num_heads * c.d_kv, H = c.num_heads, R = B * T;
    const TensorView ln0 = y.ln0.view({R, D}), q = y.q.view({R, I}), k = y.k.view({R, I});
    const TensorView v = y.v.view({R, I}), atty = y.atty.view({R, I}), h1 = y.h1.view({R, D});
    be.rmsnorm_forward(ln0, y.rstd0.view({R}), x, hooks.param(b.ln0), R, D, eps);
    be.gemm(false, true, R, I, D, 1.f, ln0, hooks.param(b.q), 0.f, q);
    be.gemm(false, true, R, I, D, 1.f, ln0, hooks.param(b.k), 0.f, k);
    be.gemm(false, true, R, I, D, 1.f, ln0, hooks.param(b.v), 0.f, v);
    if (compute_bias) be.position_bias_forward(bias, hooks.param(b.rel_bias), buckets, H, T, T);
    be.mha_forward(atty, y.lse.view({B, H, T}), q, k, v, bias, key_mask, B, T, T, H, c.d_kv,
                   1.f, causal);
    // h1 = o(atty) only: the caller adds the residual x in its norm's pass
    // (add_rmsnorm_forward).
    be.gemm(false, true, R, D, I, 1.f, atty, hooks.param(b.o), 0.f, h1);
  }
  // dres [R,D]: d h1 on entry, d x on exit (accumulated). Scratch: dq, dk, dv, datty [R,I],
  // dln [R,D]; dbias fp32 [H,P] accumulates. key_mask and causal as in forward.
  void backward(LayerBufs& y, const TensorView& x, const TensorView& dres, const TensorView& dq,
                const TensorView& dk, const TensorView& dv, const TensorView& datty,
                const TensorView& dln, const TensorView& key_mask, bool causal,
                const TensorView& dbias, bool owns_bias) const {
    const int64_t D = c.d_model, I = c.num_heads * c.d_kv, H = c.num_heads, R = B * T;
    const TensorView ln0 = y.ln0.view({R, D});
    const TensorView q = y.q.view({R, I}), k = y.k.view({R, I}), v = y.v.view({R, I});
    be.gemm(true, false, D, I, R, 1.f, dres, y.atty.view({R, I}), 1.f, hooks.grad(b.o));
    be.gemm(false, false, R, I, D, 1.f, dres, hooks.param(b.o), 0.f, datty);
    be.mha_backward(dq, dk, dv, dbias, datty, q, k, v, y.atty.view({R, I}), y.lse.view({B, H, T}),
                    bias, key_mask, B, T, T, H, c.d_kv, 1.f, causal);
    be.gemm(true, false, I, D, R, 1.f, dq, ln0, 1.f, hooks.grad(b.q));
    be.gemm(true, false, I, D, R, 1.f, dk, ln0, 1.f, hooks.grad(b.k));
    be.gemm(true, false, I, D, R, 1.f, dv, ln0, 1.f, hooks.grad(b.v));
    be.gemm(false, false, R, D, I, 1.f, dq, hooks.param(b.q), 0.f, dln);
    be.gemm(false, false, R, D, I, 1.f, dk, hooks.param(b.k), 1.f, dln);
    be.gemm(false, false, R, D, I, 1.f, dv, hooks.param(b.v), 1.f, dln);
    be.rmsnorm_backward(dres, hooks.grad(b.ln0), dln, x, hooks.param(b.ln0), y.rstd0.view({R}),
                        R, D);
    if (owns_bias) be.position_bias_backward(hooks.grad(b.rel_bias), dbias, buckets, H, T, T);
  }
};

}  // namespace

// Encoder block l: res_e[l] -> (self-attention with the bidirectional bias and the padding key
// mask) -> h1 -> (feed-forward) -> res_e[l+1].
void T5Model::encoder_block_forward(int64_t l, int64_t B, int64_t Te, ModuleHooks& hooks,
                                    bool write_output, bool recompute) {
  Acts& a = *acts_;
  const BlockIds& b = ids_->enc[static_cast<std::size_t>(l)];
  const int64_t D = cfg_.d_model, H = cfg_.num_heads, R = B * Te;
  const float eps = static_cast<float>(cfg_.layer_norm_epsilon);
  LayerBufs& y = a.enc_layer(l);
  const TensorView x = a.res_e[static_cast<std::size_t>(l)].view({R, D}), h1 = y.h1.view({R, D});
  const int64_t P = relative_positions(Te, Te);
  const TensorView bias = a.enc_bias.view({H, P}), buckets = a.enc_buckets.view({P});
  SelfAttention{be_, cfg_, hooks, b, B, Te, bias, buckets}.forward(
      y, x, a.enc_mask.view({B, Te}), /*causal=*/false, l == 0 && !recompute, eps);
  const TensorView ln1 = y.ln1.view({R, D});
  be_.add_rmsnorm_forward(h1, ln1, y.rstd1.view({R}), x, TensorView{}, hooks.param(b.ln_ff), R, D,
                          eps);
  const TensorView out = a.res_e[static_cast<std::size_t>(l + 1)].view({R, D});
  FF{be_, cfg_, hooks, b, R}.forward(ln1, y, a.dff0.view({R, cfg_.d_ff}), out, write_output);
  if (write_output) be_.add(out, out, h1);
}

// Decoder block l: res_d[l] -> causal self-attention (+ causal bias) -> h1 -> cross-attention
// over enc_out (padding key mask) -> h2 -> feed-forward -> res_d[l+1].
void T5Model::decoder_block_forward(int64_t l, int64_t B, int64_t Te, int64_t Td,
                                    ModuleHooks& hooks, bool write_output, bool recompute) {
  Acts& a = *acts_;
  const BlockIds& b = ids_->dec[static_cast<std::size_t>(l)];
  const int64_t D = cfg_.d_model, I = cfg_.num_heads * cfg_.d_kv, H = cfg_.num_heads;
  const int64_t R = B * Td, Re = B * Te;
  const float eps = static_cast<float>(cfg_.layer_norm_epsilon);
  LayerBufs& y = a.dec_layer(l);
  const TensorView x = a.res_d[static_cast<std::size_t>(l)].view({R, D}), h1 = y.h1.view({R, D});
  const int64_t P = relative_positions(Td, Td);
  const TensorView bias = a.dec_bias.view({H, P}), buckets = a.dec_buckets.view({P});
  SelfAttention{be_, cfg_, hooks, b, B, Td, bias, buckets}.forward(
      y, x, TensorView{}, /*causal=*/true, l == 0 && !recompute, eps);
  // EncDecAttention
  const TensorView ln1 = y.ln1.view({R, D}), cq = y.cq.view({R, I}), ck = y.ck.view({Re, I});
  const TensorView cv = y.cv.view({Re, I}), catty = y.catty.view({R, I}), h2 = y.h2.view({R, D});
  const TensorView enc = a.enc_out.view({Re, D});
  be_.add_rmsnorm_forward(h1, ln1, y.rstd1.view({R}), x, TensorView{}, hooks.param(b.ln1), R, D,
                          eps);
  be_.gemm(false, true, R, I, D, 1.f, ln1, hooks.param(b.cq), 0.f, cq);
  be_.gemm(false, true, Re, I, D, 1.f, enc, hooks.param(b.ck), 0.f, ck);
  be_.gemm(false, true, Re, I, D, 1.f, enc, hooks.param(b.cv), 0.f, cv);
  be_.mha_forward(catty, y.clse.view({B, H, Td}), cq, ck, cv, TensorView{},
                  a.enc_mask.view({B, Te}), B, Td, Te, H, cfg_.d_kv, 1.f, false);
  be_.gemm(false, true, R, D, I, 1.f, catty, hooks.param(b.co), 0.f, h2);
  // feed-forward
  const TensorView ln2 = y.ln2.view({R, D});
  be_.add_rmsnorm_forward(h2, ln2, y.rstd2.view({R}), h1, TensorView{}, hooks.param(b.ln_ff), R, D,
                          eps);
  const TensorView out = a.res_d[static_cast<std::size_t>(l + 1)].view({R, D});
  FF{be_, cfg_, hooks, b, R}.forward(ln2, y, a.dff0.view({R, cfg_.d_ff}), out, write_output);
  if (write_output) be_.add(out, out, h2);
}

void T5Model::backward(int64_t B, int64_t Te, int64_t Td, ModuleHooks& hooks) {
  Acts& a = *acts_;
  const Ids& id = *ids_;
  const int64_t D = cfg_.d_model, V = cfg_.padded_vocab(), H = cfg_.num_heads;  // dlogits' width
  const int64_t Re = B * Te, Rd = B * Td;
  const int64_t Le = cfg_.num_layers, Ld = cfg_.num_decoder_layers;
  rt_.fill_zero(a.enc_dbias.view({H * relative_positions(Te, Te)}));
  rt_.fill_zero(a.dec_dbias.view({H * relative_positions(Td, Td)}));
  rt_.fill_zero(a.denc_out.view({Re * D}));
  const TensorView dlogits = a.logits.view({Rd, V}), lnf = a.lnf.view({Rd, D});
  const TensorView dln = a.dln.view({Rd, D}), dres_d = a.dres_d.view({Rd, D});
  auto final_norm_backward = [&] {
    rt_.fill_zero(dres_d);
    be_.rmsnorm_backward(dres_d, hooks.grad(id.dec_final), dln,
                         a.res_d[static_cast<std::size_t>(Ld)].view({Rd, D}),
                         hooks.param(id.dec_final), a.lnf_rstd.view({Rd}), Rd, D);
  };
  if (cfg_.tie_word_embeddings) {
    hooks.pre_backward(id.m_dec_final);
    be_.gemm(true, false, V, D, Rd, 1.f, dlogits, lnf, 1.f, hooks.grad(id.shared));
    be_.gemm(false, false, Rd, D, V, 1.f, dlogits, hooks.param(id.shared), 0.f, dln);
    be_.scale(dln, static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))));
    final_norm_backward();
    hooks.post_backward(id.m_dec_final);
  } else {
    hooks.pre_backward(id.m_lm_head);
    be_.gemm(true, false, V, D, Rd, 1.f, dlogits, lnf, 1.f, hooks.grad(id.lm_head));
    be_.gemm(false, false, Rd, D, V, 1.f, dlogits, hooks.param(id.lm_head), 0.f, dln);
    hooks.post_backward(id.m_lm_head);
    hooks.pre_backward(id.m_dec_final);
    final_norm_backward();
    hooks.post_backward(id.m_dec_final);
  }

  for (int64_t l = Ld - 1; l >= 0; --l) {
    hooks.pre_backward(id.m_dec(l));
    if (checkpointing_.recomputes(Le + l)) decoder_block_forward(l, B, Te, Td, hooks, false, true);
    decoder_block_backward(l, B, Te, Td, hooks);
    hooks.post_backward(id.m_dec(l));
  }

  // encoder.final_layer_norm: the encoder output's gradient, summed over the decoder blocks.
  const TensorView dres_e = a.dres_e.view({Re, D});
  hooks.pre_backward(id.m_enc_final);
  rt_.fill_zero(dres_e);
  be_.rmsnorm_backward(dres_e, hooks.grad(id.enc_final), a.denc_out.view({Re, D}),
                       a.res_e[static_cast<std::size_t>(Le)].view({Re, D}), hooks.param(id.enc_final),
                       a.enc_rstd.view({Re}), Re, D);
  hooks.post_backward(id.m_enc_final);

  for (int64_t l = Le - 1; l >= 0; --l) {
    hooks.pre_backward(id.m_enc(l));
    if (checkpointing_.recomputes(l)) encoder_block_forward(l, B, Te, hooks, false, true);
    encoder_block_backward(l, B, Te, hooks);
    hooks.post_backward(id.m_enc(l));
  }

  hooks.pre_backward(id.m_shared);
  be_.embedding_lookup_backward(hooks.grad(id.shared), dres_e, a.enc_ids.view({Re}), Re, D);
  be_.embedding_lookup_backward(hooks.grad(id.shared), dres_d, a.dec_ids.view({Rd}), Rd, D);
  hooks.post_backward(id.m_shared);
}

// a.dres_e holds d res_e[l+1] on entry and d res_e[l] on exit.
void T5Model::encoder_block_backward(int64_t l, int64_t B, int64_t Te, ModuleHooks& hooks) {
  Acts& a = *acts_;
  const BlockIds& b = ids_->enc[static_cast<std::size_t>(l)];
  const int64_t D = cfg_.d_model, I = cfg_.num_heads * cfg_.d_kv, H = cfg_.num_heads;
  const int64_t F = cfg_.d_ff, R = B * Te;
  LayerBufs& y = a.enc_layer(l);
  auto W = [&](int p) { return hooks.param(p); };
  auto G = [&](int p) { return hooks.grad(p); };
  const TensorView dres = a.dres_e.view({R, D}), dln = a.dln.view({R, D});
  const TensorView ln1 = y.ln1.view({R, D}), h1 = y.h1.view({R, D});
  const TensorView dq = a.dq.view({R, I}), dk = a.dk.view({R, I}), dv = a.dv.view({R, I});
  const TensorView datty = a.datty.view({R, I});
  // feed-forward: out = h1 + ff(ln1(h1))
  FF{be_, cfg_, hooks, b, R}.backward(dres, ln1, y, a.dff0.view({R, F}), a.dff1, dln);
  be_.rmsnorm_backward(dres, G(b.ln_ff), dln, h1, W(b.ln_ff), y.rstd1.view({R}), R, D);  // d h1
  // self-attention: h1 = x + o(mha(q, k, v) + bias); dres becomes d x
  const int64_t P = relative_positions(Te, Te);
  SelfAttention{be_, cfg_, hooks, b, B, Te, a.enc_bias.view({H, P}), a.enc_buckets.view({P})}
      .backward(y, a.res_e[static_cast<std::size_t>(l)].view({R, D}), dres, dq, dk, dv, datty,
                dln, a.enc_mask.view({B, Te}), /*causal=*/false, a.enc_dbias.view({H, P}),
                l == 0);
}

// a.dres_d holds d res_d[l+1] on entry and d res_d[l] on exit; a.denc_out accumulates the
// cross-attention's gradient of the encoder output.
void T5Model::decoder_block_backward(int64_t l, int64_t B, int64_t Te, int64_t Td,
                                     ModuleHooks& hooks) {
  Acts& a = *acts_;
  const BlockIds& b = ids_->dec[static_cast<std::size_t>(l)];
  const int64_t D = cfg_.d_model, I = cfg_.num_heads * cfg_.d_kv, H = cfg_.num_heads;
  const int64_t F = cfg_.d_ff, R = B * Td, Re = B * Te;
  LayerBufs& y = a.dec_layer(l);
  auto W = [&](int p) { return hooks.param(p); };
  auto G = [&](int p) { return hooks.grad(p); };
  const TensorView dres = a.dres_d.view({R, D}), dln = a.dln.view({R, D});
  // feed-forward: out = h2 + ff(ln2(h2))
  FF{be_, cfg_, hooks, b, R}.backward(dres, y.ln2.view({R, D}), y, a.dff0.view({R, F}),
                                      a.dff1, dln);
  be_.rmsnorm_backward(dres, G(b.ln_ff), dln, y.h2.view({R, D}), W(b.ln_ff), y.rstd2.view({R}), R, D);
  // cross-attention: h2 = h1 + co(mha(cq(ln1(h1)), ck(enc), cv(enc)))
  {
    const TensorView ln1 = y.ln1.view({R, D}), enc = a.enc_out.view({Re, D});
    const TensorView dq = a.dq.view({R, I}), dk = a.dk.view({Re, I}), dv = a.dv.view({Re, I});
    const TensorView datty = a.datty.view({R, I}), denc = a.denc_out.view({Re, D});
    be_.gemm(true, false, D, I, R, 1.f, dres, y.catty.view({R, I}), 1.f, G(b.co));
    be_.gemm(false, false, R, I, D, 1.f, dres, W(b.co), 0.f, datty);
    be_.mha_backward(dq, dk, dv, TensorView{}, datty, y.cq.view({R, I}), y.ck.view({Re, I}),
                     y.cv.view({Re, I}), y.catty.view({R, I}), y.clse.view({B, H, Td}),
                     TensorView{}, a.enc_mask.view({B, Te}), B, Td, Te, H, cfg_.d_kv, 1.f,
                     /*causal=*/false);
    be_.gemm(true, false, I, D, R, 1.f, dq, ln1, 1.f, G(b.cq));
    be_.gemm(true, false, I, D, Re, 1.f, dk, enc, 1.f, G(b.ck));
    be_.gemm(true, false, I, D, Re, 1.f, dv, enc, 1.f, G(b.cv));
    be_.gemm(false, false, Re, D, I, 1.f, dk, W(b.ck), 1.f, denc);
    be_.gemm(false, false, Re, D, I, 1.f, dv, W(b.cv), 1.f, denc);
    be_.gemm(false, false, R, D, I, 1.f, dq, W(b.cq), 0.f, dln);
    be_.rmsnorm_backward(dres, G(b.ln1), dln, y.h1.view({R, D}), W(b.ln1), y.rstd1.view({R}), R, D);
  }
  // causal self-attention: h1 = x + o(mha(q, k, v) + bias); dres becomes d x
  const int64_t P = relative_positions(Td, Td);
  SelfAttention{be_, cfg_, hooks, b, B, Td, a.dec_bias.view({H, P}), a.dec_buckets.view({P})}
      .backward(y, a.res_d[static_cast<std::size_t>(l)].view({R, D}), dres, a.dq.view({R, I}),
                a.dk.view({R, I}), a.dv.view({R, I}), a.datty.view({R, I}), dln, TensorView{},
                /*causal=*/true, a.dec_dbias.view({H, P}), l == 0);
}

}  // namespace fsdp
