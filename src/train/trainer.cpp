// The training loop (see fsdp/train/trainer.hpp).
#include "fsdp/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/data/batch.hpp"
#include "fsdp/data/sampler.hpp"
#include "fsdp/data/token_dataset.hpp"
#include "fsdp/data/token_source.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/model/gpt2.hpp"
#include "fsdp/optim/optimizer.hpp"
#include "fsdp/train/collective_guard.hpp"

namespace fsdp {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024.0 && i < 4) {
    b /= 1024.0;
    ++i;
  }
  std::ostringstream os;
  os << std::fixed << std::setprecision(i == 0 ? 0 : 1) << b << " " << unit[i];
  return os.str();
}

std::string model_config_json(const ModelConfig& m) {
  nlohmann::json j = {{"model_type", m.type},          {"n_layer", m.n_layer},
                      {"n_head", m.n_head},            {"n_embd", m.n_embd},
                      {"n_positions", m.n_positions},  {"vocab_size", m.vocab_size},
                      {"layer_norm_epsilon", m.layer_norm_epsilon}};
  return j.dump();
}

int threads_per_rank(const Config& cfg, int local_size) {
  if (cfg.train.num_threads > 0) return static_cast<int>(cfg.train.num_threads);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, hw / std::max(1, local_size));
}

// Everything one job holds; built in guarded phases so a failure on any rank stops all.
struct Job {
  Job(const Config& c, const TrainOptions& o, std::ostream& s) : cfg(c), opt(o), out(s) {}
  const Config& cfg;
  const TrainOptions& opt;
  std::ostream& out;
  std::unique_ptr<MpiCommunicator> world;
  std::optional<DeviceMesh> mesh;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<data::TokenSource> train_src, val_src;
  std::optional<data::DistributedSampler> sampler;
  std::unique_ptr<Gpt2Model> model;
  std::unique_ptr<FsdpEngine> engine;
  std::unique_ptr<Optimizer> optimizer;
  std::ofstream metrics;
  int64_t step = 0;  // optimizer steps completed
  bool rank0() const { return world->rank() == 0; }
  void log(const std::string& line) {
    if (rank0() && !opt.quiet) out << line << std::endl;
  }
};

void open_data(Job& job) {
  const Config& cfg = job.cfg;
  const int64_t L = cfg.data.seq_len, V = cfg.model.vocab_size;
  if (cfg.data.source == "synthetic") {
    // A fixed-length random stream (epochs of 1024 steps), independent of train.max_steps,
    // so a run extended by --resume sees the same batches as an uninterrupted one.
    const int64_t n = 1024 * cfg.train.global_batch_size * L + 1;
    job.train_src = std::make_unique<data::SyntheticTokens>(n, V, cfg.train.seed);
    job.val_src = std::make_unique<data::SyntheticTokens>(64 * L + 1, V, cfg.train.seed + 1);
  } else {
    job.train_src = std::make_unique<data::TokenDataset>(cfg.data.path, "train", V, L);
    job.val_src = std::make_unique<data::TokenDataset>(cfg.data.path, "val", V, L);
  }
  job.sampler.emplace(data::num_samples_of(job.train_src->num_tokens(), L),
                      cfg.train.global_batch_size, job.world->rank(), job.world->size(),
                      cfg.train.seed);
}

std::vector<FlatParamLayout> unit_layouts(const FsdpEngine& engine) {
  std::vector<FlatParamLayout> layouts;
  for (int u = 0; u < engine.num_units(); ++u) layouts.push_back(engine.layout(u));
  return layouts;
}

// Rank 0's banner: resolved config, mesh, parameter count (from the unit layouts) and, when
// the data is open, its size. `list_units` adds one line per FSDP unit (--dry-run).
void print_banner(Job& job, const std::vector<FlatParamLayout>& layouts, bool list_units) {
  const Config& cfg = job.cfg;
  int64_t n = 0;
  for (const auto& l : layouts) n += l.numel;
  std::ostringstream os;
  os << "fsdp_train " << FSDP_VERSION << (job.opt.dry_run ? " (dry run)" : "")
     << "\n# resolved config (" << cfg.source_path << ")\n" << to_toml(cfg) << "\n"
     << "mesh: " << job.mesh->describe() << "; " << to_string(cfg.fsdp.sharding_strategy)
     << " shards each FlatParameter over " << layouts.front().num_shards << " rank(s)\n"
     << "model: " << cfg.model.type << ", " << n << " parameters (" << human_bytes(4.0 * n)
     << " fp32) in " << layouts.size() << " FSDP units";
  if (list_units) {
    for (const auto& l : layouts) {
      os << "\n  unit " << l.unit_name << ": " << l.entries.size() << " params, numel "
         << l.numel << ", padded " << l.padded_numel << ", shard " << l.shard_numel;
    }
  }
  os << "\ndata: " << job.train_src->num_tokens() << " train tokens, "
     << job.val_src->num_tokens() << " val tokens; " << job.sampler->steps_per_epoch()
     << " steps per epoch; " << job.sampler->local_batch() << " sequences per rank per step";
  job.log(os.str());
}

