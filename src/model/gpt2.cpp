// GPT-2 forward and backward on fsdp::Kernels (see fsdp/model/gpt2.hpp).
// Shapes: B batch, T sequence, C = n_embd, H = n_head, V = vocab_size, Vp = the padded
// vocabulary (rows of wte, columns of the logits), BT = B*T rows.
#include "fsdp/model/gpt2.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/model/model_args.hpp"

namespace fsdp {
namespace {

// Parameter ids: embeddings 0 wte, 1 wpe; block l: 2 + 12 l + k; ln_f: 2 + 12 L + {0,1}.
enum BlockParam {
  kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB,
  kLn2W, kLn2B, kFcW, kFcB, kMlpProjW, kMlpProjB, kBlockParams
};
constexpr int kWte = 0, kWpe = 1;

ParamSpec weight(std::string name, std::vector<int64_t> shape, float std) {
  return {std::move(name), std::move(shape), InitKind::normal, std, true};
}
ParamSpec bias(std::string name, int64_t n) { return {std::move(name), {n}, InitKind::zeros, 0.f, false}; }
ParamSpec ln_weight(std::string name, int64_t n) {
  return {std::move(name), {n}, InitKind::ones, 0.f, false};
}

}  // namespace

// Saved activations for one [B,T] micro-batch (llm.c's ActivationTensors), plus scratch
// for backward. All in MemCategory::activations.
struct Gpt2Model::Acts {
  int64_t B = 0, T = 0;  // capacity
  std::vector<DeviceBuffer> res;  // L+1 residual streams [BT,C]: res[0] embeddings, res[l+1] block l out
  struct Layer {
    // lse: fp32 [B,H,T], attention's row logsumexp (kernels.hpp: no [B,H,T,T] is kept)
    // fc: the MLP's pre-activation (bias added). GELU(fc) is not kept: see dfc below.
    // The LayerNorms' outputs are not kept either, only their statistics: see dln below.
    DeviceBuffer ln1_mean, ln1_rstd, qkv, lse, atty, res2, ln2_mean, ln2_rstd, fc;
  };
  // Layers: one shared by the blocks that recompute (activation checkpointing: the first
  // `recomputed`), then one per other block.
  std::vector<Layer> layers;
  ActivationCheckpointing checkpointing;
  Layer& layer(int64_t l) { return layers[static_cast<std::size_t>(checkpointing.buffer_set(l))]; }
  // logits [BT,Vp] (dlogits after CE); [chunk,Vp] under model.fused_linear_cross_entropy
  DeviceBuffer lnf, lnf_mean, lnf_rstd, logits;
  // Document masking (Documents; allocated by the first forward that has them): each token's
  // position in its document and its document's first position in the row, int32 [BT].
  DeviceBuffer doc_pos, doc_start;
  // Backward scratch. dfc [BT,4C] also holds GELU(fc) where only one block needs it: in
  // forward each block's, read by its c_proj GEMM; in backward the block's own, recomputed
  // from its fc for the c_proj weight gradient before dfc is overwritten (torch.compile's
  // partitioner recomputes such pointwise ops too). L [BT,4C] activations fewer for one
  // elementwise pass per block in backward.
  // dln [BT,C] also holds ln_1's and ln_2's outputs where one block needs them: in forward for
  // the GEMM each feeds; in backward recomputed (layernorm_forward of the kept block input and
  // res2: the same kernel on the same values, so the same bits) just before the weight
  // gradient that reads it, where dln is free. Two [BT,C] activations fewer per block for
  // two LayerNorm passes in backward (torch.compile's partitioner recomputes norms too).
  DeviceBuffer dres, dln, dqkv, dfc;
  DeviceBuffer targets_dev, tokens_dev;                    // [BT] int32 on the device
};

Gpt2Model::Gpt2Model(const Gpt2Config& config, Kernels& kernels, DType activation_dtype,
                     ActivationCheckpointing activation_checkpointing)
    : cfg_(config), be_(kernels), rt_(kernels.runtime()), act_dtype_(activation_dtype),
      checkpointing_(activation_checkpointing), modules_(gpt2_modules(config)) {}

std::vector<ModuleDecl> gpt2_modules(const Gpt2Config& cfg_) {
  std::vector<ModuleDecl> modules_;
  const int64_t C = cfg_.n_embd, V = cfg_.vocab_size, P = cfg_.n_positions, L = cfg_.n_layer;
  const int64_t Vp = cfg_.padded_vocab();
  const float std0 = 0.02f;
  const float std_proj = 0.02f / std::sqrt(2.0f * static_cast<float>(L));
  ModuleDecl emb{"embeddings", "GPT2Embeddings", {}};
  emb.params.push_back({"wte.weight", {Vp, C}, InitKind::normal, std0, false, V});
  emb.params.push_back({"wpe.weight", {P, C}, InitKind::normal, std0, false});
  modules_.push_back(std::move(emb));
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    ModuleDecl blk{"h." + std::to_string(l), "GPT2Block", {}};
    blk.params = {ln_weight(p + "ln_1.weight", C),           bias(p + "ln_1.bias", C),
                  weight(p + "attn.c_attn.weight", {3 * C, C}, std0),
                  bias(p + "attn.c_attn.bias", 3 * C),
                  weight(p + "attn.c_proj.weight", {C, C}, std_proj),
                  bias(p + "attn.c_proj.bias", C),
                  ln_weight(p + "ln_2.weight", C),           bias(p + "ln_2.bias", C),
                  weight(p + "mlp.c_fc.weight", {4 * C, C}, std0),
                  bias(p + "mlp.c_fc.bias", 4 * C),
                  weight(p + "mlp.c_proj.weight", {C, 4 * C}, std_proj),
                  bias(p + "mlp.c_proj.bias", C)};
    modules_.push_back(std::move(blk));
  }
  ModuleDecl lnf{"ln_f", "LayerNorm", {ln_weight("ln_f.weight", C), bias("ln_f.bias", C)}};
  modules_.push_back(std::move(lnf));
  return modules_;
}

