// src/train/job.hpp: the trainer's private state (one Job per train() call) and the pieces
// of the trainer that live in their own files: reporting (reporting.cpp: the banner, the
// memory plan, the step line's phases; the memory check) and checkpointing
// (checkpointing.cpp: save, async save, resume and init_from; torchtitan's CheckpointManager
// role). Not a public header: only src/train includes it.
#pragma once

#include <cerrno>
#include "fsdp/backend/buffer.hpp"
#include "fsdp/checkpoint/async_writer.hpp"
#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/checkpoint/init_from.hpp"
#include "fsdp/checkpoint/resume.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/host_memory.hpp"
#include "fsdp/data/batch.hpp"
#include "fsdp/data/sampler.hpp"
#include "fsdp/data/samples.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/fsdp/grad_clip.hpp"
#include "fsdp/fsdp/step_timer.hpp"
#include "fsdp/model/graphed_kernels.hpp"
#include "fsdp/model/model.hpp"
#include "fsdp/optim/optimizer.hpp"
#include "fsdp/train/collective_guard.hpp"
#include "fsdp/train/memory_check.hpp"
#include "fsdp/train/profiling.hpp"
#include "fsdp/train/run_dir.hpp"
#include "fsdp/train/signals.hpp"
#include "fsdp/train/watchdog.hpp"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>
#include "fsdp/train/trainer.hpp"

