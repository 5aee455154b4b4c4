// The training loop (see fsdp/train/trainer.hpp). train() is split as torchtitan's Trainer:
// setup() (world-size checks, data, dry run, memory check, run_dir, model, resume or
// init_from) returns a Setup; run_loop() calls train_step() (forward_backward_step over the
// micro-batches, fp16 loss scaling, the non-finite guard, clipping, the optimizer step) and
// end_step() (agreement all-reduce, evaluation, checkpoint, metrics, logging, signals) until
// the run ends. Every rank makes the same collective calls in the same order.
#include "fsdp/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/checkpoint/async_writer.hpp"
#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/checkpoint/init_from.hpp"
#include "fsdp/checkpoint/resume.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/core/atomic_file.hpp"
#include "fsdp/core/build_info.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/host_memory.hpp"
#include "fsdp/core/process.hpp"
#include "fsdp/data/batch.hpp"
#include "fsdp/data/sampler.hpp"
#include "fsdp/data/samples.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/fsdp/step_timer.hpp"
#include "fsdp/model/model.hpp"
#include "fsdp/optim/optimizer.hpp"
#include "fsdp/train/collective_guard.hpp"
#include "fsdp/train/memory_check.hpp"
#include "fsdp/train/profiling.hpp"
#include "fsdp/train/router_bias.hpp"
#include "fsdp/train/run_dir.hpp"
#include "fsdp/train/signals.hpp"
#include "fsdp/train/watchdog.hpp"
#include "job.hpp"