Gpt2Model::~Gpt2Model() = default;

// Element counts of the buffers ensure_buffers allocates, by storage class: activations in
// the activation dtype, LayerNorm statistics and attention's row logsumexp in fp32,
// tokens and targets in int32. One table for the allocation and the memory plan.
namespace {
struct ActCounts {
  int64_t act = 0, f32 = 0, i32 = 0;
};
ActCounts act_counts(const Gpt2Config& c, int64_t B, int64_t T,
                     ActivationCheckpointing checkpointing, DocumentMasking docs) {
  const int64_t BT = B * T, C = c.n_embd, H = c.n_head, V = c.padded_vocab(), L = c.n_layer;
  const int64_t S = checkpointing.buffer_sets(L);
  const int64_t logit_rows = c.fused_lce.logits_rows(BT, C, V);  // BT, or one chunk
  ActCounts n;
  n.act = (L + 1) * BT * C                                               // residual streams
          + S * BT * (3 * C + C + C + 4 * C)                             // qkv atty res2 fc
          + BT * C + logit_rows * V                                      // ln_f, logits
          + BT * C * 2 + BT * 3 * C + BT * 4 * C;                        // backward scratch
  n.f32 = S * (4 * BT + B * H * T) + 2 * BT;  // LN mean/rstd, attention lse
  n.i32 = 2 * BT;                                 // tokens, targets
  if (docs.enabled) n.i32 += 2 * BT;              // doc_pos, doc_start
  return n;
}
}  // namespace

int64_t Gpt2Model::activation_bytes(const Gpt2Config& c, int64_t B, int64_t T, DType act,
                                    ActivationCheckpointing activation_checkpointing,
                                    DocumentMasking docs) {
  const ActCounts n = act_counts(c, B, T, activation_checkpointing, docs);
  return n.act * static_cast<int64_t>(dtype_size(act)) + 4 * n.f32 + 4 * n.i32;
}

