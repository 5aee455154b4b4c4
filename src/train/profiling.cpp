// The trainer's side of the profiler (see fsdp/train/profiling.hpp).
#include "fsdp/train/profiling.hpp"

#include <filesystem>

#include "fsdp/core/error.hpp"
#include "fsdp/train/collective_guard.hpp"
#include "fsdp/train/run_dir.hpp"

#ifdef FSDP_WITH_CUDA
#include "fsdp/cuda/cupti_collector.hpp"
#endif

namespace fsdp {

std::string profile_trace_path(const std::string& run_dir, int rank) {
  return (std::filesystem::path(run_dir) / "profile" / ("rank_" + std::to_string(rank) + ".trace.json"))
      .string();
}

std::unique_ptr<Profiler> make_profiler(const Config& config, DeviceRuntime& backend, int rank) {
  const auto& window = config.train.profile_steps;
  if (window.empty()) return nullptr;
  const std::string path = profile_trace_path(config.train.run_dir, rank);
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw InputError("train.profile_steps: cannot create the profile directory " + dir.string() +
                     ": " + ec.message());
  }
  // As checkpoints/: an unwritable profile/ stops the run at start-up, not at the window.
  probe_writable(dir.string(), "train.profile_steps");
  std::unique_ptr<ActivityCollector> device;
#ifdef FSDP_WITH_CUDA
  if (backend.device() == Device::cuda) device = cuda::make_cupti_collector();
#endif
  return std::make_unique<Profiler>(window[0], window[1], rank, path, std::move(device));
}

void write_profile(Profiler& profiler, Communicator& group, const std::string& run_dir,
                   int64_t final_step, const std::function<void(const std::string&)>& log) {
  if (profiler.written()) return;
  // A trace that cannot be written (a full disk, a directory removed under the run) is a
  // warning on the rank it happens to: the trace is a diagnostic, never worth the run.
  bool wrote = false;
  std::string failure;
  collective_guard(group, [&] {
    try {
      wrote = profiler.write();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) {
    write_line(2, "warning: rank " + std::to_string(group.rank()) + ": profile: trace not written (" +
                      failure + "); training goes on");
    return;
  }
  const std::string window = std::to_string(profiler.first()) + "-" + std::to_string(profiler.last());
  if (wrote) {
    const int64_t size = profiler.last() - profiler.first() + 1;
    const std::string what = profiler.steps_recorded() == size
                                 ? "steps " + window
                                 : std::to_string(profiler.steps_recorded()) + " of steps " + window;
    log("profile: " + what + " traced into " +
        (std::filesystem::path(run_dir) / "profile" / "rank_*.trace.json").string() +
        (final_step < profiler.last() ? " (the run ended at step " + std::to_string(final_step) + ")" : ""));
  } else {
    // A window before the step a resumed run started from is named as such.
    const int64_t began = profiler.first_step_begun();
    const std::string why =
        began > 1 && profiler.last() < began
            ? "this run resumed at step " + std::to_string(began - 1) + " and ran steps " +
                  std::to_string(began) + "-" + std::to_string(final_step)
            : "the run ended at step " + std::to_string(final_step);
    log("profile: no step of train.profile_steps = [" + std::to_string(profiler.first()) + ", " +
        std::to_string(profiler.last()) + "] ran (" + why + "); no trace written");
  }
}

}  // namespace fsdp
