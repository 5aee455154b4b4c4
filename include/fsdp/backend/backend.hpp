// fsdp/backend/backend.hpp: a complete backend, a device runtime and the model kernels on
// it in one object (fsdp/backend/device_runtime.hpp, fsdp/backend/kernels.hpp). The CPU
// backend (fsdp/backend/cpu_backend.hpp, the numerical reference) and the CUDA backend
// (fsdp/cuda/cuda_backend.hpp) implement it; the Runtime (fsdp/train/runtime.hpp) owns one.
// Code takes the narrowest part it uses: the FSDP engine, optimizers and DeviceBuffer a
// DeviceRuntime&, models a Kernels&.
#pragma once

#include "fsdp/backend/device_runtime.hpp"
#include "fsdp/backend/kernels.hpp"

namespace fsdp {

class Backend : public DeviceRuntime, public Kernels {
 public:
  DeviceRuntime& runtime() final { return *this; }
};

}  // namespace fsdp