namespace fsdp {
namespace {

using namespace train_impl;

void open_data(Job& job) {
  const Config& cfg = job.cfg;
  const int64_t V = model_family(cfg.model.type).vocab_size(cfg.model);
  job.train_src = data::open_samples(cfg, data::Split::train, V);
  job.val_src = data::open_samples(cfg, data::Split::val, V);
  // A planned world (--world-size) samples as its rank 0 would.
  const int dp_rank = job.planning() ? 0 : job.host.rank();
  if (cfg.data.paths.empty()) {
    job.sampler.emplace(job.train_src->num_samples(), cfg.train.global_batch_size, dp_rank,
                        job.world, cfg.train.seed);
  } else {
    job.sampler.emplace(job.train_src->part_samples(), cfg.data.weights,
                        cfg.train.global_batch_size, dp_rank, job.world, cfg.train.seed);
  }
}

// Every rank opened the same data: each split's token count and each file's samples are
// compared with rank 0's. Nodes reading different copies of data.path (a dataset staged to
// node-local disk, one copy stale) would otherwise sample from different epochs' orders,
// training on some samples twice and others never. A differing rank fails with InputError
// naming the key, the file and both counts. Collective over job.host.
void check_same_data(Job& job) {
  const Config& cfg = job.cfg;
  std::vector<int64_t> mine;
  std::vector<std::string> what;  // what each entry counts, for the message
  const bool mixture = !cfg.data.paths.empty();
  for (const auto* src : {job.train_src.get(), job.val_src.get()}) {
    const std::string split = src == job.train_src.get() ? "train" : "val";
    mine.push_back(src->num_tokens());
    const std::string one = "data.path (\"" + cfg.data.path + "\")";
    what.push_back((mixture ? std::string("data.paths") : one) + ": " + split + " tokens");
    const std::vector<int64_t> parts = src->part_samples();
    for (std::size_t d = 0; d < parts.size(); ++d) {
      mine.push_back(parts[d]);
      const std::string file =
          mixture ? "data.paths[" + std::to_string(d) + "] (\"" + cfg.data.paths[d] + "\")" : one;
      what.push_back(file + ": " + split + " samples");
    }
  }
  std::vector<int64_t> root = mine;
  job.host.broadcast(root.data(), static_cast<int64_t>(root.size()), DType::i64, 0)->wait();
  collective_guard(job.host, [&] {
    for (std::size_t i = 0; i < mine.size(); ++i) {
      if (mine[i] == root[i]) continue;
      const std::string r = "rank " + std::to_string(job.host.rank());
      throw InputError(what[i] + ": the ranks read different data: " + std::to_string(mine[i]) +
                       " on " + r + ", " + std::to_string(root[i]) + " on rank 0 (do the nodes "
                       "see different copies of the file?)");
    }
  });
}

// Mean validation loss: summed cross-entropy over every target token of the split's
// samples (eval.max_windows caps them) divided by their number of target tokens; with a data
// mixture also each file's (its windows only), in data.paths order. Each file's windows are
// split over the ranks in contiguous blocks and run in chunks of the micro-batch; the
// per-rank sums stay on the device until one all-reduce and one copy at the end. (One file:
// the whole split as one part, as before mixtures existed.)
Evaluation evaluate(Job& job) {
  const std::vector<int64_t> parts = job.val_src->part_samples();
  const auto P = static_cast<int64_t>(parts.size());
  const int64_t B = std::max<int64_t>(1, job.micro_batch);  // samples per forward
  std::vector<data::WindowRange> mine;
  std::vector<int64_t> chunks;
  for (int64_t d = 0, offset = 0; d < P; offset += parts[static_cast<std::size_t>(d)], ++d) {
    data::WindowRange r =
        data::rank_windows(parts[static_cast<std::size_t>(d)], job.host.rank(), job.host.size());
    mine.push_back({offset + r.begin, offset + r.end});
    chunks.push_back((r.size() + B - 1) / B);
  }
  // Every rank runs the same number of forward passes per file (they hold collectives); a
  // rank with no samples left runs sample 0 and discards the result.
  job.host.all_reduce(chunks.data(), chunks.data(), P, DType::i64, ReduceOp::max)->wait();
  DeviceBuffer sums(*job.backend, DType::f64, P, MemCategory::other);
  DeviceBuffer discard(*job.backend, DType::f64, 1, MemCategory::other);
  job.backend->fill_zero(sums.view());
  std::vector<int64_t> targets(static_cast<std::size_t>(P), 0);
  for (int64_t d = 0; d < P; ++d) {
    const data::WindowRange& m = mine[static_cast<std::size_t>(d)];
    for (int64_t c = 0; c < chunks[static_cast<std::size_t>(d)]; ++c) {
      data::WindowRange r{m.begin + c * B, std::min(m.end, m.begin + (c + 1) * B)};
      const bool dummy = r.size() <= 0;
      if (dummy) r = {0, 1};
      const data::Batch batch = job.val_src->load(r.indices());
      if (!dummy) targets[static_cast<std::size_t>(d)] += batch.num_targets();
      job.engine->begin_step(false);
      job.model->forward_loss(batch, job.model_hooks(),
                              dummy ? discard.view() : sums.view().slice(d, 1));
      job.end_model_call();
      job.engine->end_step();
    }
  }
  job.mesh->world().all_reduce(sums.data(), sums.data(), P, DType::f64, ReduceOp::sum,
                               job.backend->compute_stream())->wait();
  job.host.all_reduce(targets.data(), targets.data(), P, DType::i64, ReduceOp::sum)->wait();
  std::vector<double> total(static_cast<std::size_t>(P), 0.0);
  job.backend->copy_to_host(total.data(), sums.view());
  Evaluation e;
  double sum = 0;
  int64_t count = 0;
  for (std::size_t d = 0; d < total.size(); ++d) {
    sum += total[d];
    count += targets[d];
    if (P > 1) {
      e.per_path.push_back(targets[d] > 0 ? total[d] / static_cast<double>(targets[d])
                                          : std::nan(""));
    }
  }
  e.loss = count > 0 ? sum / static_cast<double>(count) : std::nan("");
  return e;
}

// "grad_norm is nan (loss 8.3033)": which of a step's loss and gradient norm is not finite.
std::string nonfinite_what(double loss, double norm) {
  auto text = [](double v) {
    if (std::isnan(v)) return std::string("nan");
    if (std::isinf(v)) return std::string(v > 0 ? "inf" : "-inf");
    std::ostringstream os;
    os << std::setprecision(6) << v;
    return os.str();
  };
  if (!std::isfinite(loss) && !std::isfinite(norm))
    return "loss is " + text(loss) + " and grad_norm is " + text(norm);
  if (!std::isfinite(loss)) return "loss is " + text(loss) + " (grad_norm " + text(norm) + ")";
  return "grad_norm is " + text(norm) + " (loss " + text(loss) + ")";
}

// The non-finite guard's stop: every rank holds the same all-reduced loss and grad norm, so
// all reach this together without a collective; rank 0 prints the one line, the others exit
// with the same code. Nothing of this step is applied or saved.
[[noreturn]] void stop_nonfinite(Job& job, int64_t step, double loss, double norm) {
  // A background save still in flight holds the state before this step: commit it (every
  // rank is here, the decision came from all-reduced values) so it is the last checkpoint.
  finish_pending_save(job);
  const std::string last =
      job.last_checkpoint >= 0 ? ckpt::step_dir(job.cfg.train.run_dir, job.last_checkpoint)
                               : std::string("none");
  if (job.rank0()) {
    throw AgreedFailure("step " + std::to_string(step) + ": " + nonfinite_what(loss, norm) +
                            ": training diverged; stopped before the optimizer step, nothing "
                            "of this step applied or saved; last checkpoint: " + last +
                            " (lower optim.lr, or set train.skip_nonfinite = true to skip "
                            "such steps)",
                        kExitRuntimeError);
  }
  throw PeerFailed(kExitRuntimeError);
}



// ---- Setup: the runtime, the data, the model, resume or init_from -------------------------

// Every rank runs the same build of fsdp_train (fsdp::build_id: version, git commit,
// uncommitted diff, build settings): rank 0's id is broadcast and each rank compares its own.
// Nodes with different installs (a stale copy on node-local disk, a container image updated
// on some nodes only) would otherwise fail later without naming the cause, or hang in a
// collective only one build issues. The first check of setup(); InputError on a rank whose
// build differs, naming both.
void check_same_build(Job& job) {
  const std::string mine = build_id();
  char root[256] = {};  // the id is ~60 characters; a longer one is compared in its first 255
  if (job.rank0()) mine.copy(root, sizeof root - 1);
  job.host.broadcast(root, sizeof root, DType::u8, 0)->wait();
  collective_guard(job.host, [&] {
    if (mine.substr(0, sizeof root - 1) == root) return;
    throw InputError("the ranks run different fsdp_train builds: " + mine + " on " + where() +
                     ", " + root + " on rank 0 (every node must run the same executable: is "
                     "fsdp_train installed separately on each node?)");
  });
}

// Every rank read the same config: rank 0's resolved TOML (to_toml) is broadcast and each rank
// compares its own with it. A config file edited while the job started, or nodes reading
// different copies, would otherwise train different models on different ranks (HYBRID_SHARD
// replicas drifting apart at another learning rate) or hang in a collective of another size.
// A differing rank fails with InputError naming the first differing key and both values.
void check_same_config(Job& job) {
  const std::string mine = to_toml(job.cfg);
  int64_t n = static_cast<int64_t>(mine.size());
  job.host.broadcast(&n, 1, DType::i64, 0)->wait();
  std::string root = job.rank0() ? mine : std::string(static_cast<std::size_t>(n), '\0');
  job.host.broadcast(root.data(), n, DType::u8, 0)->wait();
  collective_guard(job.host, [&] {
    if (root == mine) return;
    const std::string r = "rank " + std::to_string(job.host.rank());
    const auto d = ckpt::first_config_difference(mine, root, r + "'s config", "rank 0's config");
    if (!d) return;  // the same values in another text
    throw InputError("the ranks read different configs: " + d->key + " = " + d->a_value +
                     " on " + r + ", " + d->b_value + " on rank 0 (every rank must read the "
                     "same file and --set options; was it edited while the job started, or "
                     "do the nodes see different copies?)");
  });
}

// What setup() fixes for the step loop; the Job owns the rest (data, model, engine,
// optimizer, run_dir, the micro-batch size).
struct Setup {
  int64_t local_batch = 0;  // sequences per rank per step: train.global_batch_size / world
  data::BatchShape shape;   // one sample's token counts (data::batch_shape)
  bool resume = false;      // resumed from run_dir/checkpoints/latest (--resume, or auto found it)
  // Nothing to train (a dry run, or a resume at train.max_steps): the TrainResult is final.
  bool done = false;
};

// Has the Runtime build the mesh and the backend (--world-size: this process's own,
// node-local mesh, after checking it needs --dry-run and that mesh.shard_size is set and
// divides the planned world), sets job.world, then checks train.global_batch_size and
// train.micro_batch_size against it and opens the data. Two guards, collective over job.host;
// InputError (agreed on every rank) naming --world-size or the key.
void configure_world(Job& job) {
  const Config& cfg = job.cfg;
  const TrainOptions& opt = job.opt;
  collective_guard(job.host, [&] {
    if (job.planning()) {
      if (!opt.dry_run) {
        throw InputError("--world-size: " + std::to_string(opt.plan_world_size) +
                         " plans a world that is not there; it needs --dry-run");
      }
      if (cfg.mesh.shard_size <= 0) {
        throw InputError("mesh.shard_size: must be set (> 0, the ranks per node or shard group) "
                         "with --world-size " + std::to_string(opt.plan_world_size) +
                         " (0 means the ranks of this node, which a planned world does not have)");
      }
      if (opt.plan_world_size % cfg.mesh.shard_size != 0) {
        throw InputError("mesh.shard_size: " + std::to_string(cfg.mesh.shard_size) +
                         " does not divide the world size " +
                         std::to_string(opt.plan_world_size) + " (--world-size)");
      }
      job.plan_shard_size = static_cast<int>(cfg.mesh.shard_size);
      // This process's own mesh: node-local, whatever the planned shard size.
      Config here = cfg;
      here.mesh.shard_size = 0;
      job.rt.configure(job.host, here);
    } else {
      job.rt.configure(job.host, cfg);
    }
  });
  job.mesh = &job.rt.mesh();
  job.backend = &job.rt.backend();
  job.world = job.planning() ? opt.plan_world_size : job.host.size();
  const int world = job.world;
  collective_guard(job.host, [&] {
    if (cfg.train.global_batch_size % world != 0) {
      throw InputError("train.global_batch_size: " + std::to_string(cfg.train.global_batch_size) +
                       " is not divisible by the world size " + std::to_string(world) +
                       (job.planning() ? " (--world-size)" : ""));
    }
    const int64_t local = cfg.train.global_batch_size / world;
    if (cfg.train.micro_batch_size > 0 && local % cfg.train.micro_batch_size != 0) {
      throw InputError("train.micro_batch_size: " + std::to_string(cfg.train.micro_batch_size) +
                       " does not divide the per-rank batch " + std::to_string(local) +
                       " (train.global_batch_size / world size)");
    }
    open_data(job);
  });
  check_same_data(job);
}

// Every rank sees rank 0's run directory: several ranks write a checkpoint's shard files into
// it and every rank reads them on resume, so a train.run_dir on node-local disk (or a relative
// one from different working directories) would fail at the first save, hours in, or leave
// `latest` naming a step without the other nodes' shards. Rank 0 writes a probe file of a
// fresh token into checkpoints/ (a name never used before, so no NFS negative lookup cache
// hides it), every other rank reads it, then rank 0 removes it. InputError on a rank that
// does not see it. Collective over job.host; rank 0 has opened the run directory.
void check_shared_run_dir(Job& job) {
  if (job.host.size() == 1) return;
  char token[33] = {};
  if (job.rank0()) ckpt::new_run_id().copy(token, 32);
  job.host.broadcast(token, 32, DType::u8, 0)->wait();
  const std::string dir = ckpt::checkpoints_dir(job.cfg.train.run_dir);
  const std::string probe = dir + "/.shared_probe." + token;
  collective_guard(job.host, [&] {
    if (job.rank0()) write_file_atomically(probe, token);
  });
  std::exception_ptr failure;
  try {
    collective_guard(job.host, [&] {
      if (job.rank0()) return;
      std::ifstream in(probe, std::ios::binary);
      std::string seen(32, '\0');
      if (in) in.read(seen.data(), 32);
      if (in && seen == token) return;
      throw InputError("train.run_dir: " + where() + " does not see rank 0's run directory " +
                       job.cfg.train.run_dir + " (" + probe + " is missing there): the ranks "
                       "write one checkpoint's shard files into it and all read them on resume, "
                       "so it must be one directory on a file system every node shares (not "
                       "node-local disk, nor a relative path from other working directories)");
    });
  } catch (...) {
    failure = std::current_exception();
  }
  std::error_code ec;
  if (job.rank0()) std::filesystem::remove(probe, ec);  // after every rank's read
  if (failure) std::rethrow_exception(failure);
}

// Whether the run resumes: --resume, or --resume auto when rank 0 finds checkpoints/latest
// (one guard and one broadcast over job.host; every rank follows rank 0's answer, and a
// malformed `latest` fails here as it would for --resume). Then rank 0 locks train.run_dir
// before anything is written there, refuses a fresh run into an earlier run's directory and
// proves checkpoints/ writable (open_run_dir; one guard), and every rank is shown to see it
// (check_shared_run_dir). metrics.jsonl is opened later.
bool open_run(Job& job) {
  const Config& cfg = job.cfg;
  bool resume = job.opt.resume;
  if (job.opt.resume_auto && !resume) {
    int32_t found = 0;
    collective_guard(job.host, [&] {
      if (job.rank0()) found = ckpt::find_latest(cfg.train.run_dir) ? 1 : 0;
    });
    job.host.broadcast(&found, 1, DType::i32, 0)->wait();
    resume = found != 0;
    if (!resume) {
      job.log("--resume auto: no checkpoint in " + ckpt::checkpoints_dir(cfg.train.run_dir) +
              ", starting fresh");
    }
  }
  collective_guard(job.host, [&] {
    if (job.rank0()) job.run_dir = open_run_dir(cfg.train.run_dir, resume);
  });
  if (cfg.checkpoint.enable || resume) check_shared_run_dir(job);
  if (!job.run_dir.stale_holder().empty()) {
    job.log("train.run_dir: taking over the stale lock of " + job.run_dir.stale_holder());
  }
  return resume;
}

// Creates the model (activations in mixed_precision.param_dtype), the FSDP engine (its
// shards initialised from train.seed unless `init_params` is false: a checkpoint or
// model.init_from writes every element next) and the optimizer over every unit's shard.
// One guard.
void build_model(Job& job, bool init_params) {
  const Config& cfg = job.cfg;
  collective_guard(job.host, [&] {
    // train.cuda_graphs: "auto" stays eager until a GPU has run the graphed == eager test.
    if (cfg.train.cuda_graphs == CudaGraphs::on) {
      GraphedKernels::Options o;
      o.on_capture_failure = [rank = job.host.rank()](const std::string& why) {
        write_line(2, "warning: rank " + std::to_string(rank) + ": train.cuda_graphs: a capture "
                      "failed (" + why + "); this rank runs its kernels eagerly from here on");
      };
      job.graphs = std::make_unique<GraphedKernels>(*job.backend, std::move(o));
      job.backend->set_ordered_reuse(true);  // the same blocks each step, so records repeat
    }
    Kernels& kernels = job.graphs ? static_cast<Kernels&>(*job.graphs) : *job.backend;
    job.model = job.family.create(cfg.model, kernels, cfg.mixed_precision.param_dtype,
                                  cfg.fsdp.checkpointing());
    job.engine = std::make_unique<FsdpEngine>(job.model->modules(), cfg.fsdp,
                                              cfg.mixed_precision, *job.mesh, *job.backend,
                                              cfg.train.seed, job.rt.offload_runtime(),
                                              init_params);
    job.clipper = std::make_unique<GradNormClipper>(*job.engine);
    // The optimizer state lives with each unit's shards (host memory when offloaded).
    job.optimizer = std::make_unique<Optimizer>(cfg.optim, job.engine->backend());
    for (int u = 0; u < job.engine->num_units(); ++u) {
      job.optimizer->add_shard(job.engine->shard_param(u), job.engine->shard_grad(u),
                               decayed_ranges(job.engine->layout(u), job.engine->shard_index()),
                               &job.engine->shard_runtime(u));
    }
  });
}

// fsdp.offload_optimizer_ratio = 0 ("auto"): every rank asks the memory plan for the smallest
// ratio that fits its device (auto_offload_ratio), and all take the largest of those (it
// fits every rank); logged with the budget it was fitted to, and with a hint when rank 0's
// plan fits the same budget without offload at all (no host step). A --world-size plan has
// no device to fit and the CPU backend one memory for both: 1 there.
void resolve_offload_ratio(Job& job, int64_t act_bytes) {
  FsdpConfig& f = job.cfg.fsdp;
  if (!f.params_resident() || f.offload_optimizer_ratio > 0) return;
  double ratio = 1.0;
  const bool cpu = job.backend->device() == Device::cpu;
  const std::vector<ModuleDecl> modules = job.family.modules(job.cfg.model);
  collective_guard(job.host, [&] {
    if (job.planning()) return;
    ratio = auto_offload_ratio(modules, job.cfg, job.world,
                               job.mesh_shard_size(), num_optimizer_states(job.cfg.optim.name),
                               act_bytes, job.rt.memory_budget(), cpu);
  });
  job.host.all_reduce(&ratio, &ratio, 1, DType::f64, ReduceOp::max)->wait();
  f.offload_optimizer_ratio = ratio;
  std::ostringstream os;
  os << "fsdp.offload_optimizer_ratio = 0 (auto): " << ratio;
  if (job.planning()) {
    os << " (a --world-size plan has no device budget to fit)";
  } else if (cpu) {
    os << " (the CPU backend: the device is the host's memory)";
  } else {
    const MemoryBudget& b = job.rt.memory_budget();
    os << " (the smallest whose plan fits " << 100 * (1 - kAutoOffloadHeadroom) << " % of "
       << (b.bytes < 0 ? std::string("an unmeasured budget") : b.source) << ")";
    if (b.bytes >= 0 && job.rank0()) {
      Config plain = job.cfg;
      plain.fsdp.offload_optimizer = false;
      const EngineMemoryPlan p = plan_memory(modules, plain, job.world, job.mesh_shard_size(),
                                             num_optimizer_states(plain.optim.name));
      if (memory_refusal(p, act_bytes, auto_offload_budget(b), {}, false).empty()) {
        os << "; the plan fits this device without offload too ("
           << human_bytes(static_cast<double>(p.total + act_bytes))
           << "): fsdp.offload_optimizer = false trains without a host step";
      }
    }
  }
  job.log(os.str());
}

// Everything before the first step, in guarded phases (collective over job.host, the same
// calls in the same order on every rank): the config's checks (check_config), the runtime
// and the data (configure_world), fsdp.offload_optimizer_ratio = 0 resolved
// (resolve_offload_ratio), the dry run's plan (then done), the memory check before
// allocation (InputError if the plan
// cannot fit), the run directory and the resume decision, the model, engine and optimizer,
// the banner, the checkpoint or init_from, and metrics.jsonl. Fills result.plan, num_params,
// planned_activation_bytes (and init_bytes_read). Throws what the guards agree on.
Setup setup(Job& job, TrainResult& result) {
  const Config& cfg = job.cfg;
  auto last = Clock::now();
  auto phase = [&](const char* name) {  // the time since the previous phase's end
    const auto now = Clock::now();
    result.startup.emplace_back(name, std::chrono::duration<double>(now - last).count());
    last = now;
  };
  if (const double launch = seconds_since_process_start(); launch >= 0) {
    result.startup.emplace_back("launch", launch);
  }
  check_same_build(job);
  job.scaler = GradScaler(cfg.mixed_precision);
  // A Config built in code gets parse_config's checks (a parsed one passes them again).
  collective_guard(job.host, [&] { check_config(cfg); });
  check_same_config(job);
  configure_world(job);
  Setup s;
  s.local_batch = cfg.train.global_batch_size / job.world;
  // Sequences per forward/backward on each rank (gradient accumulation splits the step).
  job.micro_batch = micro_batch_size(cfg.train, job.world);
  s.shape = data::batch_shape(cfg);
  const int64_t act_bytes =
      job.family.activation_bytes(cfg.model, job.micro_batch, s.shape,
                                  cfg.mixed_precision.param_dtype, cfg.fsdp.checkpointing());
  resolve_offload_ratio(job, act_bytes);
  phase("world");
  if (job.opt.dry_run) {
    plan_dry_run(job, result, act_bytes);
    s.done = true;
    return s;
  }
  // Memory before allocation, and before anything is written: a plan that cannot fit is
  // refused with nothing created.
  // The plan is computed once: checked here, reported in TrainResult::plan.
  const int node_writers = cfg.stages_async_saves() ? node_shard_writers(job) : 0;
  collective_guard(job.host, [&] {
    result.plan = plan_memory(job.family.modules(cfg.model), cfg, job.world,
                              job.mesh->shard_size(), num_optimizer_states(cfg.optim.name));
    check_memory_fits(job, result.plan, act_bytes, node_writers);
  });
  phase("plan");
  s.resume = open_run(job);
  phase("run_dir");
  build_model(job, !s.resume && cfg.model.init_from.empty());
  phase("model");
  result.num_params = job.engine->num_params();
  result.planned_activation_bytes = act_bytes;
  print_banner(job, job.engine->layouts(), /*list_units=*/false);
  warn_if_save_does_not_fit(job);
  if (restore_state(job, result, s.resume)) {
    s.done = true;
    return s;
  }
  collective_guard(job.host, [&] {
    if (job.rank0()) job.run_dir.open_metrics(s.resume);
  });
  if (job.rank0() && job.run_dir.metrics().unfinished_bytes() > 0) {
    job.log(job.run_dir.metrics().path() + ": cut off an unfinished last line of " +
            std::to_string(job.run_dir.metrics().unfinished_bytes()) +
            " bytes (the run that wrote it ended mid-write)");
  }
  phase("restore");
  job.log(format_startup(result.startup));
  return s;
}

// ---- One training step ------------------------------------------------------------------

// The step loop's state for the whole run, built after the start-of-run evaluation (the
// allocation order of the original single function, so memory peaks are unchanged).
struct StepState {
  StepState(Job& job, const Setup& s)
      : stats(*job.backend, DType::f64, 3, MemCategory::other),
        loss_dev(stats.view().slice(0, 1)),
        norm_dev(stats.view().slice(1, 1)),
        inf_dev(stats.view().slice(2, 1)),
        local_batch(s.local_batch),
        fixed_targets(job.train_src->fixed_targets_per_sample()),
        tokens_per_step(static_cast<double>(job.cfg.train.global_batch_size *
                                            tokens_per_sample(job.cfg))),
        flops_per_step(job.family.train_flops_per_sample(job.cfg.model, s.shape) *
                       static_cast<double>(job.cfg.train.global_batch_size)),
        peak_flops(job.rt.peak_flops().flops_per_s),
        timer(*job.backend) {}
  StepState(const StepState&) = delete;
  StepState& operator=(const StepState&) = delete;

