// fsdp/train/trainer.hpp: the training loop of fsdp_train.
//
// One call runs a whole job on the ranks of `group`: has the Runtime build the DeviceMesh and
// the backend, then builds the data pipeline, the model and the FSDP engine; optionally
// resumes from run_dir/checkpoints/latest, or else, with model.init_from, fills each rank's
// shards from published Hugging Face weights (fsdp/checkpoint/init_from.hpp; --resume ignores
// init_from); trains train.max_steps steps (forward, backward with gradient reduction,
// global-norm clipping, optimizer step on the shards, LR schedule); evaluates every
// eval.every steps and at the end; checkpoints every checkpoint.every steps and at the end;
// logs on rank 0 and to run_dir/metrics.jsonl.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "fsdp/config/config.hpp"
#include "fsdp/core/memory.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/fsdp/step_timer.hpp"
#include "fsdp/model/graphed_kernels.hpp"
#include "fsdp/train/runtime.hpp"
#include "fsdp/train/signals.hpp"

namespace fsdp {

struct TrainOptions {
  bool resume = false;        // continue from run_dir/checkpoints/latest (must exist)
  bool resume_auto = false;   // --resume auto: resume if run_dir/checkpoints/latest exists,
                              // else start fresh (a requeued Slurm job's first and later runs)
  // With `resume`: the checkpoint to continue from instead of `latest`, a step number or a
  // step directory of run_dir/checkpoints (ckpt::resume_step_dir; --resume=STEP). Once it is
  // loaded, and there are steps to train, rank 0 points `latest` at it, so a requeued
  // --resume=auto continues from there, not from the later checkpoints left behind.
  std::string resume_from;
  bool dry_run = false;       // validate, build mesh and units, print the memory plan, stop
  // > 0 (dry_run only; fsdp_train --world-size): plan for this many ranks instead of the
  // group's, from any number of processes. The plan's mesh has mesh.shard_size ranks per
  // shard group, which must then be set (> 0) and divide it; train.global_batch_size and
  // train.micro_batch_size are checked against it as a real run of that size would be.
  // InputError otherwise (naming --world-size or the key).
  int plan_world_size = 0;
  bool gather_params = false; // fill TrainResult::params with the final full parameters
  bool quiet = false;         // no log lines on stdout (tests)
  int64_t stop_after = 0;     // > 0: stop after this step as if killed (tests of resume);
                              // the LR schedule still follows train.max_steps
  // Tests of fp16 loss scaling: at these (1-based) steps, rank `inject_rank` of the world
  // adds +inf to its gradient shard after the reduction (an overflow on one rank only).
  std::vector<int64_t> inject_overflow_steps;
  int inject_rank = 0;
  // Read on every rank at each step boundary: a non-zero signal number on any rank stops the
  // run after that step (docs/checkpoint.md "Signals"). Default: fsdp::pending_signal(),
  // the flag SignalGuard's handler sets; tests may return a number at a chosen call.
  std::function<int()> pending_signal = &fsdp::pending_signal;
};

struct TrainResult {
  std::vector<double> losses;                          // train loss of each step run, nats
  std::vector<std::pair<int64_t, double>> val_losses;  // (step, validation loss)
  std::map<std::string, std::vector<float>> params;    // name -> full fp32 values (if asked)
  int64_t final_step = 0;
  int64_t num_params = 0;
  std::vector<int64_t> skipped_steps;      // steps whose update fp16 loss scaling skipped
  // Steps whose loss or gradient norm was non-finite and whose update was skipped
  // (train.skip_nonfinite = true; without it the first such step stops the run).
  std::vector<int64_t> nonfinite_steps;
  std::vector<double> loss_scales;         // loss scale used at each step run (fp16; else 1)
  std::vector<int64_t> raw_allocs;         // raw allocations + frees during each step run
  // Where each step run spent its time (fsdp/fsdp/step_timer.hpp), this rank's clock; also
  // in metrics.jsonl as step_s and <phase>_s.
  std::vector<StepTimes> step_times;
  std::array<int64_t, kNumMemCategories> peak_bytes{};  // this rank's measured peaks
  // fsdp.cpu_offload: this rank's measured peaks of the host (offload) runtime; 0 otherwise.
  std::array<int64_t, kNumMemCategories> host_peak_bytes{};
  EngineMemoryPlan plan;                   // the memory plan for this run (all categories)
  // checkpoint.async_save: host bytes of this rank's staging buffers at the end (0 if no
  // periodic save staged anything); the plan's save_staging on a writing rank.
  int64_t save_staging_bytes = 0;
  int64_t planned_activation_bytes = 0;
  // model.init_from: payload bytes of the Hugging Face weights this rank read to fill its own
  // shards (about 1/shard_size of the model's bytes); 0 without init_from or on --resume.
  int64_t init_bytes_read = 0;
  // Where this rank's start-up time went, in order (seconds): "launch" (process start to
  // train(): MPI, devices, the config), "world" (config checks, runtime and data),
  // "plan" (memory plan and check), "run_dir", "model" (model, engine: shard allocation and
  // initialisation, optimizer state), "restore" (checkpoint or model.init_from, metrics).
  // Rank 0 prints them as one "start-up:" line before the first step. "launch" is missing
  // where /proc cannot tell the process's start.
  std::vector<std::pair<std::string, double>> startup;
  // Stopped by a signal (TrainOptions::pending_signal) before train.max_steps: its number
  // (0 if the run was not stopped), the lowest rank of `group` that received it, and on that
  // rank only the line to print: "received SIGTERM on rank R (host H); saved checkpoint
  // RUN_DIR/checkpoints/step_N at step N; resume with --resume" (empty on the other ranks).
  int stop_signal = 0;
  int stop_rank = -1;
  std::string stop_message;
  // train.cuda_graphs = "on": what this rank's graphed segments did (all 0 when off).
  KernelGraphStats graphs;
};

// Runs the job on the ranks of `group` (runtime.world(), or runtime.self() for a one-rank
// job). Collective over `group`. `out` receives rank 0's log lines. A pending signal on any
// rank at a step boundary (other than the last step's) ends the loop on every rank after
// that step: no evaluation, a checkpoint of the step, TrainResult::stop_signal set (the
// caller exits with kExitInterrupted).
// Throws fsdp::Error (exit code 2 for bad input, on every rank, via collective_guard) or
// PeerFailed on ranks whose peer failed.
TrainResult train(const Config& config, Runtime& runtime, Communicator& group,
                  const TrainOptions& options, std::ostream& out);

}  // namespace fsdp