void print_memory_plan(Job& job, const std::vector<FlatParamLayout>& layouts) {
  const Config& cfg = job.cfg;
  const EngineMemoryPlan p = plan_memory(layouts, cfg.fsdp.sharding_strategy, cfg.optim.name);
  const int64_t acts = Gpt2Model::activation_bytes(
      cfg.model, cfg.train.global_batch_size / job.world->size(), cfg.data.seq_len);
  const int64_t total = p.sharded_params + p.unsharded_params + p.grads + p.unsharded_grads +
                        p.optimizer_state + acts + p.comm_buffers;
  std::ostringstream os;
  auto row = [&](const char* name, int64_t v) {
    os << "  " << std::left << std::setw(18) << name << std::right << std::setw(14) << v
       << "  " << human_bytes(static_cast<double>(v)) << "\n";
  };
  os << "memory plan per rank (bytes):\n";
  row("sharded_params", p.sharded_params);
  row("unsharded_params", p.unsharded_params);
  row("grads", p.grads);
  row("unsharded_grads", p.unsharded_grads);
  row("optimizer_state", p.optimizer_state);
  row("activations", acts);
  row("comm_buffers", p.comm_buffers);
  row("total", total);
  job.log(os.str());
}

double evaluate(Job& job) {
  const Config& cfg = job.cfg;
  const int64_t L = cfg.data.seq_len;
  const int64_t windows = data::num_val_windows(job.val_src->num_tokens(), L, cfg.eval.max_windows);
  const data::WindowRange mine = data::rank_windows(windows, job.world->rank(), job.world->size());
  const int64_t B = std::max<int64_t>(1, job.sampler->local_batch());
  // Every rank runs the same number of forward passes (they hold collectives); a rank with
  // no windows left runs window 0 and discards the result.
  int64_t chunks = (mine.size() + B - 1) / B;
  job.world->all_reduce(&chunks, &chunks, 1, DType::i64, ReduceOp::max)->wait();
  double sum = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    data::WindowRange r{mine.begin + c * B, std::min(mine.end, mine.begin + (c + 1) * B)};
    const bool dummy = r.size() <= 0;
    if (dummy) r = {0, 1};
    const data::Batch batch = data::load_windows(*job.val_src, r, L);
    job.engine->begin_step(false);
    const double s = job.model->forward_loss(batch.inputs.data(), batch.targets.data(), batch.B,
                                             batch.L, *job.engine);
    job.engine->end_step();
    if (!dummy) sum += s;
  }
  job.world->all_reduce(&sum, &sum, 1, DType::f64, ReduceOp::sum)->wait();
  return windows > 0 ? sum / static_cast<double>(windows * L) : std::nan("");
}

ckpt::CheckpointMeta checkpoint_meta(Job& job) {
  ckpt::CheckpointMeta m;
  m.step = job.step;
  m.world_size = job.world->size();
  m.shard_size = job.engine->num_shards();
  m.replicate_size = job.engine->replicate_comm().size();
  m.shard_index = job.engine->shard_index();
  m.sharding_strategy = to_string(job.cfg.fsdp.sharding_strategy);
  m.optimizer = job.cfg.optim.name;
  m.model_config_json = model_config_json(job.cfg.model);
  m.train_config_toml = to_toml(job.cfg);
  m.seed = job.cfg.train.seed;
  m.sampler_epoch = job.sampler->epoch_of(job.step);
  m.sampler_position = job.sampler->position_in_epoch(job.step);
  return m;
}

