// The decoder-only families' shared entry points (see fsdp/model/causal_lm.hpp).
#include "fsdp/model/causal_lm.hpp"

#include <algorithm>
#include <string>

#include "fsdp/backend/kernels.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {
void require_causal(const data::Batch& batch, const char* family) {
  if (batch.target_len != batch.L) {
    throw Error(std::string(family) + ": a causal-LM batch has target_len == L");
  }
}
// Rows [r0, r0 + n) of a contiguous [R, width] view.
TensorView row_block(const TensorView& v, int64_t r0, int64_t n, int64_t width) {
  return v.slice(r0 * width, n * width).reshape({n, width});
}
void check_chunks(const LmHeadChunks& h, const char* what) {
  if (h.R > 0 && (h.chunk <= 0 || h.chunk * h.Vp > h.scratch.numel())) {
    throw Error(std::string(what) + ": " + std::to_string(h.chunk) + " rows of " +
                std::to_string(h.Vp) + " logits do not fit the scratch of " +
                std::to_string(h.scratch.numel()) + " elements");
  }
}
}  // namespace

int64_t FusedLinearCrossEntropy::chunk_for(int64_t rows, int64_t hidden,
                                           int64_t padded_vocab) const {
  if (rows <= 0) return 0;
  int64_t chunk = chunk_rows;
  if (chunk <= 0) {
    const int64_t factor = std::max<int64_t>(1, (padded_vocab + hidden - 1) / std::max<int64_t>(hidden, 1));
    const int64_t want = (rows + factor - 1) / factor;
    chunk = 1;
    while (chunk < want) chunk *= 2;
    chunk = std::max(chunk, kMinAutoChunkRows);
  }
  return std::min(chunk, rows);
}

void lm_head_chunks_backward(Kernels& be, const LmHeadChunks& h, float grad_scale,
                             const TensorView& loss, const TensorView& dweight,
                             const TensorView& dx) {
  check_chunks(h, "lm_head_chunks_backward");
  for (int64_t r0 = 0; r0 < h.R; r0 += h.chunk) {
    const int64_t n = std::min(h.chunk, h.R - r0);
    const TensorView x = row_block(h.x, r0, n, h.C), logits = row_block(h.scratch, 0, n, h.Vp);
    be.gemm(false, true, n, h.Vp, h.C, h.logit_scale, x, h.weight, 0.f, logits);
    be.cross_entropy_forward_backward(loss, logits, h.targets.slice(r0, n), n, h.V, h.Vp,
                                      grad_scale, h.softcap);
    be.gemm(true, false, h.Vp, h.C, n, h.logit_scale, logits, x, 1.f, dweight);
    be.gemm(false, false, n, h.C, h.Vp, h.logit_scale, logits, h.weight, 0.f,
            row_block(dx, r0, n, h.C));
  }
}

void lm_head_chunks_loss(Kernels& be, const LmHeadChunks& h, const TensorView& loss) {
  check_chunks(h, "lm_head_chunks_loss");
  for (int64_t r0 = 0; r0 < h.R; r0 += h.chunk) {
    const int64_t n = std::min(h.chunk, h.R - r0);
    const TensorView logits = row_block(h.scratch, 0, n, h.Vp);
    be.gemm(false, true, n, h.Vp, h.C, h.logit_scale, row_block(h.x, r0, n, h.C), h.weight, 0.f,
            logits);
    be.cross_entropy_forward(loss, logits, h.targets.slice(r0, n), n, h.V, h.Vp, h.softcap);
  }
}

std::vector<int32_t> document_starts(const int32_t* positions, int64_t B, int64_t T,
                                     const char* family) {
  std::vector<int32_t> start(static_cast<std::size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = b * T + t, p = positions[i];
      if (!(p == 0 || (t > 0 && p == positions[i - 1] + 1))) {
        throw Error(std::string(family) + ": position_ids[" + std::to_string(b) + ", " +
                    std::to_string(t) + "] = " + std::to_string(p) +
                    " (expected 0, or the previous position + 1)");
      }
      start[static_cast<std::size_t>(i)] = static_cast<int32_t>(t - p);
    }
  }
  return start;
}

std::vector<int32_t> CausalLm::upload_documents(DeviceRuntime& rt, DeviceBuffer& positions,
                                                DeviceBuffer& starts, int64_t B, int64_t T,
                                                int64_t capacity) const {
  std::vector<int32_t> start = document_starts(docs_.positions, B, T, family_name());
  if (!starts) {
    positions = DeviceBuffer(rt, DType::i32, capacity, MemCategory::activations);
    starts = DeviceBuffer(rt, DType::i32, capacity, MemCategory::activations);
  }
  rt.copy_from_host(positions.view({B * T}), docs_.positions);
  rt.copy_from_host(starts.view({B * T}), start.data());
  return start;
}

Error CausalLm::fused_logits_error() const {
  return Error(std::string(family_name()) +
               ": last_logits() is unavailable with model.fused_linear_cross_entropy = true (the "
               "LM head keeps no [tokens, vocabulary] logits; set it to false to read them)");
}

void CausalLm::set_documents(const Documents& docs) {
  if (docs.positions && !supports_documents()) {
    throw Error(std::string(family_name()) +
                ": document masking (data.attn_mask_type = \"block_causal\") is not supported "
                "by this model family");
  }
  docs_ = docs;
}

void CausalLm::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                int64_t T, float grad_scale, ModuleHooks& hooks,
                                const TensorView& loss, const Documents& docs) {
  set_documents(docs);
  forward(tokens, targets, B, T, hooks, true, grad_scale, loss);
  backward(B, T, hooks, grad_scale, loss);
  docs_ = {};
}

void CausalLm::forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                            ModuleHooks& hooks, const TensorView& loss, const Documents& docs) {
  set_documents(docs);
  forward(tokens, targets, B, T, hooks, false, 1.f, loss);
  docs_ = {};
}

namespace {
Documents documents_of(const data::Batch& batch) {
  if (batch.position_ids.empty()) return {};
  if (static_cast<int64_t>(batch.position_ids.size()) != batch.B * batch.L) {
    throw Error("a batch's position_ids have " + std::to_string(batch.position_ids.size()) +
                " entries for " + std::to_string(batch.B) + " rows of " +
                std::to_string(batch.L) + " tokens");
  }
  return {batch.position_ids.data(), batch.reset_position_ids};
}
}  // namespace

void CausalLm::forward_backward(const data::Batch& batch, float grad_scale, ModuleHooks& hooks,
                                const TensorView& loss) {
  require_causal(batch, family_name());
  forward_backward(batch.inputs.data(), batch.targets.data(), batch.B, batch.L, grad_scale, hooks,
                   loss, documents_of(batch));
}

void CausalLm::forward_loss(const data::Batch& batch, ModuleHooks& hooks, const TensorView& loss) {
  require_causal(batch, family_name());
  forward_loss(batch.inputs.data(), batch.targets.data(), batch.B, batch.L, hooks, loss,
               documents_of(batch));
}

}  // namespace fsdp