namespace fsdp::train_impl {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Everything one job holds; built in guarded phases so a failure on any rank stops all.
struct Job {
  Job(const Config& c, const TrainOptions& o, std::ostream& s, Runtime& r, Communicator& h)
      : cfg(c), opt(o), out(s), rt(r), host(h), family(model_family(c.model.type)) {}
  // The run's config, with what the trainer resolves before building anything
  // (fsdp.offload_optimizer_ratio = 0: resolve_offload_ratio in trainer.cpp).
  Config cfg;
  const TrainOptions& opt;
  std::ostream& out;
  Runtime& rt;
  Communicator& host;                 // the job's ranks, host memory
  const ModelFamily& family;
  const DeviceMesh* mesh = nullptr;   // the job's ranks, backend memory (from rt)
  Backend* backend = nullptr;
  std::unique_ptr<data::SampleSource> train_src, val_src;
  std::optional<data::DistributedSampler> sampler;
  // train.cuda_graphs = "on": the kernels the model is built on, recording its calls into
  // graphed segments (fsdp/model/graphed_kernels.hpp); null: the backend's, eager. Declared
  // before `model`, which frees its buffers through it.
  std::unique_ptr<GraphedKernels> graphs;
  std::unique_ptr<Model> model;
  std::unique_ptr<FsdpEngine> engine;
  std::unique_ptr<GradNormClipper> clipper;  // optim.grad_clip over the engine's shards
  std::unique_ptr<Optimizer> optimizer;
  RunDir run_dir;  // rank 0: the run_dir lock and metrics.jsonl (fsdp/train/run_dir.hpp)
  int64_t step = 0;  // training steps completed (fp16 skipped ones included)
  int64_t last_checkpoint = -1;  // step of the newest checkpoint saved or resumed; -1: none
  // Checkpoint identity (CheckpointMeta::run_id, launch_id): drawn on rank 0 and broadcast by
  // restore_state; run_id is the checkpoint's when resuming one that has it.
  std::string run_id, launch_id;
  int64_t micro_batch = 1;  // sequences per forward/backward on this rank
  // The world the plan is for: TrainOptions::plan_world_size if set, else host.size().
  int world = 1;
  int plan_shard_size = 0;  // --world-size: the planned mesh's shard group size
  bool planning() const { return opt.plan_world_size > 0; }
  // The mesh's shard group size: the real mesh's, or the planned one's.
  int mesh_shard_size() const {
    return planning() ? plan_shard_size : static_cast<int>(mesh->shard_size());
  }
  // fp16 dynamic loss scaling (torch.amp.GradScaler); disabled (scale 1) otherwise.
  GradScaler scaler;
  // checkpoint.async_save: the save whose shard files are being written in the background
  // (step_N.tmp, not yet committed), and this rank's writer (staging buffers + thread).
  struct PendingSave {
    int64_t step = 0;
    std::string tmp;
    Clock::time_point started;
  };
  std::optional<PendingSave> pending;
  ckpt::AsyncShardWriter writer;
  std::unique_ptr<Profiler> profiler;  // train.profile_steps (fsdp/train/profiling.hpp); null: off
  // A run that ends by an exception with a save in flight: join this rank's writer, then
  // rank 0 removes the uncommitted step_N.tmp (the previous `latest` stays). After an agreed
  // failure every rank unwinds the same way; a peer's writer may still be finishing its
  // file, in which case the directory can survive (a later save or --resume removes it;
  // `latest` never names it).
  ~Job() {
    try {  // the optimizer (destroyed before the engine) may still be stepping (offload)
      if (engine) engine->wait_shard_writes();
    } catch (...) {
    }
    try {
      writer.wait();
    } catch (...) {
    }
    if (pending && rank0()) ckpt::discard_tmp_step_dir(pending->tmp);
    if (graphs && backend) backend->set_ordered_reuse(false);  // the Runtime outlives the job
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  bool rank0() const { return host.rank() == 0; }
  // The hooks the model is given: the engine, behind the graphed segments' boundaries with
  // train.cuda_graphs. end_model_call() launches the last segment of a model call.
  ModuleHooks& model_hooks() { return graphs ? graphs->hooks(*engine) : *engine; }
  void end_model_call() {
    if (graphs) graphs->flush();
  }
  void log(const std::string& line) {
    if (rank0() && !opt.quiet) out << line << std::endl;
  }
};

// What train_step did.
struct StepOutcome {
  int64_t step = 0;      // the step run, 1-based (job.step after it)
  double loss = 0;       // mean cross-entropy over the step's target tokens of all ranks, nats
  double norm = 0;       // global L2 gradient norm before clipping (same on every rank)
  double lr = 0;         // the learning rate of the update (optim schedule at `step`)
  double seconds = 0;    // wall time from the batch's load to the synchronised update
  bool skipped = false;  // fp16 overflow: no update, the loss scale backed off
  bool nonfinite = false;  // non-finite loss or norm: no update (train.skip_nonfinite)
};

// What a step reports: rank 0's progress line and the step's metrics.jsonl object.
struct StepReport {
  StepOutcome outcome;
  int64_t peak = 0;            // the agreed (max over ranks) device peak memory, bytes
  int64_t host_peak = -1;      // fsdp.cpu_offload: the agreed host peak, bytes; -1: none
  double tokens_per_step = 0;  // tokens of one step over all ranks
  double mfu = -1;             // model FLOPs utilisation, 0..1; < 0: unknown peak, none
  double loss_scale = 1;       // the scale the step used (fp16; else 1)
  // Mixture of experts: the largest expert load over the ranks (Model::take_max_expert_load);
  // 0 without experts.
  double max_expert_load = 0;
  std::optional<double> val_loss;  // the evaluation after the step, if one ran
  std::vector<double> val_loss_per_path;  // with it, a mixture's per file (data.paths order)
  StepTimes times;             // the step's phases (StepTimer)
};

// A validation pass (trainer.cpp evaluate): the mean cross-entropy over every target token,
// nats, and with a data mixture each file's, in data.paths order (empty for one file).
struct Evaluation {
  double loss = 0;
  std::vector<double> per_path;
};

// ---- reporting.cpp ----
// Rank 0's progress line of a step: "step N/M | loss | lr | grad_norm | tok/s [| mfu] | peak
// mem [| loss_scale] [| val_loss] | <format_step_times>".
std::string progress_line(const Job& job, const StepReport& r);
// "2.6101" or, with a mixture, "2.6101 (per path 2.5012, 2.9300)".
std::string format_val_loss(const Evaluation& e);
// The step's metrics.jsonl object: step, loss, lr, grad_norm, tokens, tokens_per_sec,
// peak_mem_bytes [, mfu][, host_peak_mem_bytes][, moe_max_expert_load][, loss_scale, skipped
// (fp16)][, nonfinite,
// skipped][, val_loss[, val_loss_per_path]], step_s and <phase>_s (seconds, to the
// microsecond).
nlohmann::json metrics_line(const Job& job, const StepReport& r);
// Writes the profiler's trace (collective over job.host; write_profile) unless profiling is
// off (`prof` null) or it was written already.
void write_trace(Job& job, Profiler* prof);
// Tokens of one sample (the objective's input plus target lengths).
int64_t tokens_per_sample(const Config& cfg);
// "start-up: 12.3 s from process start = launch 0.4 + world 0.2 + ... (seconds)":
// TrainResult::startup for rank 0's log ("since train() began" without a launch phase).
std::string format_startup(const std::vector<std::pair<std::string, double>>& phases);
// "data 0.0 + fwd 0.7 + ...": a step's phases in milliseconds, for the progress line.
std::string format_step_times(const StepTimes& t);
// Rank 0's banner: the resolved config, device, mesh, model, units (`list_units`), data, MFU.
void print_banner(Job& job, const std::vector<FlatParamLayout>& layouts, bool list_units);
// Rank 0 prints the per-rank memory plan (and the host rows under offload) with `acts`
// activation bytes.
void print_memory_plan(Job& job, const EngineMemoryPlan& p, int64_t acts);
// --dry-run: rank 0 prints the banner with one line per FSDP unit and the memory plan of
// the (possibly planned, --world-size) world; fills result.plan, planned_activation_bytes
// (`act_bytes`, bytes per rank) and num_params. Allocates nothing of the model. One guard.
void plan_dry_run(Job& job, TrainResult& result, int64_t act_bytes);
// Refuses (InputError naming train.check_memory) a plan larger than this rank's memory,
// printing it first.
// checkpoint.async_save's staging is charged as this rank's share of its node's
// (with_staging_share over `node_writers`, node_shard_writers).
void check_memory_fits(Job& job, const EngineMemoryPlan& p, int64_t acts, int node_writers);

// ---- checkpointing.cpp ----
// Whether this rank writes a shard file at a save: replica 0 of its shard group (replicas
// hold the same shards).
bool writes_shard_file(const Job& job);
// How many ranks of this rank's node write a shard file (an async save's staging is theirs).
// Collective over job.host.
int node_shard_writers(Job& job);
// The model's starting state: with `resume` the checkpoint's (load_checkpoint; job.step,
// the optimizer's counters and the fp16 loss scale follow it; model.init_from is ignored),
// else with model.init_from the Hugging Face weights (result.init_bytes_read), else the
// engine's initialisation. Logs what it did on rank 0. Returns true when there is nothing to
// train (resumed at train.max_steps: result.final_step and, if asked, result.params are set).
bool restore_state(Job& job, TrainResult& result, bool resume);
// Commits the async save in flight, if any (waits for every rank's writer).
void finish_pending_save(Job& job);
// Saves step job.step into run_dir/checkpoints (async: staged and written in the background).
void save_checkpoint(Job& job, bool async);
// --resume: loads run_dir/checkpoints/latest into the engine, optimizer and job state.
ckpt::CheckpointMeta load_checkpoint(Job& job);
// Bytes one save writes (collective over job.host): every shard owner's fp32 parameters and
// optimizer state, summed over the ranks (the shard files' datasets; HDF5's metadata aside).
int64_t save_bytes(Job& job);
// Unless checkpoint.enable is false: when one save (save_bytes) is larger than the space
// train.run_dir's file system has free for this user (statvfs f_bavail), rank 0 writes one
// warning line to stderr naming both sizes and the keys that help, since the final save is
// then bound to fail with ENOSPC (after the whole run). A warning, not a refusal: space may
// be freed while the run trains, and a file system may report less than it holds (quotas).
// Collective over job.host.
void warn_if_save_does_not_fit(Job& job);
// model.init_from: each rank reads its shards' bytes of the Hugging Face weights.
ckpt::InitFromResult load_init_from(Job& job);

}  // namespace fsdp::train_impl
