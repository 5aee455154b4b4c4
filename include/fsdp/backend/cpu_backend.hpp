// fsdp/backend/cpu_backend.hpp: the CPU backend (fp32, OpenBLAS GEMMs, OpenMP loops).
// The numerical reference the CUDA backend is tested against, and what CI runs.
#pragma once

#include <memory>

#include "fsdp/backend/backend.hpp"

namespace fsdp {

// num_threads: threads of the backend's one OpenMP pool (>= 1; OpenBLAS runs single-threaded
// inside its regions). Cores are not bound here: the Runtime binds them first
// (setup_cpu_threads, fsdp/backend/cpu_threads.hpp). Throws fsdp::Error if num_threads < 1.
std::unique_ptr<Backend> make_cpu_backend(int num_threads);

}  // namespace fsdp
