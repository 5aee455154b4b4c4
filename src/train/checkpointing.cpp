// The trainer's checkpointing: save (synchronous and async), resume and init_from; torchtitan's
// CheckpointManager role (see job.hpp, docs/checkpoint.md).
#include "job.hpp"

#include <sys/statvfs.h>

#include <charconv>
#include <filesystem>
#include <limits>

namespace fsdp::train_impl {

ckpt::CheckpointMeta checkpoint_meta(Job& job) {
  ckpt::CheckpointMeta m;
  m.step = job.step;
  m.world_size = job.host.size();
  m.shard_size = job.engine->num_shards();
  m.replicate_size = job.engine->replicate_comm().size();
  m.shard_index = job.engine->shard_index();
  m.sharding_strategy = to_string(job.cfg.fsdp.sharding_strategy);
  m.optimizer = to_string(job.cfg.optim.name);
  m.model_config_json = model_config_json(job.cfg.model).dump();
  m.train_config_toml = to_toml(job.cfg);
  m.config_fingerprint = ckpt::config_fingerprint(m.train_config_toml);
  m.run_id = job.run_id;
  m.launch_id = job.launch_id;
  m.seed = job.cfg.train.seed;
  m.sampler_epoch = job.sampler->epoch_of(job.step);
  m.sampler_position = job.sampler->position_in_epoch(job.step);
  m.optimizer_updates = job.optimizer ? job.optimizer->num_updates() : job.step;
  m.loss_scale = job.scaler.enabled() ? job.scaler.scale() : 0.0;
  m.loss_scale_good_steps = job.scaler.growth_tracker();
  return m;
}

bool writes_shard_file(const Job& job) {
  return replicate_group_of(job.cfg.fsdp.sharding_strategy, *job.mesh).rank() == 0;
}

int node_shard_writers(Job& job) {
  const int32_t mine[2] = {job.mesh->node_leader(), writes_shard_file(job) ? 1 : 0};
  std::vector<int32_t> all(2 * static_cast<std::size_t>(job.world));
  job.host.all_gather(mine, all.data(), 2, DType::i32)->wait();
  int writers = 0;
  for (std::size_t r = 0; r < all.size(); r += 2) writers += all[r] == mine[0] ? all[r + 1] : 0;
  return writers;
}

// The views of this rank's shards (parameters, then optimizer state, unit by unit) for
// write_shard_file. With `stage` (async saves) every buffer is copied into the writer's
// reused staging buffers, so training may change the shards while the file is written;
// without it host memory (the CPU backend's, an offloaded unit's) is read in place and a
// device unit's view fetches each dataset as the writer reaches it (ckpt::ShardFetch: one
// dataset in host memory at a time).
std::vector<ckpt::UnitShardView> shard_views(Job& job, bool stage) {
  std::size_t next = 0;
  auto host = [&](DeviceRuntime& shards, const TensorView& v) -> const float* {
    if (stage) {
      float* dst = job.writer.buffer(next++, v.numel());
      shards.copy_to_host(dst, v);
      return dst;
    }
    return v.f32();  // a device pointer when fetched (below)
  };
  std::vector<ckpt::UnitShardView> views;
  for (int u = 0; u < job.engine->num_units(); ++u) {
    // The unit's runtime: host memory for an offloaded unit.
    DeviceRuntime& shards = job.engine->shard_runtime(u);
    ckpt::UnitShardView v{&job.engine->layout(u), host(shards, job.engine->shard_param(u)), {},
                          {}};
    if (!stage && shards.device() != Device::cpu) {
      v.fetch = [&shards](const float* src, float* dst, int64_t n) {
        shards.copy_to_host(dst, TensorView(src, DType::f32, Shape{n}));
      };
    }
    // Dataset names: the torch.optim state names (to_string(OptimState)), as always.
    for (const OptimState st : job.optimizer->states()) {
      v.state.push_back({to_string(st), host(shards, job.optimizer->state(u, st))});
    }
    views.push_back(std::move(v));
  }
  return views;
}

// Rank 0 removes `tmp` unless the save was committed (a failure on any rank: every rank is
// past the failed guard, so no writer is still at work there).
struct DiscardUnlessCommitted {
  bool rank0, committed = false;
  std::string tmp;
  ~DiscardUnlessCommitted() {
    if (rank0 && !committed) ckpt::discard_tmp_step_dir(tmp);
  }
};

// Rank 0 renames step_N.tmp to step_N and points `latest` at it (guarded), then, with
// checkpoint.save_total_limit, removes the oldest checkpoints beyond it. A removal that fails
// is a warning line: the new checkpoint is committed and the run goes on.
void commit_save(Job& job, int64_t step, const std::string& tmp) {
  collective_guard(job.host, [&] {
    if (!job.rank0()) return;
    ckpt::commit_step_dir(tmp, ckpt::step_dir(job.cfg.train.run_dir, step));
    ckpt::publish_latest(job.cfg.train.run_dir, step);
  });
  const int64_t limit = job.cfg.checkpoint.save_total_limit;
  if (!job.rank0() || limit == 0) return;
  const ckpt::PruneResult pruned = ckpt::prune_step_dirs(job.cfg.train.run_dir, step, limit);
  for (const std::string& name : pruned.removed) {
    job.log("checkpoint: removed " + name + " (checkpoint.save_total_limit = " +
            std::to_string(limit) + ")");
  }
  for (const std::string& e : pruned.errors) {
    write_line(2, "warning: checkpoint.save_total_limit: " + e);
  }
}

// Finishes the async save in flight: every rank joins its writer (blocks until its file is
// written; at once when the step-boundary all-reduce said all are done), one guard agrees
// whether every write succeeded (a failure, e.g. ENOSPC, stops the run with the failing
// rank's line naming its file), then the commit. On failure rank 0 removes step_N.tmp.
void finish_pending_save(Job& job) {
  if (!job.pending) return;
  const Job::PendingSave p = *job.pending;
  job.pending.reset();
  DiscardUnlessCommitted cleanup{job.rank0(), false, p.tmp};
  collective_guard(job.host, [&] { job.writer.wait(); });
  commit_save(job, p.step, p.tmp);
  cleanup.committed = true;
  job.last_checkpoint = p.step;
  std::ostringstream os;
  os << "checkpoint: " << ckpt::step_dir(job.cfg.train.run_dir, p.step) << " (committed at step "
     << job.step << ", " << std::fixed << std::setprecision(1)
     << std::chrono::duration<double, std::milli>(Clock::now() - p.started).count()
     << " ms after the save began; rank 0 wrote its file in " << job.writer.last_write_ms()
     << " ms)";
  job.log(os.str());
}

// A save of step job.step, in guarded phases: rank 0 prepares step_N.tmp; every shard
// owner (replica 0 of the shard group) writes its file there; rank 0 renames the directory
// to step_N and points `latest` at it. A crash at any point leaves the previous checkpoint
// and `latest` intact. A failure on any rank (a full disk) is agreed by the guards; rank 0
// then removes step_N.tmp, so the previous checkpoint stays, no temporary is left, and the
// agreed error (one line naming the file) stops the run.
//
// `async` (checkpoint.async_save, periodic saves only): the second phase only stages the
// shards into host buffers and starts the background writer; the save stays pending until
// finish_pending_save commits it (at the first step boundary after every rank's write
// finished, or before the next save, or at the end of the run). A save always finishes the
// previous pending one first. A delayed parameter update (fsdp.delayed_parameter_update) is
// completed first, as a resumed run starts from it: the step after a save uses the updated
// parameters in both.
void save_checkpoint(Job& job, bool async) {
  finish_pending_save(job);
  job.engine->complete_update();
  const auto t0 = Clock::now();
  const std::string& run_dir = job.cfg.train.run_dir;
  const std::string tmp = ckpt::tmp_step_dir(run_dir, job.step);
  DiscardUnlessCommitted cleanup{job.rank0(), false, tmp};
  collective_guard(job.host, [&] {
    if (job.rank0()) ckpt::prepare_tmp_step_dir(tmp);
  });
  const bool writes = writes_shard_file(job);
  if (async) {
    job.pending = Job::PendingSave{job.step, tmp, t0};
    cleanup.committed = true;  // from here on the pending save (or ~Job) owns the directory
    collective_guard(job.host, [&] {
      if (!writes) return;
      auto views = shard_views(job, /*stage=*/true);
      const auto meta = checkpoint_meta(job);
      job.writer.start(
          (fs::path(tmp) / ckpt::shard_file_name(meta.shard_index, meta.shard_size)).string(),
          meta, std::move(views));
    });
    std::ostringstream os;
    os << "checkpoint: " << ckpt::step_dir(run_dir, job.step) << " staged in " << std::fixed
       << std::setprecision(1)
       << std::chrono::duration<double, std::milli>(Clock::now() - t0).count()
       << " ms; writing in the background";
    job.log(os.str());
    return;
  }
  collective_guard(job.host, [&] {
    if (!writes) return;
    const auto meta = checkpoint_meta(job);
    const auto views = shard_views(job, /*stage=*/false);
    const std::string file =
        (fs::path(tmp) / ckpt::shard_file_name(meta.shard_index, meta.shard_size)).string();
    ckpt::write_shard_file(file, meta, views);
  });
  commit_save(job, job.step, tmp);
  cleanup.committed = true;
  job.last_checkpoint = job.step;
  std::ostringstream os;
  os << "checkpoint: " << ckpt::step_dir(run_dir, job.step) << " (" << std::fixed
     << std::setprecision(1) << std::chrono::duration<double, std::milli>(Clock::now() - t0).count()
     << " ms)";
  job.log(os.str());
}

int64_t save_bytes(Job& job) {
  const int states = static_cast<int>(job.optimizer->states().size());
  int64_t bytes = writes_shard_file(job) ? shard_file_bytes(*job.engine, states) : 0;
  job.host.all_reduce(&bytes, &bytes, 1, DType::i64, ReduceOp::sum)->wait();
  return bytes;
}

void warn_if_save_does_not_fit(Job& job) {
  if (!job.cfg.checkpoint.enable) return;
  const int64_t need = save_bytes(job);
  if (!job.rank0()) return;
  const std::string& dir = job.cfg.train.run_dir;
  struct statvfs fs_info{};
  if (statvfs(dir.c_str(), &fs_info) != 0) return;  // the save will say what is wrong
  const auto avail = static_cast<int64_t>(fs_info.f_bavail) *
                     static_cast<int64_t>(fs_info.f_frsize);
  if (need <= avail) return;
  write_line(2, "warning: checkpoint: a save writes " + human_bytes(static_cast<double>(need)) +
                    " (every shard's fp32 parameters and optimizer state) but train.run_dir (" +
                    dir + ") has " + human_bytes(static_cast<double>(avail)) +
                    " free: the final save will fail unless space is freed; move "
                    "train.run_dir or set checkpoint.enable = false");
}

// The hint a failed read of the checkpoint in `dir` ends with: the run's checkpoints of lower
// steps, newest first (up to 3), and the --resume=STEP that continues from the newest; "" when
// there is none.
std::string earlier_checkpoints_hint(const std::string& run_dir, const std::string& dir) {
  const std::string name = std::filesystem::path(dir).filename().string();
  int64_t failed = std::numeric_limits<int64_t>::max();
  if (name.rfind("step_", 0) == 0)
    std::from_chars(name.data() + 5, name.data() + name.size(), failed);
  std::vector<int64_t> earlier;
  for (const int64_t s : ckpt::checkpoint_steps(run_dir))
    if (s < failed) earlier.push_back(s);
  if (earlier.empty()) return "";
  std::string list;
  for (std::size_t i = 0; i < earlier.size() && i < 3; ++i)
    list += (i ? ", " : "") + ckpt::step_dir_name(earlier[earlier.size() - 1 - i]);
  return "; earlier checkpoints of this run: " + list + (earlier.size() > 3 ? ", ..." : "") +
         " (--resume=" + std::to_string(earlier.back()) + " continues from the newest of them)";
}

// Runs `read`, which opens or reads the checkpoint in `dir`. An input error it throws (a
// corrupted, truncated or incomplete step directory) is rethrown with
// earlier_checkpoints_hint appended, so a run whose newest checkpoint is damaged is told
// which one to continue from.
template <class Read>
auto with_earlier_checkpoints(const std::string& run_dir, const std::string& dir, Read&& read) {
  try {
    return read();
  } catch (const Error& e) {
    if (e.exit_code() != kExitInputError) throw;
    const std::string hint = earlier_checkpoints_hint(run_dir, dir);
    if (hint.empty()) throw;
    throw Error(e.what() + hint, e.exit_code());
  }
}

// Resume, in two guarded phases. 1: rank 0 opens the metadata of every shard file of the
// step `latest` names, or --resume=STEP's (CheckpointSet::open: same step, mesh, layouts,
// fingerprint; a mixed
// directory fails here, on one rank, instead of ranks disagreeing later), checks the stored
// config against the run's (ckpt::check_resume_config) and train.max_steps against the step.
// 2: every rank opens the set's metadata and fills its shards: from the file of its own
// shard index when shard count and unit layouts are unchanged, else by parameter name from
// the old files' flat ranges that overlap its new shard (ckpt::read_resharded: a different
// world size, mesh.shard_size or sharding strategy). Every read verifies the dataset's
// checksum and finiteness. Nothing is read before phase 1 passed. Returns shard 0's meta
// (the saving run's world and shard size, for the log) and sets `step_dir` to the directory
// read. A failed open or read ends with the run's earlier checkpoints
// (with_earlier_checkpoints); the step directory's name must be its files' step.
ckpt::CheckpointMeta load_checkpoint(Job& job, std::string& step_dir) {
  const std::string& run_dir = job.cfg.train.run_dir;
  std::optional<std::string> latest;
  std::optional<ckpt::CheckpointSet> validated;  // rank 0: phase 1's set, reused in phase 2
  collective_guard(job.host, [&] {
    if (!job.opt.resume_from.empty()) {
      latest = ckpt::resume_step_dir(run_dir, job.opt.resume_from);
    } else {
      latest = ckpt::find_latest(run_dir);
    }
    if (!latest) {
      throw InputError("--resume: no checkpoint in " + ckpt::checkpoints_dir(run_dir) +
                       " (train.run_dir = \"" + run_dir + "\")");
    }
    step_dir = *latest;
    if (!job.rank0()) return;
    const ckpt::CheckpointSet& set = validated.emplace(with_earlier_checkpoints(
        run_dir, *latest, [&] { return ckpt::CheckpointSet::open(*latest); }));
    const std::string& file = set.shard(0).path();
    if (ckpt::step_dir_name(set.meta().step) !=
        std::filesystem::path(*latest).lexically_normal().filename().string()) {
      throw InputError(file + ": step " + std::to_string(set.meta().step) + " is not the step " +
                       "its directory's name says (" + *latest + "): the step directory was " +
                       "renamed or its files copied from another step");
    }
    ckpt::check_resume_config(set.meta().train_config_toml, to_toml(job.cfg), file);
    if (set.meta().step > job.cfg.train.max_steps) {
      throw InputError("train.max_steps = " + std::to_string(job.cfg.train.max_steps) +
                       " is below the checkpoint's step " + std::to_string(set.meta().step) + " (" +
                       *latest + "); raise train.max_steps to continue the run");
    }
  });
  ckpt::CheckpointMeta saved;
  collective_guard(job.host, [&] {
    const ckpt::CheckpointMeta expected = checkpoint_meta(job);
    const std::vector<FlatParamLayout> layouts = job.engine->layouts();
    // Metadata of every shard file (no tensor data): a rank may need pieces of several.
    if (!validated) {
      validated.emplace(with_earlier_checkpoints(
          run_dir, *latest, [&] { return ckpt::CheckpointSet::open(*latest); }));
    }
    const ckpt::CheckpointSet& set = *validated;
    const ckpt::CheckpointMeta& m = set.meta();  // shard 0's: step, optimizer counters, scale
    if (m.optimizer != expected.optimizer) {
      throw InputError(set.shard(0).path() + ": incompatible checkpoint: optimizer differs (checkpoint has " +
                       m.optimizer + ", run has " + expected.optimizer + ")");
    }
    // Fast path: same shard count and unit layouts, so this rank's shard is exactly the file
    // of its shard index (the world size may differ, e.g. HYBRID_SHARD 2x2 -> FULL_SHARD on
    // 2). Otherwise each parameter is matched by name and only the flat ranges of this
    // rank's new shard are read from the old files (docs/checkpoint.md "Resharding on resume").
    const bool same = m.shard_size == expected.shard_size && ckpt::same_layouts(set.layouts(), layouts);
    const int64_t s = expected.shard_index;
    with_earlier_checkpoints(run_dir, *latest, [&] {
      for (int u = 0; u < job.engine->num_units(); ++u) {
        auto fill = [&](const std::string& dataset, float* out) {
          if (same) return set.shard(static_cast<int>(s)).read_unit(u, dataset, out);
          ckpt::read_resharded(set, layouts[static_cast<std::size_t>(u)], s, dataset, out);
        };
        // Read into host memory, then into the shards' runtime (in place in host memory).
        DeviceRuntime& shards = job.engine->shard_runtime(u);
        auto read = [&](const std::string& dataset, const TensorView& dst) {
          if (shards.device() == Device::cpu) return fill(dataset, dst.f32());
          std::vector<float> host(static_cast<std::size_t>(dst.numel()));
          fill(dataset, host.data());
          shards.copy_from_host(dst, host.data());
        };
        read("param", job.engine->shard_param(u));
        for (const OptimState st : job.optimizer->states())
          read(to_string(st), job.optimizer->state(u, st));
      }
    });
    job.step = m.step;
    job.last_checkpoint = m.step;
    if (!m.run_id.empty()) job.run_id = m.run_id;  // the run continues (a version-2 file: a new id)
    job.optimizer->set_num_updates(m.optimizer_updates < 0 ? m.step : m.optimizer_updates);
    job.scaler.load_state(m.loss_scale, m.loss_scale_good_steps);
    saved = m;
  });
  return saved;
}

// model.init_from: fills this rank's fp32 shards from a Hugging Face directory, reading only
// the bytes of the elements it owns (fsdp/checkpoint/init_from.hpp). Collective only through
// the guard around it. Returns what was read, for the log and TrainResult.
ckpt::InitFromResult load_init_from(Job& job) {
  const int n = job.engine->num_units();
  const std::vector<FlatParamLayout> layouts = job.engine->layouts();
  // Each unit's shard in place where it is host memory, else through a host copy.
  auto in_place = [&](int u) { return job.engine->shard_runtime(u).device() == Device::cpu; };
  std::vector<std::vector<float>> staged(static_cast<std::size_t>(n));
  std::vector<float*> shards;
  for (int u = 0; u < n; ++u) {
    if (in_place(u)) {
      shards.push_back(job.engine->shard_param(u).f32());
    } else {
      staged[static_cast<std::size_t>(u)].resize(static_cast<std::size_t>(layouts[u].shard_numel));
      shards.push_back(staged[static_cast<std::size_t>(u)].data());
    }
  }
  ckpt::InitFromResult r = ckpt::load_hf_shards(job.cfg.model.init_from, job.cfg.model, layouts,
                                                job.engine->shard_index(), shards);
  for (int u = 0; u < n; ++u) {
    if (in_place(u)) continue;
    job.engine->shard_runtime(u).copy_from_host(job.engine->shard_param(u),
                                                staged[static_cast<std::size_t>(u)].data());
  }
  return r;
}


// --resume=STEP loaded `step_dir`: rank 0 points `latest` at it unless it names it already,
// so a requeued --resume=auto continues from this run, not from the later checkpoints left
// behind (the run replaces those as it reaches their steps; save_total_limit leaves step
// directories above `latest` alone). One guard.
void point_latest_at(Job& job, const std::string& step_dir) {
  namespace fs = std::filesystem;
  const std::string& run_dir = job.cfg.train.run_dir;
  collective_guard(job.host, [&] {
    if (!job.rank0()) return;
    std::optional<std::string> latest;
    try {
      latest = ckpt::find_latest(run_dir);
    } catch (const Error&) {  // a damaged `latest`: replaced below
    }
    std::error_code ec;
    if (latest && fs::equivalent(*latest, step_dir, ec)) return;
    ckpt::publish_latest(run_dir, job.step);
    job.log("--resume=" + job.opt.resume_from + ": " + ckpt::checkpoints_dir(run_dir) +
            "/latest now names " + ckpt::step_dir_name(job.step) +
            (latest ? " (it named " + fs::path(*latest).filename().string() + ")" : "") +
            "; later step directories are replaced as the run reaches their steps");
  });
}

// The model's starting state: with `resume` the checkpoint's (load_checkpoint; job.step,
// the optimizer's counters and the fp16 loss scale follow it; model.init_from is ignored),
// else with model.init_from the Hugging Face weights (result.init_bytes_read), else the
// engine's initialisation. Logs what it did on rank 0. Returns true when there is nothing to
// train (resumed at train.max_steps: result.final_step and, if asked, result.params are set).
bool restore_state(Job& job, TrainResult& result, bool resume) {
  const Config& cfg = job.cfg;
  {  // This launch's id and a fresh run's id, drawn on rank 0 (ckpt::new_run_id never throws).
    char ids[64] = {};
    if (job.rank0()) (ckpt::new_run_id() + ckpt::new_run_id()).copy(ids, sizeof ids);
    job.host.broadcast(ids, sizeof ids, DType::u8, 0)->wait();
    job.run_id.assign(ids, 32);
    job.launch_id.assign(ids + 32, 32);
  }
  if (resume) {
    ckpt::CheckpointMeta saved;
    std::string step_dir;
    job.engine->write_shards([&] { saved = load_checkpoint(job, step_dir); });  // guarded inside
    const int world = job.world;
    const int shard_size = job.engine->num_shards();
    if (saved.world_size != world || saved.shard_size != shard_size) {
      job.log("resumed from step " + std::to_string(job.step) + ", resharded from world " +
              std::to_string(saved.world_size) + " (shard_size " + std::to_string(saved.shard_size) +
              ") to world " + std::to_string(world) + " (shard_size " + std::to_string(shard_size) + ")");
    } else {
      job.log("resumed from step " + std::to_string(job.step));
    }
    if (!cfg.model.init_from.empty()) {
      job.log("model.init_from ignored: resuming, the checkpoint's parameters win");
    }
    if (job.step == cfg.train.max_steps) {  // nothing to do: no training, no new checkpoint
      job.log("nothing to train: checkpoint is at step " + std::to_string(job.step) +
              " = train.max_steps");
      result.final_step = job.step;
      if (job.opt.gather_params) result.params = job.engine->gather_full_params();
      return true;
    }
    if (!job.opt.resume_from.empty()) point_latest_at(job, step_dir);
  } else if (!cfg.model.init_from.empty()) {
    ckpt::InitFromResult init;
    job.engine->write_shards([&] {
      collective_guard(job.host, [&] { init = load_init_from(job); });
    });
    result.init_bytes_read = static_cast<int64_t>(init.bytes_read);
    std::ostringstream os;
    os << "init_from: " << cfg.model.init_from << ": " << init.num_tensors << " tensors ("
       << human_bytes(static_cast<double>(init.model_bytes)) << " fp32); rank 0 read "
       << init.bytes_read << " bytes (" << human_bytes(static_cast<double>(init.bytes_read))
       << ") for its shard";
    if (!init.unused.empty()) {
      os << "\ninit_from: warning: " << init.unused.size()
         << " tensor(s) in the checkpoint are not used by the model:";
      for (std::size_t i = 0; i < init.unused.size() && i < 8; ++i) os << " " << init.unused[i];
      if (init.unused.size() > 8) os << " ...";
    }
    job.log(os.str());
  }
  return false;
}

}  // namespace fsdp::train_impl