// Buffers are sized for the largest [B,T] seen; a smaller batch uses their prefixes.
void Gpt2Model::ensure_buffers(int64_t B, int64_t T) {
  if (acts_ && B <= acts_->B && T <= acts_->T) return;
  if (acts_) {
    B = std::max(B, acts_->B);
    T = std::max(T, acts_->T);
  }
  acts_.reset();
  auto a = std::make_unique<Acts>();
  a->B = B;
  a->T = T;
  const int64_t BT = B * T, C = cfg_.n_embd, H = cfg_.n_head, V = cfg_.padded_vocab();
  const auto cat = MemCategory::activations;
  auto f = [&](int64_t n) { return DeviceBuffer(rt_, act_dtype_, n, cat); };
  auto f32 = [&](int64_t n) { return DeviceBuffer(rt_, DType::f32, n, cat); };
  for (int64_t l = 0; l <= cfg_.n_layer; ++l) a->res.push_back(f(BT * C));
  a->layers.resize(static_cast<std::size_t>(checkpointing_.buffer_sets(cfg_.n_layer)));
  a->checkpointing = checkpointing_;
  for (auto& ly : a->layers) {
    ly.ln1_mean = f32(BT); ly.ln1_rstd = f32(BT);
    ly.qkv = f(BT * 3 * C); ly.lse = f32(B * H * T); ly.atty = f(BT * C); ly.res2 = f(BT * C);
    ly.ln2_mean = f32(BT); ly.ln2_rstd = f32(BT);
    ly.fc = f(BT * 4 * C);
  }
  a->lnf = f(BT * C); a->lnf_mean = f32(BT); a->lnf_rstd = f32(BT);
  a->logits = f(cfg_.fused_lce.logits_rows(BT, C, V) * V);
  a->dres = f(BT * C); a->dln = f(BT * C); a->dqkv = f(BT * 3 * C); a->dfc = f(BT * 4 * C);
  a->tokens_dev = DeviceBuffer(rt_, DType::i32, BT, cat);
  a->targets_dev = DeviceBuffer(rt_, DType::i32, BT, cat);
  acts_ = std::move(a);
}

TensorView Gpt2Model::doc_start(int64_t BT) const {
  return docs_.positions ? acts_->doc_start.view({BT}) : TensorView{};
}

void Gpt2Model::forward(const int32_t* tokens_host, const int32_t* targets_host, int64_t B,
                        int64_t T, ModuleHooks& hooks, bool with_backward, float grad_scale,
                        const TensorView& loss) {
  if (T > cfg_.n_positions) throw Error("GPT-2 forward: T exceeds n_positions");
  ensure_buffers(B, T);
  Acts& a = *acts_;
  const int64_t BT = B * T, C = cfg_.n_embd, V = cfg_.vocab_size, Vp = cfg_.padded_vocab();
  last_rows_ = BT;
  const int64_t L = cfg_.n_layer;
  const float eps = static_cast<float>(cfg_.layer_norm_epsilon);
  const TensorView tokens = a.tokens_dev.view({B, T}), targets = a.targets_dev.view({BT});
  rt_.copy_from_host(tokens, tokens_host);
  rt_.copy_from_host(targets, targets_host);
  auto rows = [&](const DeviceBuffer& b, int64_t width) { return b.view({BT, width}); };
  const DocumentMasking docs = document_masking();
  if (docs.enabled) upload_documents(rt_, a.doc_pos, a.doc_start, B, T, a.B * a.T);

  // embeddings: res[0] [B,T,C] = wte[tokens] + wpe[0:T], or under reset positions wte[tokens]
  // + wpe[positions] (two lookups and an add, in the dln scratch: HF's inputs_embeds +
  // position_embeds)
  hooks.pre_forward(0);
  if (docs.reset_positions) {
    be_.embedding_lookup_forward(rows(a.res[0], C), tokens.reshape({BT}), hooks.param(kWte), BT,
                                 C);
    be_.embedding_lookup_forward(rows(a.dln, C), a.doc_pos.view({BT}), hooks.param(kWpe), BT, C);
    be_.add(rows(a.res[0], C), rows(a.res[0], C), rows(a.dln, C));
  } else {
    be_.embedding_forward(rows(a.res[0], C), tokens, hooks.param(kWte), hooks.param(kWpe), B, T,
                          C);
  }
  hooks.post_forward(0);

  for (int64_t l = 0; l < L; ++l) {
    const int m = static_cast<int>(1 + l);
    hooks.pre_forward(m);
    block_forward(l, B, T, hooks, /*write_output=*/true);
    hooks.post_forward(m);
  }

  // ln_f and the tied LM head: logits [BT,Vp] = ln_f(res[L]) @ wte[Vp,C]^T; the loss reads
  // the first V columns of each row (the padding columns take no part in the softmax).
  // Chunked (model.fused_linear_cross_entropy): evaluation computes the loss chunk by chunk
  // here; training leaves the head to backward.
  const int mf = static_cast<int>(L + 1);
  const int pf = static_cast<int>(2 + kBlockParams * L);
  const TensorView lnf = rows(a.lnf, C);
  hooks.pre_forward(mf);
  be_.layernorm_forward(lnf, a.lnf_mean.view({BT}), a.lnf_rstd.view({BT}), rows(a.res[L], C),
                        hooks.param(pf), hooks.param(pf + 1), BT, C, eps);
  if (cfg_.fused_lce.enabled) {
    if (!with_backward) lm_head_chunks_loss(be_, head_chunks(BT, hooks), loss);
  } else {
    const TensorView logits = rows(a.logits, Vp);
    be_.gemm(false, true, BT, Vp, C, 1.f, lnf, hooks.param(kWte), 0.f, logits);
    if (with_backward) {
      be_.cross_entropy_forward_backward(loss, logits, targets, BT, V, Vp, grad_scale, 0.f);
    } else {
      be_.cross_entropy_forward(loss, logits, targets, BT, V, Vp, 0.f);
    }
  }
  hooks.post_forward(mf);
}

