// fsdp/backend/cpu_backend.hpp: the CPU backend (fp32, OpenBLAS GEMMs, OpenMP loops).
// The numerical reference the CUDA backend is tested against, and what CI runs.
#pragma once

#include <memory>

#include "fsdp/backend/backend.hpp"

namespace fsdp {

// num_threads: threads for OpenBLAS and the OpenMP loops of this process (>= 1).
std::unique_ptr<Backend> make_cpu_backend(int num_threads);

}  // namespace fsdp