// Every shard owner writes its file into step_N.tmp/; once all have, rank 0 renames the
// directory to step_N and points `latest` at it. A crash at any point leaves the previous
// checkpoint and `latest` intact.
void save_checkpoint(Job& job) {
  const std::string& run_dir = job.cfg.train.run_dir;
  const std::string tmp = ckpt::tmp_step_dir(run_dir, job.step);
  collective_guard(*job.world, [&] {
    if (job.rank0()) ckpt::prepare_tmp_step_dir(tmp);
  });
  collective_guard(*job.world, [&] {
    if (job.engine->replicate_comm().rank() != 0) return;  // replicas hold identical shards
    const auto meta = checkpoint_meta(job);
    std::vector<ckpt::UnitShardView> views;
    for (int u = 0; u < job.engine->num_units(); ++u) {
      ckpt::UnitShardView v{&job.engine->layout(u), job.engine->shard_param(u), {}};
      for (const auto& name : job.optimizer->state_names()) {
        v.state.push_back({name, job.optimizer->state(u, name)});
      }
      views.push_back(std::move(v));
    }
    const std::string file =
        (fs::path(tmp) / ckpt::shard_file_name(meta.shard_index, meta.shard_size)).string();
    ckpt::write_shard_file(file, meta, views);
  });
  collective_guard(*job.world, [&] {
    if (!job.rank0()) return;
    ckpt::commit_step_dir(tmp, ckpt::step_dir(run_dir, job.step));
    ckpt::publish_latest(run_dir, job.step);
  });
  job.log("checkpoint: " + ckpt::step_dir(run_dir, job.step));
}

void load_checkpoint(Job& job) {
  const std::string& run_dir = job.cfg.train.run_dir;
  const auto latest = ckpt::find_latest(run_dir);
  if (!latest) {
    throw InputError("--resume: no checkpoint in " + ckpt::checkpoints_dir(run_dir) +
                     " (train.run_dir = \"" + run_dir + "\")");
  }
  ckpt::CheckpointMeta expected = checkpoint_meta(job);
  const std::vector<FlatParamLayout> layouts = unit_layouts(*job.engine);
  // Opens this rank's shard file and checks mesh, optimizer and unit layouts against ours.
  const ckpt::ShardFile shard = ckpt::open_for_resume(*latest, expected, layouts);
  for (int u = 0; u < job.engine->num_units(); ++u) {
    shard.read_unit(u, "param", job.engine->shard_param(u));
    for (const auto& name : job.optimizer->state_names()) {
      shard.read_unit(u, name, job.optimizer->state(u, name));
    }
  }
  job.step = shard.meta().step;
}

}  // namespace

