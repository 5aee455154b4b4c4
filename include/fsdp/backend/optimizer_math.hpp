// fsdp/backend/optimizer_math.hpp: the optimizers' arithmetic, written once for both backends
// (the CPU backend's loops in cpu_kernels.cpp and the CUDA kernels in kernels_optim.cu include
// it), so that a shard updated on the host (fsdp.cpu_offload / offload_optimizer) and the same
// shard updated on the device agree bit for bit:
//  - AdamW's per-step scalars (adamw_coefficients), computed on the host in double as
//    torch.optim does;
//  - one element of AdamW and of SGD (adamw_element, sgd_element), each multiply-add written
//    as an explicit fmaf. A compiler contracts `a * b + c` into an FMA where it likes (nvcc
//    and GCC at -march=x86-64-v3 both do, each picking its own products), so the two backends'
//    last bits differed wherever it was left to them (issue 31: the offloaded optimizer vs the
//    device one on an H100). sqrtf and the division are correctly rounded on both (nvcc's
//    default -prec-sqrt=true -prec-div=true; no --use_fast_math in this project).
//
// torch.optim.AdamW (PyTorch 2.x, foreach=False, as its fused path computes the scalars): from
// the Python floats in double precision, p.mul_(1 - lr wd); m.mul_(b1).add_(g, alpha=1-b1);
// v.mul_(b2).addcmul_(g, g, value=1-b2); denom = (v.sqrt() / sqrt(bc2)).add_(eps);
// p.addcdiv_(m, denom, value=-lr/bc1), with bc1 = 1 - b1^step, bc2 = 1 - b2^step. Here the
// weight decay's multiply and the step's add are one FMA (torch rounds p * (1 - lr wd) first):
// within an ulp of torch per step (tests/test_device_runtime.cpp: AdamWMatchesTorch).
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <system_error>

#if defined(__CUDACC__)
#define FSDP_HOST_DEVICE __host__ __device__
#else
#define FSDP_HOST_DEVICE
#endif

namespace fsdp {

// The decimal a float hyperparameter was most likely written as (the shortest decimal that
// rounds to it, e.g. 0.999f -> 0.999), as a double. torch.optim computes 1 - beta2,
// 1 - lr * wd and the bias corrections in double from the Python floats; doing the same from
// the decimal value makes e.g. 1 - beta2 = 0.001 rather than 1 - 0.999f = 0.00099998713.
// Never further from the float than half its ulp.
inline double decimal_value(float f) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, f);
  double d = static_cast<double>(f);
  if (res.ec == std::errc()) std::from_chars(buf, res.ptr, d);
  return d;
}

// AdamW's scalars for one step (passed by value to the CUDA kernel).
struct AdamWCoefficients {
  float decay;          // 1 - lr * weight_decay (the elements that take decay; 1 for the others)
  float neg_step_size;  // -lr / (1 - beta1^step)
  float bc2_sqrt;       // sqrt(1 - beta2^step)
  float beta1, beta2;
  float one_m_b1;       // 1 - beta1
  float one_m_b2;       // 1 - beta2
  float eps;
};

// AdamW's scalars for 1-based `step` (>= 1: the caller checks and names itself in the error).
inline AdamWCoefficients adamw_coefficients(float lr, float beta1, float beta2, float eps,
                                            float weight_decay, int64_t step) {
  const double lr_d = decimal_value(lr), b1 = decimal_value(beta1), b2 = decimal_value(beta2);
  const double wd = decimal_value(weight_decay);
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  return {static_cast<float>(1.0 - lr_d * wd), static_cast<float>(-lr_d / bc1),
          static_cast<float>(std::sqrt(bc2)), beta1, beta2, static_cast<float>(1.0 - b1),
          static_cast<float>(1.0 - b2), eps};
}

// One element of AdamW: p, m, v (fp32) updated in place from the gradient g; decay is
// c.decay where the element takes weight decay, else exactly 1 (then fmaf(p, 1, s) is p + s,
// correctly rounded).
FSDP_HOST_DEVICE inline void adamw_element(float& p, float g, float& m, float& v, float decay,
                                           const AdamWCoefficients& c) {
  m = fmaf(c.one_m_b1, g, c.beta1 * m);
  v = fmaf(c.one_m_b2 * g, g, c.beta2 * v);
  const float denom = sqrtf(v) / c.bc2_sqrt + c.eps;
  p = fmaf(p, decay, c.neg_step_size * m / denom);
}

// One element of SGD (torch.optim.SGD, dampening 0, nesterov off): d = g + wd p;
// with momentum, buf = d at the first step, else momentum buf + d, and d = buf; p -= lr d.
// wd is 0 for elements that take no weight decay; buf is not touched without momentum.
FSDP_HOST_DEVICE inline void sgd_element(float& p, float g, float& buf, float lr, float momentum,
                                         float wd, bool first, bool use_buf) {
  float d = fmaf(wd, p, g);
  if (use_buf) {
    d = first ? d : fmaf(momentum, buf, d);
    buf = d;
  }
  p = fmaf(-lr, d, p);
}

}  // namespace fsdp
