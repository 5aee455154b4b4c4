// fsdp/backend/adamw_coefficients.hpp: the per-step scalars of AdamW, computed once for both
// backends' update kernels (cpu_kernels.cpp, cuda_backend.cpp) so that they agree bit for bit.
//
// torch.optim.AdamW (PyTorch 2.x, foreach=False, as its fused path computes them): from the
// Python floats in double precision, p.mul_(1 - lr wd); m.mul_(b1).add_(g, alpha=1-b1);
// v.mul_(b2).addcmul_(g, g, value=1-b2); denom = (v.sqrt() / sqrt(bc2)).add_(eps);
// p.addcdiv_(m, denom, value=-lr/bc1), with bc1 = 1 - b1^step, bc2 = 1 - b2^step.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <system_error>

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

// AdamW's scalars for 1-based `step` (>= 1: the caller checks and names itself in the error).
struct AdamWCoefficients {
  float decay;          // 1 - lr * weight_decay
  float neg_step_size;  // -lr / (1 - beta1^step)
  float bc2_sqrt;       // sqrt(1 - beta2^step)
  float one_m_b1;       // 1 - beta1
  float one_m_b2;       // 1 - beta2
};
inline AdamWCoefficients adamw_coefficients(float lr, float beta1, float beta2,
                                            float weight_decay, int64_t step) {
  const double lr_d = decimal_value(lr), b1 = decimal_value(beta1), b2 = decimal_value(beta2);
  const double wd = decimal_value(weight_decay);
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  return {static_cast<float>(1.0 - lr_d * wd), static_cast<float>(-lr_d / bc1),
          static_cast<float>(std::sqrt(bc2)), static_cast<float>(1.0 - b1),
          static_cast<float>(1.0 - b2)};
}

}  // namespace fsdp
