// fsdp/train/profiling.hpp: the trainer's side of the profiler (train.profile_steps,
// fsdp_train --profile; fsdp/core/profiler.hpp): which Profiler a job gets and where and how
// its trace is written.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "fsdp/backend/device_runtime.hpp"
#include "fsdp/comm/communicator.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/core/profiler.hpp"

namespace fsdp {

// RUN_DIR/profile/rank_<rank>.trace.json: rank `rank`'s trace.
std::string profile_trace_path(const std::string& run_dir, int rank);

// The profiler of rank `rank` of a job (null when train.profile_steps is empty: profiling
// costs nothing then). On the CUDA backend it collects the device's kernels, memcpys and
// memsets with CUPTI (fsdp/cuda/cupti_collector.hpp); on the CPU backend host ranges only.
// Creates RUN_DIR/profile/ and proves it writable; throws InputError naming
// train.profile_steps and the directory if it cannot.
std::unique_ptr<Profiler> make_profiler(const Config& config, DeviceRuntime& backend, int rank);

// Writes `profiler`'s trace on every rank of `group` (collective) unless it was written
// already, and gives `log` one line for rank 0's output: "profile: steps 2-3 traced into
// RUN_DIR/profile/rank_*.trace.json", or, when no step of the window ran, "profile: no step
// of train.profile_steps = [8, 9] ran (the run ended at step 5); no trace written" ("(this
// run resumed at step 10 and ran steps 11-20)" for a window before a resumed run's start).
// A rank whose write fails (a full disk) prints a warning to stderr and the run goes on: the
// trace is a diagnostic.
// make_profiler: an unwritable RUN_DIR/profile/ is an InputError naming train.profile_steps.
void write_profile(Profiler& profiler, Communicator& group, const std::string& run_dir,
                   int64_t final_step, const std::function<void(const std::string&)>& log);

}  // namespace fsdp