LmHeadChunks Gpt2Model::head_chunks(int64_t BT, ModuleHooks& hooks) const {
  const int64_t C = cfg_.n_embd, Vp = cfg_.padded_vocab();
  return {acts_->lnf.view({BT, C}), hooks.param(kWte), acts_->targets_dev.view({BT}),
          acts_->logits.view(), BT, C, cfg_.vocab_size, Vp, cfg_.fused_lce.chunk_for(BT, C, Vp)};
}

TensorView Gpt2Model::last_logits() const {
  if (cfg_.fused_lce.enabled) throw fused_logits_error();
  if (!acts_ || last_rows_ == 0) return {};
  return acts_->logits.view({last_rows_, cfg_.padded_vocab()});
}

// Block l: res[l] [BT,C] -> res[l+1] = res2 + mlp(ln_2(res2)), res2 = res[l] + attn(ln_1(res[l])),
// saving the internals backward reads into a.layer(l). The recompute under activation
// checkpointing passes write_output = false: res[l+1] is already there, and backward does not
// read it.
void Gpt2Model::block_forward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                              bool write_output) {
  Acts& a = *acts_;
  const int64_t BT = B * T, C = cfg_.n_embd, H = cfg_.n_head;
  const float eps = static_cast<float>(cfg_.layer_norm_epsilon);
  auto rows = [&](const DeviceBuffer& b, int64_t width) { return b.view({BT, width}); };
  const int p0 = static_cast<int>(2 + kBlockParams * l);
  auto W = [&](int k) { return hooks.param(p0 + k); };
  auto& ly = a.layer(l);
  const TensorView x = rows(a.res[l], C);  // [BT,C]
  // ln_1's and ln_2's outputs in the dln scratch (Acts::dln), each read by the GEMM after it
  const TensorView ln1 = rows(a.dln, C), qkv = rows(ly.qkv, 3 * C), atty = rows(ly.atty, C);
  const TensorView res2 = rows(ly.res2, C), ln2 = rows(a.dln, C);
  const TensorView fc = rows(ly.fc, 4 * C), gelu = rows(a.dfc, 4 * C);  // Acts::dfc
  be_.layernorm_forward(ln1, ly.ln1_mean.view({BT}), ly.ln1_rstd.view({BT}), x, W(kLn1W),
                        W(kLn1B), BT, C, eps);
  // qkv [BT,3C] = ln1 [BT,C] @ c_attn.weight[3C,C]^T + bias (the bias in the GEMM's epilogue)
  be_.gemm_bias(false, true, BT, 3 * C, C, ln1, W(kAttnW), W(kAttnB), qkv);
  be_.attention_forward(atty, ly.lse.view({B, H, T}), qkv, B, T, C, H, doc_start(BT));
  // res2 [BT,C] = x + atty @ c_proj.weight[C,C]^T + bias
  // ln2 = LayerNorm(res2), in the same pass as the bias and the residual
  be_.gemm(false, true, BT, C, C, 1.f, atty, W(kAttnProjW), 0.f, res2);
  be_.add_layernorm_forward(res2, ln2, ly.ln2_mean.view({BT}), ly.ln2_rstd.view({BT}), x,
                            W(kAttnProjB), W(kLn2W), W(kLn2B), BT, C, eps);
  // fc [BT,4C] = ln2 @ c_fc.weight[4C,C]^T + bias; gelu = GELU_tanh(fc): bias and GELU in
  // the GEMM's epilogue (gemm_bias_gelu), fc kept for the backward
  be_.gemm_bias_gelu(false, true, BT, 4 * C, C, ln2, W(kFcW), W(kFcB), fc, gelu);
  if (!write_output) return;
  // res[l+1] [BT,C] = res2 + gelu @ mlp.c_proj.weight[C,4C]^T + bias
  const TensorView y = rows(a.res[l + 1], C);
  be_.gemm(false, true, BT, C, 4 * C, 1.f, gelu, W(kMlpProjW), 0.f, y);
  be_.add_bias_residual(y, W(kMlpProjB), res2, BT, C);
}