TrainResult train(const Config& cfg, MPI_Comm world_comm, const TrainOptions& opt,
                  std::ostream& out) {
  Job job{cfg, opt, out};
  job.world = std::make_unique<MpiCommunicator>(world_comm);
  TrainResult result;

  collective_guard(*job.world, [&] { job.mesh.emplace(DeviceMesh::create(world_comm, cfg.mesh.shard_size)); });
  const int num_shards = static_cast<int>(shards_for(cfg.fsdp.sharding_strategy, job.mesh->world_size(), job.mesh->shard_size()));
  collective_guard(*job.world, [&] {
    if (cfg.train.global_batch_size % job.world->size() != 0) {
      throw InputError("train.global_batch_size: " + std::to_string(cfg.train.global_batch_size) +
                       " is not divisible by the world size " + std::to_string(job.world->size()));
    }
    open_data(job);
  });

  if (opt.dry_run) {
    collective_guard(*job.world, [&] {
      job.backend = make_cpu_backend(1);
      Gpt2Model model(cfg.model, *job.backend);
      const auto layouts = build_unit_layouts(model.modules(), cfg.fsdp, num_shards);
      print_banner(job, layouts, /*list_units=*/true);
      print_memory_plan(job, layouts);
      for (const auto& l : layouts) result.num_params += l.numel;
    });
    return result;
  }

  collective_guard(*job.world, [&] {
    job.backend = make_cpu_backend(threads_per_rank(cfg, job.mesh->local_size()));
    job.model = std::make_unique<Gpt2Model>(cfg.model, *job.backend);
    job.engine = std::make_unique<FsdpEngine>(job.model->modules(), cfg.fsdp, *job.mesh,
                                              *job.backend, cfg.train.seed);
    job.optimizer = std::make_unique<Optimizer>(cfg.optim, *job.backend);
    for (int u = 0; u < job.engine->num_units(); ++u) {
      job.optimizer->add_shard(job.engine->shard_param(u), job.engine->shard_grad(u),
                               job.engine->shard_numel(u),
                               decay_segments(job.engine->layout(u), job.engine->shard_index()));
    }
    if (!opt.resume && ckpt::find_latest(cfg.train.run_dir)) {
      throw InputError("train.run_dir: \"" + cfg.train.run_dir +
                       "\" already holds checkpoints; pass --resume to continue that run or "
                       "choose another train.run_dir");
    }
  });
  result.num_params = job.engine->num_params();
  const std::vector<FlatParamLayout> layouts = unit_layouts(*job.engine);
  print_banner(job, layouts, /*list_units=*/false);
  if (opt.resume) {
    collective_guard(*job.world, [&] { load_checkpoint(job); });
    job.log("resumed from step " + std::to_string(job.step));
  }
  collective_guard(*job.world, [&] {
    if (!job.rank0()) return;
    fs::create_directories(cfg.train.run_dir);
    const std::string path = (fs::path(cfg.train.run_dir) / "metrics.jsonl").string();
    job.metrics.open(path, opt.resume ? std::ios::app : std::ios::trunc);
    if (!job.metrics) throw InputError("train.run_dir: cannot write " + path);
  });

  const int64_t T = cfg.data.seq_len;
  const int64_t B = job.sampler->local_batch();
  const double tokens_per_step = static_cast<double>(cfg.train.global_batch_size * T);
  while (job.step < cfg.train.max_steps) {
    const auto t0 = Clock::now();
    const data::Batch batch =
        data::load_batch(*job.train_src, job.sampler->sample_indices(job.step), T);
    job.engine->begin_step(true);
    double loss = job.model->forward_backward(batch.inputs.data(), batch.targets.data(), B, T,
                                              1.f / static_cast<float>(B * T), *job.engine);
    job.engine->end_step();
    job.world->all_reduce(&loss, &loss, 1, DType::f64, ReduceOp::sum)->wait();
    loss /= tokens_per_step;
    const double norm = job.engine->grad_norm();
    if (cfg.optim.grad_clip > 0 && norm > cfg.optim.grad_clip) {
      job.engine->scale_grads(static_cast<float>(cfg.optim.grad_clip / (norm + 1e-6)));
    }
    ++job.step;
    const double lr = learning_rate(cfg.optim, cfg.train.max_steps, job.step);
    job.optimizer->step(lr, job.step);
    job.backend->synchronize();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    result.losses.push_back(loss);

    int64_t peak = static_cast<int64_t>(job.backend->memory().peak_total());
    job.world->all_reduce(&peak, &peak, 1, DType::i64, ReduceOp::max)->wait();
    nlohmann::json line = {{"step", job.step},         {"loss", loss},
                           {"lr", lr},                 {"grad_norm", norm},
                           {"tokens_per_sec", tokens_per_step / seconds},
                           {"peak_mem_bytes", peak}};
    const bool last = job.step == cfg.train.max_steps;
    if (last || (cfg.eval.every > 0 && job.step % cfg.eval.every == 0)) {
      const double val = evaluate(job);
      line["val_loss"] = val;
      result.val_losses.push_back({job.step, val});
    }
    if (job.step % cfg.train.log_every == 0 || last || line.contains("val_loss")) {
      std::ostringstream os;
      os << "step " << job.step << "/" << cfg.train.max_steps << " | loss " << std::fixed
         << std::setprecision(4) << loss << " | lr " << std::scientific << std::setprecision(2)
         << lr << " | grad_norm " << std::fixed << std::setprecision(3) << norm << " | "
         << std::setprecision(0) << tokens_per_step / seconds << " tok/s | peak mem "
         << human_bytes(static_cast<double>(peak));
      if (line.contains("val_loss")) {
        os << " | val_loss " << std::setprecision(4) << line["val_loss"].get<double>();
      }
      job.log(os.str());
    }
    if (job.rank0()) job.metrics << line.dump() << "\n" << std::flush;
    if (last || (cfg.checkpoint.every > 0 && job.step % cfg.checkpoint.every == 0)) {
      save_checkpoint(job);
    }
    if (opt.stop_after > 0 && job.step >= opt.stop_after) break;
  }
  result.final_step = job.step;
  if (opt.gather_params) result.params = job.engine->gather_full_params();
  return result;
}

}  // namespace fsdp