  // The step's device scalars, fp64 [3]: [0] the loss summed over this rank's target tokens
  // (nats; all-reduced to the world's sum), [1] the global gradient norm, [2] found_inf (fp16).
  DeviceBuffer stats;
  TensorView loss_dev, norm_dev, inf_dev;  // stats' elements 0, 1 and 2, each [1]
  int64_t local_batch;    // sequences per rank per step
  int64_t fixed_targets;  // target tokens per sample when fixed (SampleSource), else 0
  double tokens_per_step; // tokens of one step over all ranks (throughput)
  // MFU = model FLOPs of the step / (its training seconds x ranks x peak FLOP/s per rank).
  double flops_per_step;  // model FLOPs of one step over all ranks
  double peak_flops;      // FLOP/s per rank (Runtime::peak_flops); <= 0: unknown, no MFU
  // Where each step's time goes (fsdp/fsdp/step_timer.hpp); the engine charges backward and
  // its collective waits.
  StepTimer timer;
  Profiler* prof = nullptr;  // job.profiler (train.profile_steps); null: off
  // The batch of the step after the one running (sampler step prefetched_step), loaded by
  // prefetch_batch while the device still ran that step; empty when none was loaded.
  std::optional<data::Batch> prefetched;
  int64_t prefetched_step = -1;
};

// This step's batch (sampler step job.step): the one prefetch_batch loaded during the
// previous step, or loaded now. Throws what SampleSource::load throws.
data::Batch take_batch(Job& job, StepState& st) {
  std::optional<data::Batch> ready = std::move(st.prefetched);
  st.prefetched.reset();
  if (ready && st.prefetched_step == job.step) return std::move(*ready);
  return job.train_src->load(job.sampler->sample_indices(job.step));
}

// Loads the batch of sampler step `step` (the next step) while the device still runs the
// current one, in the host's otherwise idle wait for it: PyTorch's DataLoader prefetch
// (pin_memory + prefetch_factor), without a thread. Loads are pure functions of the sampler
// step (samples.hpp), so a batch loaded early is the batch loaded late; nothing when `step`
// is past train.max_steps. Charged to Phase::data (on a device the stream marks are adjacent,
// so the device time charged is ~0: the load is hidden). A failed load is dropped here:
// take_batch loads again at that step and throws there, at the step it always did.
void prefetch_batch(Job& job, StepState& st, int64_t step) {
  if (step >= job.cfg.train.max_steps) return;
  StepTimer::Scope loading(&st.timer, Phase::data);
  try {
    st.prefetched = job.train_src->load(job.sampler->sample_indices(step));
    st.prefetched_step = step;
  } catch (const Error&) {
    st.prefetched.reset();
  }
}

// torchtitan's forward_backward_step: forward and backward of this rank's `batch`
// (st.local_batch sequences), job.micro_batch sequences at a time (gradient accumulation:
// each micro-batch's gradient is reduce-scattered into the fp32 shards as its backward ends).
// Adds the summed loss of its target tokens (nats) to st.loss_dev. Returns the step's number
// of target tokens over all ranks: computed when the data has a fixed number per sample,
// else all-reduced over job.host (every rank calls this once per step). Throws fsdp::Error
// when a fixed-target batch holds another number.
int64_t forward_backward_step(Job& job, StepState& st, const data::Batch& batch) {
  const Config& cfg = job.cfg;
  const int64_t B = st.local_batch, micro = job.micro_batch;
  // The loss is the mean over the step's target tokens of all ranks (padding excluded): a
  // fixed number per sample needs no communication, otherwise the counts are all-reduced.
  int64_t global_targets = batch.num_targets();
  if (st.fixed_targets > 0) {
    if (global_targets != batch.B * st.fixed_targets) {
      throw Error("trainer: a batch of " + std::to_string(batch.B) + " samples has " +
                  std::to_string(global_targets) + " targets, expected " +
                  std::to_string(st.fixed_targets) + " per sample");
    }
    global_targets = cfg.train.global_batch_size * st.fixed_targets;
  } else {
    StepTimer::Scope waiting(&st.timer, Phase::comm_wait);
    ProfileRange range(st.prof, "collective", "all_reduce global_targets");
    job.host.all_reduce(&global_targets, &global_targets, 1, DType::i64, ReduceOp::sum)->wait();
  }
  // The reduction averages over the world, so scaling each rank's summed loss by
  // world / global_targets makes the reduced gradient the step's mean.
  const float grad_scale = static_cast<float>(
      job.scaler.scale() * static_cast<double>(job.world) /
      static_cast<double>(std::max<int64_t>(1, global_targets)));
  for (int64_t m0 = 0; m0 < B; m0 += micro) {
    st.timer.enter(Phase::forward);
    // cpu_offload: the micro-batches before the last accumulate their gradients on the device
    job.engine->set_gradient_accumulation_boundary(m0 + micro >= B);
    job.engine->begin_step(true);
    job.model->forward_backward(micro == B ? batch : batch.rows(m0, micro), grad_scale,
                                job.model_hooks(), st.loss_dev);
    job.end_model_call();
    job.engine->end_step();
  }
  return global_targets;
}

// The non-finite guard, once the step's loss and gradient norm are known on every rank
// (all-reduced; fp16 overflow, `skipped`, is the loss scaler's to handle): false when both
// are finite. Otherwise without train.skip_nonfinite the run stops before the update
// (rank 0 appends the step's metrics line first, then stop_nonfinite throws AgreedFailure on
// rank 0 and PeerFailed elsewhere, exit kExitRuntimeError); with it the step is recorded in
// result.nonfinite_steps, logged, and true returned (the update is to be skipped).
bool guard_nonfinite(Job& job, TrainResult& result, int64_t step, double loss, double norm,
                     bool skipped) {
  const bool nonfinite = !skipped && !(std::isfinite(loss) && std::isfinite(norm));
  if (!nonfinite) return false;
  if (!job.cfg.train.skip_nonfinite) {
    // The step's metrics line (JSON writes NaN and inf as null). Best effort: the stop
    // line below is the message, whatever the disk says.
    if (job.rank0()) {
      try {
        job.run_dir.metrics().append_line(
            nlohmann::json{{"step", step}, {"loss", loss}, {"grad_norm", norm},
                           {"nonfinite", true}}.dump());
      } catch (const Error&) {
      }
    }
    stop_nonfinite(job, step, loss, norm);
  }
  result.nonfinite_steps.push_back(step);
  std::ostringstream os;
  os << "step " << step << ": " << nonfinite_what(loss, norm)
     << ": update skipped (train.skip_nonfinite; " << result.nonfinite_steps.size()
     << " step(s) skipped so far)";
  job.log(os.str());
  return true;
}

// torchtitan's train_step: step job.step + 1 on every rank. Takes this rank's batch (take_batch), runs
// forward_backward_step, then (Phase::optimizer) the test hook inject_overflow_steps, fp16
// unscaling with one found-inf all-reduce, the loss all-reduce (both over the device world),
// global-norm clipping, the next step's batch (prefetch_batch), one copy of the step's scalars to the host, the non-finite guard,
// the optimizer step at the scheduled LR (unless fp16 overflow or a non-finite step skipped
// it), the loss-scale update and zero_grad, and waits for the device. Advances job.step and
// appends to result.losses, loss_scales, raw_allocs (and skipped_steps / nonfinite_steps).
// Starts the step's StepTimer step (Phase::data) and profiler step; end_step ends them.
StepOutcome train_step(Job& job, StepState& st, TrainResult& result) {
  const Config& cfg = job.cfg;
  const TrainOptions& opt = job.opt;
  const bool fp16 = cfg.mixed_precision.uses_fp16();
  Backend& be = *job.backend;
  Stream& stream = be.compute_stream();
  Communicator& dev_world = job.mesh->world();
  StepTimer& timer = st.timer;
  Profiler* const prof = st.prof;
  // One f64 device scalar all-reduced in place over the world, issue and wait profiled as
  // "all_reduce issue WHAT" / "all_reduce wait WHAT", the wait timed as comm_wait.
  // The names are built only while the profiler records.
  auto all_reduce_scalar = [&](void* scalar, ReduceOp op, const char* what) {
    ProfileRange issue(prof, "collective");
    if (issue) issue.name(std::string("all_reduce issue ") + what);
    auto work = dev_world.all_reduce(scalar, scalar, 1, DType::f64, op, stream);
    issue.end();
    StepTimer::Scope waiting(&timer, Phase::comm_wait);
    ProfileRange range(prof, "collective");
    if (range) range.name(std::string("all_reduce wait ") + what);
    work->wait();
  };
  const auto t0 = Clock::now();
  if (prof) prof->begin_step(job.step + 1);
  timer.begin(Phase::data);
  const AllocatorStats a0 = be.allocator_stats();
  const data::Batch batch = take_batch(job, st);
  StepOutcome o;
  o.step = job.step + 1;
  be.fill_zero(st.stats.view());
  const int64_t global_targets = forward_backward_step(job, st, batch);
  timer.enter(Phase::optimizer);
  if (std::find(opt.inject_overflow_steps.begin(), opt.inject_overflow_steps.end(), o.step) !=
          opt.inject_overflow_steps.end() &&
      job.host.rank() == opt.inject_rank) {
    job.engine->inject_nonfinite_grad();
  }
  if (fp16) {
    // GradScaler.unscale_: unscale this rank's shards, then one found-inf all-reduce so
    // every rank takes the same decision.
    job.scaler.unscale(*job.engine, st.inf_dev);
    all_reduce_scalar(st.inf_dev.data, ReduceOp::max, "found_inf");
  }
  all_reduce_scalar(st.loss_dev.data, ReduceOp::sum, "loss");
  job.clipper->clip(cfg.optim.grad_clip, st.norm_dev);
  prefetch_batch(job, st, o.step);  // while the device finishes the backward
  double host_stats[3] = {0, 0, 0};
  be.copy_to_host(host_stats, st.stats.view());  // the step's one wait for the device
  o.loss = host_stats[0] / static_cast<double>(std::max<int64_t>(1, global_targets));
  o.norm = host_stats[1];
  o.skipped = fp16 && host_stats[2] != 0.0;
  // Non-finite guard: fp16 overflow is the loss scaler's to handle (the step is skipped and
  // the scale backs off); any other non-finite loss or gradient norm stops the run before
  // the update, or with train.skip_nonfinite skips the update.
  o.nonfinite = guard_nonfinite(job, result, o.step, o.loss, o.norm, o.skipped);
  result.loss_scales.push_back(job.scaler.scale());
  job.step = o.step;
  o.lr = learning_rate(cfg.optim, cfg.train.max_steps, job.step);
  // Auxiliary-loss-free load balancing: the step's routing counts summed over the ranks
  // (every rank, every step, so the counts never outlive their step), the router biases
  // moved with the update (fsdp/train/router_bias.hpp).
  std::shared_ptr<const RouterBiasUpdate> router_bias;
  if (cfg.optim.moe_router_bias_update_rate > 0) {
    std::vector<Model::RouterLoad> loads = job.model->take_router_loads();
    std::vector<double> counts;
    for (const auto& l : loads) counts.insert(counts.end(), l.counts.begin(), l.counts.end());
    {
      StepTimer::Scope waiting(&timer, Phase::comm_wait);
      ProfileRange range(prof, "collective", "all_reduce router_counts");
      job.host.all_reduce(counts.data(), counts.data(), static_cast<int64_t>(counts.size()),
                          DType::f64, ReduceOp::sum)->wait();
    }
    std::size_t at = 0;
    for (auto& l : loads) {
      std::copy_n(counts.begin() + static_cast<std::ptrdiff_t>(at), l.counts.size(),
                  l.counts.begin());
      at += l.counts.size();
    }
    if (!o.skipped && !o.nonfinite) {
      router_bias = std::make_shared<const RouterBiasUpdate>(
          *job.engine, loads, cfg.optim.moe_router_bias_update_rate);
    }
  }
  if (o.skipped) {
    result.skipped_steps.push_back(o.step);
  } else if (!o.nonfinite) {
    job.optimizer->begin_update();  // optimizer shard u is unit u's (build_model)
    // By value: offloaded, the writes outlive this function. The clip coefficient is applied
    // as the update reads each gradient (it stays valid until the next clip), and an
    // offloaded unit's upload copy is written in the same pass. The router biases move first
    // (no gradient, no decay: the optimizer's step leaves them as they are then).
    job.engine->update_shards(
        [optimizer = job.optimizer.get(), lr = o.lr, clipper = job.clipper.get(),
         router_bias](int u, const TensorView& compute_copy) {
          if (router_bias) router_bias->apply(u);
          optimizer->step_shard(u, lr, clipper->coefficient(u), compute_copy);
        },
        job.step > cfg.fsdp.delayed_parameter_update_warmup_steps);
  }
  job.scaler.update(o.skipped);
  // update_shards consumed (zeroed) the gradients; offloaded, the host step goes on beside
  // the next forward (FsdpEngine::update_shards).
  if (o.skipped || o.nonfinite) job.engine->zero_grad();
  be.synchronize();
  o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const AllocatorStats a1 = be.allocator_stats();
  result.raw_allocs.push_back((a1.raw_allocs - a0.raw_allocs) + (a1.raw_frees - a0.raw_frees));
  result.losses.push_back(o.loss);
  return o;
}

// ---- The loop: evaluation, checkpoints, metrics, logging, signals ------------------------

// Everything after train_step `o`, on every rank in the same order: one max all-reduce over
// job.host agreeing on [0] the peak memory (bytes), [1] a stop signal (docs/checkpoint.md
// "Signals") and [2] whether a background checkpoint write is still running; evaluation
// (eval.every and the last step, not on a stop); the pending async save's commit; a
// checkpoint (checkpoint.every, the last step, a stop, unless checkpoint.enable is false;
// synchronous at the last step and on a stop); the end of the StepTimer step
// (result.step_times); rank 0's progress line (train.log_every, the last step, an
// evaluation) and the step's metrics.jsonl line (a failed write stops every rank, one line
// naming the file); the profiler window's trace. Returns
// true when a signal stops the run, with result.stop_signal, stop_rank and (on that rank)
// stop_message set.
bool end_step(Job& job, StepState& st, TrainResult& result, const StepOutcome& o) {
  const Config& cfg = job.cfg;
  const int world = job.world;
  Backend& be = *job.backend;
  StepTimer& timer = st.timer;
  // One max all-reduce: [0] the peak memory, [1] a stop signal: (world - rank) << 8 | signal,
  // so the max names the lowest signalled rank; [2] 1 while this rank's background
  // checkpoint write is still running (max 0: every write finished, the pending save is
  // committed below).
  const int my_signal = job.opt.pending_signal ? job.opt.pending_signal() : 0;
  // [3] fsdp.cpu_offload: this rank's host (offload runtime) peak, max over ranks.
  const bool offload = job.engine->offloaded();
  // [4] Mixture of experts: this rank's largest expert load of the step, in millionths.
  const double expert_load = job.model->take_max_expert_load();
  int64_t agreed[5] = {static_cast<int64_t>(be.memory().peak_total()),
                       my_signal > 0 ? (int64_t{world - job.host.rank()} << 8) | (my_signal & 0xff)
                                     : 0,
                       job.writer.finished() ? 0 : 1,
                       offload ? static_cast<int64_t>(
                                     job.engine->offload_runtime()->memory().peak_total())
                               : 0,
                       static_cast<int64_t>(std::llround(expert_load * 1e6))};
  {
    StepTimer::Scope waiting(&timer, Phase::comm_wait);
    ProfileRange range(st.prof, "collective", "all_reduce step_agreement");
    job.host.all_reduce(agreed, agreed, 5, DType::i64, ReduceOp::max)->wait();
  }
  StepReport report;
  report.outcome = o;
  report.peak = agreed[0];
  report.host_peak = offload ? agreed[3] : -1;
  report.max_expert_load = static_cast<double>(agreed[4]) / 1e6;
  report.tokens_per_step = st.tokens_per_step;
  report.mfu = st.peak_flops > 0 ? st.flops_per_step / (o.seconds * world * st.peak_flops) : -1;
  report.loss_scale = result.loss_scales.back();
  const bool last = job.step == cfg.train.max_steps;
  const bool stopping = agreed[1] != 0 && !last;  // a signal: evaluate nothing more
  if (!stopping && (last || (cfg.eval.every > 0 && job.step % cfg.eval.every == 0))) {
    timer.enter(Phase::eval);
    const Evaluation e = evaluate(job);
    report.val_loss = e.loss;
    report.val_loss_per_path = e.per_path;
    result.val_losses.push_back({job.step, e.loss});
  }
  // Every background write finished (agreed[2]): commit the pending save (a failed write
  // stops the run here, on every rank).
  timer.enter(Phase::checkpoint);
  if (job.pending && agreed[2] == 0) finish_pending_save(job);
  if (cfg.checkpoint.enable &&
      (last || stopping || (cfg.checkpoint.every > 0 && job.step % cfg.checkpoint.every == 0))) {
    // The final save and the save on a stop signal are synchronous.
    save_checkpoint(job, cfg.checkpoint.async_save && !last && !stopping);
  }
  report.times = timer.end();
  result.step_times.push_back(report.times);
  if (job.step % cfg.train.log_every == 0 || last || report.val_loss) {
    job.log(progress_line(job, report));
  }
  // A failed write (full disk) stops every rank here with one line naming metrics.jsonl.
  const std::string line = metrics_line(job, report).dump();
  collective_guard(job.host, [&] {
    if (job.rank0()) job.run_dir.metrics().append_line(line);
  });
  if (st.prof && st.prof->end_step()) write_trace(job, st.prof);  // the window's last step
  if (!stopping) return false;
  result.stop_signal = static_cast<int>(agreed[1] & 0xff);
  result.stop_rank = world - static_cast<int>(agreed[1] >> 8);
  if (job.host.rank() == result.stop_rank) {
    const std::string step = std::to_string(job.step);
    result.stop_message =
        "received " + signal_name(result.stop_signal) + " on rank " +
        std::to_string(result.stop_rank) + " (host " + host_name() + "); " +
        (cfg.checkpoint.enable ? "saved checkpoint " + ckpt::step_dir(cfg.train.run_dir, job.step) +
                                     " at step " + step + "; resume with --resume"
                               : "stopped at step " + step +
                                     " without saving (checkpoint.enable = false)");
  }
  return true;
}

// The loop after setup(): the evaluation before training (eval.on_start, a fresh run), the
// step state and the profiler (one guard), then train_step and end_step until
// train.max_steps, a stop signal or TrainOptions::stop_after; then the pending save's commit,
// the trace of a window the run did not finish, and result.final_step, peak_bytes (this
// rank's measured peaks, bytes) and, if asked, params. Collective over job.host.
void run_loop(Job& job, const Setup& s, TrainResult& result) {
  const Config& cfg = job.cfg;
  if (cfg.eval.on_start && job.step == 0) {  // HF TrainingArguments.eval_on_start
    const Evaluation e = evaluate(job);
    result.val_losses.push_back({0, e.loss});
    std::ostringstream os;
    os << "step 0/" << cfg.train.max_steps << " | val_loss " << format_val_loss(e);
    job.log(os.str());
    nlohmann::json line{{"step", 0}, {"tokens", 0}, {"val_loss", e.loss}};
    if (!e.per_path.empty()) line["val_loss_per_path"] = e.per_path;
    collective_guard(job.host, [&] {
      if (job.rank0()) job.run_dir.metrics().append_line(line.dump());
    });
  }
  StepState st(job, s);
  job.engine->set_step_timer(&st.timer);
  // train.profile_steps: the steps' phases, collectives (and CUDA kernels) into run_dir/profile/.
  collective_guard(job.host, [&] {
    job.profiler = make_profiler(cfg, *job.backend, job.host.rank());
  });
  st.prof = job.profiler.get();
  st.timer.set_profiler(st.prof);
  job.engine->set_profiler(st.prof);
  while (job.step < cfg.train.max_steps) {
    const StepOutcome o = train_step(job, st, result);
    if (end_step(job, st, result, o)) break;
    if (job.opt.stop_after > 0 && job.step >= job.opt.stop_after) break;
  }
  finish_pending_save(job);  // --stop-after: the save in flight is committed before returning
  write_trace(job, st.prof);  // a run that ended before the window's last step
  result.final_step = job.step;
  Backend& be = *job.backend;
  DeviceRuntime* offload = job.engine->offload_runtime();
  for (int c = 0; c < kNumMemCategories; ++c) {
    result.peak_bytes[static_cast<std::size_t>(c)] =
        static_cast<int64_t>(be.memory().peak(static_cast<MemCategory>(c)));
    if (offload) {
      result.host_peak_bytes[static_cast<std::size_t>(c)] =
          static_cast<int64_t>(offload->memory().peak(static_cast<MemCategory>(c)));
    }
  }
  result.save_staging_bytes = job.writer.staged_bytes();
  if (job.opt.gather_params) result.params = job.engine->gather_full_params();
  if (job.graphs) {
    const KernelGraphStats& g = job.graphs->stats();
    result.graphs = g;
    std::ostringstream os;
    os << "cuda_graphs: " << g.segments << " segments: " << g.replays << " replayed, "
       << g.captures << " captured, " << g.eager << " eager; " << g.graphed_calls << " of "
       << g.calls << " kernel calls in graphs (" << job.graphs->graphs() << " graphs kept"
       << (g.capture_failed ? "; a capture failed on rank 0: eager since" : "") << ")";
    job.log(os.str());
  }
}

}  // namespace

// setup(), then the loop of train_step and end_step (run_loop); see trainer.hpp.
TrainResult train(const Config& cfg, Runtime& rt, Communicator& group, const TrainOptions& opt,
                  std::ostream& out) {
  Job job{cfg, opt, out, rt, group};
  TrainResult result;
  const Setup s = setup(job, result);
  if (!s.done) run_loop(job, s, result);
  return result;
}

}  // namespace fsdp