void Gpt2Model::backward(int64_t B, int64_t T, ModuleHooks& hooks, float grad_scale,
                         const TensorView& loss) {
  Acts& a = *acts_;
  const int64_t BT = B * T, C = cfg_.n_embd, H = cfg_.n_head, Vp = cfg_.padded_vocab();
  const int64_t L = cfg_.n_layer;
  const float eps = static_cast<float>(cfg_.layer_norm_epsilon);
  auto rows = [&](const DeviceBuffer& b, int64_t width) { return b.view({BT, width}); };
  const TensorView tokens = a.tokens_dev.view({B, T});
  const TensorView dres = rows(a.dres, C);  // gradient of the residual stream, [BT,C]
  const TensorView dln = rows(a.dln, C);    // [BT,C] scratch
  const TensorView dfc = rows(a.dfc, 4 * C), dqkv = rows(a.dqkv, 3 * C);

  // LM head and ln_f. a.logits holds dlogits [BT,Vp] after the fused cross-entropy, 0 in the
  // padding columns: the pad rows of wte get a zero gradient and add nothing to dln. Chunked
  // (model.fused_linear_cross_entropy): the head's forward, loss and backward, chunk by chunk.
  const int mf = static_cast<int>(L + 1);
  const int pf = static_cast<int>(2 + kBlockParams * L);
  hooks.pre_backward(mf);
  if (cfg_.fused_lce.enabled) {
    lm_head_chunks_backward(be_, head_chunks(BT, hooks), grad_scale, loss, hooks.grad(kWte), dln);
  } else {
    const TensorView dlogits = rows(a.logits, Vp);
    be_.gemm(true, false, Vp, C, BT, 1.f, dlogits, rows(a.lnf, C), 1.f, hooks.grad(kWte));
    be_.gemm(false, false, BT, C, Vp, 1.f, dlogits, hooks.param(kWte), 0.f, dln);
  }
  rt_.fill_zero(dres);
  be_.layernorm_backward(dres, hooks.grad(pf), hooks.grad(pf + 1), dln, rows(a.res[L], C),
                         hooks.param(pf), a.lnf_mean.view({BT}), a.lnf_rstd.view({BT}), BT, C);
  hooks.post_backward(mf);

  for (int64_t l = L - 1; l >= 0; --l) {
    const int m = static_cast<int>(1 + l);
    const int p0 = static_cast<int>(2 + kBlockParams * l);
    auto W = [&](int k) { return hooks.param(p0 + k); };
    auto G = [&](int k) { return hooks.grad(p0 + k); };
    auto& ly = a.layer(l);
    hooks.pre_backward(m);
    // Activation checkpointing: recompute this block's internals from res[l] with the
    // parameters pre_backward has just gathered (no pre/post_forward: not a forward pass).
    const bool recompute = checkpointing_.recomputes(l);
    if (recompute) block_forward(l, B, T, hooks, /*write_output=*/false);
    // dres = d res[l+1]. MLP c_proj: out = gelu @ W^T + b; gelu = GELU(fc) into dfc (the
    // checkpointing recompute has just put it there).
    if (!recompute) be_.gelu_forward(dfc, rows(ly.fc, 4 * C));
    // (each weight gradient with its bias gradient, and d fc with GELU' and the c_fc bias
    // gradient, in the GEMM's epilogue where the backend has one: kernels.hpp)
    be_.gemm_weight_bias_grad(false, C, 4 * C, BT, dres, dfc, G(kMlpProjW), G(kMlpProjB));
    be_.gemm_dgelu_bias_grad(false, false, BT, 4 * C, C, dres, W(kMlpProjW),
                             rows(ly.fc, 4 * C), dfc, G(kFcB));  // d fc (over gelu), d bias
    // ln_2's output again (Acts::dln), for c_fc's weight gradient; the checkpointing
    // recompute has left it there
    if (!recompute) {
      be_.layernorm_forward(dln, ly.ln2_mean.view({BT}), ly.ln2_rstd.view({BT}),
                            rows(ly.res2, C), W(kLn2W), W(kLn2B), BT, C, eps);
    }
    be_.gemm(true, false, 4 * C, C, BT, 1.f, dfc, dln, 1.f, G(kFcW));
    be_.gemm(false, false, BT, C, 4 * C, 1.f, dfc, W(kFcW), 0.f, dln);       // d ln2
    // residual: dres (= d res2 after this) += LN2 backward
    be_.layernorm_backward(dres, G(kLn2W), G(kLn2B), dln, rows(ly.res2, C), W(kLn2W),
                           ly.ln2_mean.view({BT}), ly.ln2_rstd.view({BT}), BT, C);
    // attention c_proj: res2 = x + atty @ W^T + b
    be_.gemm_weight_bias_grad(false, C, C, BT, dres, rows(ly.atty, C), G(kAttnProjW),
                              G(kAttnProjB));
    be_.gemm(false, false, BT, C, C, 1.f, dres, W(kAttnProjW), 0.f, dln);     // d atty
    be_.attention_backward(dqkv, dln, rows(ly.qkv, 3 * C), rows(ly.atty, C),
                           ly.lse.view({B, H, T}), B, T, C, H, doc_start(BT));
    // ln_1's output again (Acts::dln, free after attention_backward), for c_attn's gradients
    be_.layernorm_forward(dln, ly.ln1_mean.view({BT}), ly.ln1_rstd.view({BT}), rows(a.res[l], C),
                          W(kLn1W), W(kLn1B), BT, C, eps);
    be_.gemm_weight_bias_grad(false, 3 * C, C, BT, dqkv, dln, G(kAttnW), G(kAttnB));
    be_.gemm(false, false, BT, C, 3 * C, 1.f, dqkv, W(kAttnW), 0.f, dln);     // d ln1
    be_.layernorm_backward(dres, G(kLn1W), G(kLn1B), dln, rows(a.res[l], C), W(kLn1W),
                           ly.ln1_mean.view({BT}), ly.ln1_rstd.view({BT}), BT, C);  // dres = d res[l]
    hooks.post_backward(m);
  }

  hooks.pre_backward(0);
  if (document_masking().reset_positions) {
    be_.embedding_lookup_backward(hooks.grad(kWte), dres, tokens.reshape({BT}), BT, C);
    be_.embedding_lookup_backward(hooks.grad(kWpe), dres, a.doc_pos.view({BT}), BT, C);
  } else {
    be_.embedding_backward(hooks.grad(kWte), hooks.grad(kWpe), dres, tokens, B, T, C);
  }
  hooks.post_backward(0);
}

}  // namespace fsdp

// ---- the "gpt2" model family (registry entry) ----
namespace fsdp {
namespace {

// GPT2Config's attributes fsdp_train trains (defaults: a small byte-level model for CPU runs).
const ModelArgs<Gpt2Config>& gpt2_args() {
  using A = ModelArg<Gpt2Config>;
  static const ModelArgs<Gpt2Config> args({
      A{"n_layer", &Gpt2Config::n_layer, "Number of transformer blocks.", KeyRange::layers()},
      A{"n_head", &Gpt2Config::n_head, "Attention heads per block.", KeyRange::size(1)},
      A{"n_embd", &Gpt2Config::n_embd, "Hidden size.", KeyRange::size(1)},
      A{"n_positions", &Gpt2Config::n_positions,
        "Longest sequence: rows of the learned position table.", KeyRange::size(1)},
      A{"vocab_size", &Gpt2Config::vocab_size, "Token vocabulary.", KeyRange::size(1)},
      A{"layer_norm_epsilon", &Gpt2Config::layer_norm_epsilon, "LayerNorm epsilon.",
        KeyRange::above(0), {}, true, 1e-5},
  });
  return args;
}

class Gpt2Family final : public ModelFamily {
 public:
  std::string type() const override { return "gpt2"; }
  std::vector<ModelKey> keys() const override { return gpt2_args().keys(); }
  std::string hf_config_class() const override { return "GPT2Config"; }
  std::vector<std::string> wrap_classes() const override { return {"GPT2Block"}; }
  std::vector<Objective> objectives() const override { return {Objective::causal_lm, Objective::sft}; }
  // The ranges are the rows'; what is left relates keys.
  void validate(const Config& c, const KeyFail& fail) const override {
    const Gpt2Config g = Gpt2Config::from(c.model);
    const auto& a = gpt2_args();
    if (g.n_embd % g.n_head != 0) {
      throw fail(a.key(&Gpt2Config::n_embd), std::to_string(g.n_embd) + " is not divisible by " +
                                                 a.key(&Gpt2Config::n_head) + " = " +
                                                 std::to_string(g.n_head));
    }
    if (c.data.seq_len > g.n_positions) {
      throw fail("data.seq_len", std::to_string(c.data.seq_len) + " exceeds " +
                                     a.key(&Gpt2Config::n_positions) + " = " +
                                     std::to_string(g.n_positions) +
                                     " (expected 1 <= seq_len <= n_positions)");
    }
    check_recompute_num_layers(c, g.n_layer, fail);
    check_router_bias_update(c, false, fail);
  }
  std::vector<ModuleDecl> modules(const ModelConfig& c) const override {
    return gpt2_modules(Gpt2Config::from(c));
  }
  std::unique_ptr<Model> create(const ModelConfig& c, Kernels& kernels, DType act,
                                ActivationCheckpointing checkpointing) const override {
    return std::make_unique<Gpt2Model>(Gpt2Config::from(c), kernels, act, checkpointing);
  }
  int64_t activation_bytes(const ModelConfig& c, int64_t rows, const data::BatchShape& shape,
                           DType act, ActivationCheckpointing checkpointing) const override {
    return Gpt2Model::activation_bytes(Gpt2Config::from(c), rows, shape.L, act, checkpointing,
                                       {shape.block_causal, shape.reset_position_ids});
  }
  int64_t vocab_size(const ModelConfig& c) const override { return Gpt2Config::from(c).vocab_size; }
  // Per token: c_attn 3C^2 + attn.c_proj C^2 + mlp 8C^2 per layer and the tied LM head V C
  // multiply-adds; attention T C each for Q K^T and P V per layer. V is the model's own
  // vocabulary: the padding rows' (model.pad_vocab_multiple) multiply-adds are not model FLOPs.
  double train_flops_per_sample(const ModelConfig& c, const data::BatchShape& shape) const override {
    const Gpt2Config g = Gpt2Config::from(c);
    const double T = static_cast<double>(shape.L), C = static_cast<double>(g.n_embd),
                 L = static_cast<double>(g.n_layer), V = static_cast<double>(g.vocab_size);
    const double macs = T * (12.0 * L * C * C + V * C) + L * 2.0 * T * T * C;
    return 6.0 * macs;
  }
  // GPT2LMHeadModel: every name gets the "transformer." prefix; the 2-D weights of
  // attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj are transposed (HF's Conv1D stores
  // [in, out]); wte/wpe, LayerNorms and biases are as they are. lm_head.weight is tied to wte
  // (HF ties it on load), so it is not a parameter of ours.
  // Any block index maps (a name does not depend on the configured n_layer): the top-level
  // names and a block's suffixes are those gpt2_modules declares for one block.
  std::optional<HfTensor> hf_tensor(const ModelConfig&, const std::string& name,
                                    const std::vector<int64_t>& shape) const override {
    struct Names {
      std::vector<std::string> top_level, block, conv1d;  // conv1d: a block's 2-D weights
    };
    static const Names names = [] {
      Gpt2Config one;
      one.n_layer = 1;
      Names n;
      for (const ModuleDecl& m : gpt2_modules(one)) {
        for (const ParamSpec& p : m.params) {
          if (m.cls != "GPT2Block") {
            n.top_level.push_back(p.name);
            continue;
          }
          n.block.push_back(p.name.substr(m.name.size() + 1));
          if (p.shape.size() == 2) n.conv1d.push_back(n.block.back());
        }
      }
      return n;
    }();
    auto in = [](const std::vector<std::string>& v, const std::string& x) {
      return std::find(v.begin(), v.end(), x) != v.end();
    };
    HfTensor t{"transformer." + name, shape, false};
    if (in(names.top_level, name)) return t;
    if (name.rfind("h.", 0) != 0) return std::nullopt;  // "h.<i>.<suffix>"
    std::size_t i = 2;
    while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
    if (i == 2 || i >= name.size() || name[i] != '.') return std::nullopt;
    const std::string suffix = name.substr(i + 1);
    if (!in(names.block, suffix)) return std::nullopt;
    // The Conv1D weights: a block's 2-D tensors (HF stores them [in, out]).
    if (in(names.conv1d, suffix) && shape.size() == 2) {
      t.shape = {shape[1], shape[0]};
      t.transpose = true;
    }
    return t;
  }
  // Checkpoints on the Hub (openai-community/gpt2) store the GPT2Model names without the
  // "transformer." prefix.
  std::vector<std::string> hf_aliases(const std::string& hf_name) const override {
    const std::string prefix = "transformer.";
    if (hf_name.rfind(prefix, 0) == 0) return {hf_name.substr(prefix.size())};
    return {};
  }
  nlohmann::json hf_config(const ModelConfig& c) const override {
    const Gpt2Config g = Gpt2Config::from(c);
    nlohmann::json out = gpt2_args().to_hf(g);
    out["architectures"] = {"GPT2LMHeadModel"};
    out["model_type"] = "gpt2";
    out["n_ctx"] = g.n_positions;
    out["n_inner"] = nullptr;
    out["activation_function"] = "gelu_new";
    out["resid_pdrop"] = 0.0;
    out["embd_pdrop"] = 0.0;
    out["attn_pdrop"] = 0.0;
    out["initializer_range"] = 0.02;
    out["bos_token_id"] = g.vocab_size - 1;  // GPT-2 convention (<|endoftext|> = last id); byte
    out["eos_token_id"] = g.vocab_size - 1;  // vocabularies have no special token: nominal
    out["tie_word_embeddings"] = true;
    out["torch_dtype"] = "float32";
    return out;
  }
  // GPT2Config attributes that change the math must describe the model fsdp_train implements
  // (any equivalent spelling accepted); the rest (dropouts, token ids, n_ctx) do not matter
  // for training from the weights.
  ModelConfig from_hf_config(const nlohmann::json& hf, const std::string& origin) const override {
    if (hf.value("model_type", std::string()) != "gpt2") {
      throw InputError(origin + ": \"model_type\" is not \"gpt2\"");
    }
    const Gpt2Config g = gpt2_args().from_hf(hf, origin, Gpt2Config{});
    auto refuse = [&](const char* field, const std::string& expected) {
      return InputError(origin + ": \"" + field + "\" " + hf[field].dump() +
                        " is not supported (expected " + expected + ")");
    };
    if (hf.contains("n_inner") && !hf["n_inner"].is_null() &&
        hf["n_inner"] != nlohmann::json(4 * g.n_embd)) {
      throw refuse("n_inner", "null or 4 * n_embd = " + std::to_string(4 * g.n_embd));
    }
    if (hf.contains("activation_function") && hf["activation_function"] != "gelu_new" &&
        hf["activation_function"] != "gelu_pytorch_tanh") {
      throw refuse("activation_function", "\"gelu_new\" or \"gelu_pytorch_tanh\"");
    }
    if (hf.contains("tie_word_embeddings") && hf["tie_word_embeddings"] != true) {
      throw refuse("tie_word_embeddings", "true");
    }
    if (hf.contains("scale_attn_weights") && hf["scale_attn_weights"] != true) {
      throw refuse("scale_attn_weights", "true");
    }
    for (const char* f : {"scale_attn_by_inverse_layer_idx", "add_cross_attention"}) {
      if (hf.contains(f) && hf[f] != false) throw refuse(f, "false");
    }
    ModelConfig c = model_defaults("gpt2");
    gpt2_args().write(g, &c);
    return c;
  }
};

}  // namespace

Gpt2Config Gpt2Config::from(const ModelConfig& c) {
  Gpt2Config g = gpt2_args().read(c);
  g.pad_vocab_multiple = c.pad_vocab_multiple;
  g.fused_lce = FusedLinearCrossEntropy::from(c);
  return g;
}

const ModelFamily& gpt2_family() {
  static const Gpt2Family family;
  return family;
}

}  // namespace fsdp
