// The trainer's reporting: banner, memory plan, the step line's phases (see job.hpp).
#include "job.hpp"

#include "fsdp/core/build_info.hpp"

namespace fsdp::train_impl {

// `x` with an SI prefix and 3 significant digits, e.g. "5.73 M" (the unit follows).
std::string si(double x) {
  static const char* prefix[] = {"", "k", "M", "G", "T", "P", "E"};
  int i = 0;
  while (std::abs(x) >= 1000 && i < 6) {
    x /= 1000;
    ++i;
  }
  std::ostringstream os;
  os << std::setprecision(3) << x << " " << prefix[i];
  return os.str();
}

// Tokens a step processes (throughput): inputs, plus the decoder's targets when the
// objective has a separate target sequence.
int64_t tokens_per_sample(const Config& cfg) {
  const data::BatchShape shape = data::batch_shape(cfg);
  // A decoder's rows (causal_lm, sft) are one sequence; T5's an input and a target.
  const bool decoder =
      cfg.data.objective == Objective::causal_lm || cfg.data.objective == Objective::sft;
  return shape.L + (decoder ? 0 : shape.target_len);
}

// Model FLOPs (ModelFamily::train_flops_per_sample) per token of tokens_per_sample.
double flops_per_token(const Config& cfg) {
  return model_family(cfg.model.type).train_flops_per_sample(cfg.model, data::batch_shape(cfg)) /
         static_cast<double>(tokens_per_sample(cfg));
}

std::string format_startup(const std::vector<std::pair<std::string, double>>& phases) {
  double total = 0;
  bool launch = false;
  for (const auto& [name, s] : phases) {
    total += s;
    launch = launch || name == "launch";
  }
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << "start-up: " << total << " s from "
     << (launch ? "process start" : "train()") << " =";
  for (std::size_t i = 0; i < phases.size(); ++i) {
    os << (i == 0 ? " " : " + ") << phases[i].first << " " << phases[i].second;
  }
  os << " (seconds; model = allocation and initialisation of the shards and optimizer state)";
  return os.str();
}

// "152.3 ms = data 0.8 + fwd 50.1 + bwd 80.2 + comm 10.0 + opt 11.2 (+ eval, ckpt when
// non-zero)": the progress line's phase breakdown, milliseconds.
std::string format_step_times(const StepTimes& t) {
  static const char* kShort[kNumPhases] = {"data", "fwd", "bwd", "comm", "opt", "eval", "ckpt"};
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << 1e3 * t.step_s << " ms =";
  for (int p = 0; p < kNumPhases; ++p) {
    const double ms = 1e3 * t.phase_s[static_cast<std::size_t>(p)];
    const auto phase = static_cast<Phase>(p);
    if ((phase == Phase::eval || phase == Phase::checkpoint) && ms < 0.05) continue;
    os << (p == 0 ? " " : " + ") << kShort[p] << " " << ms;
  }
  return os.str();
}

// Rank 0's banner: resolved config, mesh, parameter count (from the unit layouts) and, when
// the data is open, its size. `list_units` adds one line per FSDP unit (--dry-run).
void print_banner(Job& job, const std::vector<FlatParamLayout>& layouts, bool list_units) {
  const Config& cfg = job.cfg;
  int64_t n = 0;
  for (const auto& l : layouts) n += l.numel;
  std::ostringstream os;
  os << "fsdp_train " << build_id() << (job.opt.dry_run ? " (dry run)" : "");
  if (job.planning()) {
    os << "\nplan for " << job.world << " ranks (--world-size; this process runs in a world of "
       << job.host.size() << ")";
  }
  std::ostringstream mesh;
  if (job.planning()) {
    mesh << "world " << job.world << " = replicate " << job.world / job.plan_shard_size
         << " x shard " << job.plan_shard_size << " (planned)";
  } else {
    mesh << job.mesh->describe();
  }
  os
     << "\n# resolved config (" << cfg.source_path << ")\n" << to_toml(cfg) << "\n"
     << "device: " << job.rt.device_description() << "\n"
     << "mesh: " << mesh.str() << "; " << to_string(cfg.fsdp.sharding_strategy)
     << " shards each FlatParameter over " << layouts.front().num_shards << " rank(s); "
     << "param_dtype " << to_string(cfg.mixed_precision.param_dtype) << ", reduce_dtype "
     << to_string(cfg.mixed_precision.reduce_dtype) << "\n"
     << "model: " << cfg.model.type << ", " << n << " parameters (" << human_bytes(4.0 * n)
     << " fp32) in " << layouts.size() << " FSDP units";
  int64_t pad = 0;  // vocabulary pad rows' elements (model.pad_vocab_multiple)
  for (const auto& l : layouts)
    for (const auto& e : l.entries) pad += e.spec.numel() - e.spec.unpadded_numel();
  if (pad > 0) {
    os << ", " << pad << " of them vocabulary padding (model.pad_vocab_multiple = "
       << cfg.model.pad_vocab_multiple << ")";
  }
  if (list_units) {
    for (const auto& l : layouts) {
      os << "\n  unit " << l.unit_name << ": " << l.entries.size() << " params, numel "
         << l.numel << ", padded " << l.padded_numel << ", shard " << l.shard_numel;
    }
  }
  os << "\ndata: " << to_string(cfg.data.objective) << ", " << job.train_src->num_tokens()
     << " train tokens, " << job.val_src->num_tokens() << " val tokens; "
     << job.sampler->steps_per_epoch() << " steps per epoch; " << job.sampler->local_batch()
     << " sequences per rank per step";
  for (std::size_t d = 0; d < job.sampler->part_samples().size(); ++d) {
    os << "\n  data.paths[" << d << "] " << cfg.data.paths[d] << ": "
       << job.sampler->part_samples()[d] << " training samples, " << std::fixed
       << std::setprecision(1) << 100 * job.sampler->part_weights()[d]
       << " % of the samples drawn" << std::defaultfloat;
  }
  {
    const double per_token = flops_per_token(cfg);
    const PeakFlops& peak = job.rt.peak_flops();
    os << "\nmfu: model FLOPs " << si(per_token) << "FLOP per token (forward + backward: 6N + "
       << "attention); ";
    if (peak.flops_per_s > 0) {
      os << "peak " << si(peak.flops_per_s) << "FLOP/s per rank (" << peak.source << ")";
    } else {
      os << "not reported: no known peak for this device (set train.peak_flops)";
    }
  }
  if (const int64_t n = job.train_src->num_truncated() + job.val_src->num_truncated(); n > 0) {
    const bool sft = job.cfg.data.objective == Objective::sft;
    os << "\ndata: " << n << " examples longer than "
       << (sft ? "data.seq_len + 1 tokens (prompt and completion)"
               : "data.max_input_len / max_target_len")
       << " are truncated";
  }
  job.log(os.str());
}

void print_memory_plan(Job& job, const EngineMemoryPlan& p, int64_t acts) {
  std::ostringstream os;
  auto print_rows = [&](const std::vector<std::pair<const char*, int64_t>>& rows) {
    for (const auto& [name, v] : rows) {
      os << "  " << std::left << std::setw(18) << name << std::right << std::setw(14) << v
         << "  " << human_bytes(static_cast<double>(v)) << "\n";
    }
  };
  os << "memory plan per rank (bytes; peaks of one training step)"
     << (p.host_total() > 0 ? ", device:\n" : ":\n");
  print_rows(plan_rows(p, acts));
  if (p.offload) {
    if (p.grads > 0) {
      os << "  (grads: the fp32 accumulator of the micro-batches before each step's last; "
            "train.micro_batch_size = the per-rank batch has none)\n";
    }
    if (!job.cfg.fsdp.params_resident()) {
      os << "host (fsdp.cpu_offload):\n";
    } else if (job.cfg.fsdp.offload_optimizer_ratio < 1) {
      os << "host (fsdp.offload_optimizer, ratio " << job.cfg.fsdp.offload_optimizer_ratio
         << " of the parameters):\n";
    } else {
      os << "host (fsdp.offload_optimizer):\n";
    }
    print_rows(host_rows(p));
  } else if (p.save_staging > 0) {
    os << "host (checkpoint.async_save):\n";
    print_rows(host_rows(p));
  }
  const MemoryBudget& budget = job.rt.memory_budget();
  if (budget.bytes >= 0 && !job.planning()) {  // this machine's budget says nothing of a planned one
    os << "  available per rank: " << human_bytes(static_cast<double>(budget.bytes)) << " ("
       << budget.source << ")\n";
    const MemoryBudget& host = job.rt.host_memory_budget();
    if (p.host_total() > 0 && job.backend->device() != Device::cpu && host.bytes >= 0) {
      os << "  host available per rank: " << human_bytes(static_cast<double>(host.bytes)) << " ("
         << host.source << ")\n";
    }
  }
  job.log(os.str());
}

// Memory before allocation: the plan must fit in what this rank may use (memory_refusal,
// fsdp/train/memory_check.hpp: the device budget, and with fsdp.cpu_offload the host's), else
// InputError with its line, before the model or the engine allocates anything. Rank 0
// prints the whole plan. train.check_memory = false skips the check.
void check_memory_fits(Job& job, const EngineMemoryPlan& p, int64_t acts, int node_writers) {
  if (!job.cfg.train.check_memory) return;
  const EngineMemoryPlan charged = with_staging_share(p, node_writers, job.mesh->local_size());
  const std::string why = memory_refusal(charged, acts, job.rt.memory_budget(),
                                         job.rt.host_memory_budget(),
                                         job.backend->device() == Device::cpu);
  if (why.empty()) return;
  print_memory_plan(job, charged, acts);
  throw InputError(why);
}

std::string format_val_loss(const Evaluation& e) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(4) << e.loss;
  for (std::size_t d = 0; d < e.per_path.size(); ++d) {
    os << (d == 0 ? " (per path " : ", ") << e.per_path[d];
  }
  if (!e.per_path.empty()) os << ")";
  return os.str();
}

std::string progress_line(const Job& job, const StepReport& r) {
  const StepOutcome& o = r.outcome;
  std::ostringstream os;
  os << "step " << o.step << "/" << job.cfg.train.max_steps << " | loss " << std::fixed
     << std::setprecision(4) << o.loss << " | lr " << std::scientific << std::setprecision(2)
     << o.lr << " | grad_norm " << std::fixed << std::setprecision(3) << o.norm << " | "
     << std::setprecision(0) << r.tokens_per_step / o.seconds << " tok/s";
  if (r.mfu >= 0) os << " | mfu " << std::setprecision(1) << 100.0 * r.mfu << "%";
  os << " | peak mem " << human_bytes(static_cast<double>(r.peak));
  if (job.cfg.mixed_precision.uses_fp16()) {
    os << " | loss_scale " << r.loss_scale << (o.skipped ? " (skipped)" : "");
  }
  if (r.val_loss) os << " | val_loss " << format_val_loss({*r.val_loss, r.val_loss_per_path});
  os << " | " << format_step_times(r.times);
  return os.str();
}

nlohmann::json metrics_line(const Job& job, const StepReport& r) {
  const StepOutcome& o = r.outcome;
  nlohmann::json line = {{"step", o.step},
                         {"loss", o.loss},
                         {"lr", o.lr},
                         {"grad_norm", o.norm},
                         {"tokens", static_cast<int64_t>(r.tokens_per_step) * o.step},
                         {"tokens_per_sec", r.tokens_per_step / o.seconds},
                         {"peak_mem_bytes", r.peak}};
  if (r.mfu >= 0) line["mfu"] = r.mfu;
  if (r.host_peak >= 0) line["host_peak_mem_bytes"] = r.host_peak;
  if (r.max_expert_load > 0) line["moe_max_expert_load"] = r.max_expert_load;
  if (job.cfg.mixed_precision.uses_fp16()) {
    line["loss_scale"] = r.loss_scale;
    line["skipped"] = o.skipped;
  }
  if (o.nonfinite) {
    line["nonfinite"] = true;
    line["skipped"] = true;
  }
  if (r.val_loss) line["val_loss"] = *r.val_loss;
  if (!r.val_loss_per_path.empty()) line["val_loss_per_path"] = r.val_loss_per_path;
  // Seconds to the microsecond (the clocks' useful resolution).
  auto us = [](double s) { return std::round(s * 1e6) / 1e6; };
  line["step_s"] = us(r.times.step_s);
  for (int p = 0; p < kNumPhases; ++p) {
    line[std::string(to_string(static_cast<Phase>(p))) + "_s"] =
        us(r.times.phase_s[static_cast<std::size_t>(p)]);
  }
  return line;
}

void write_trace(Job& job, Profiler* prof) {
  if (!prof) return;
  write_profile(*prof, job.host, job.cfg.train.run_dir, job.step,
                [&](const std::string& line) { job.log(line); });
}

void plan_dry_run(Job& job, TrainResult& result, int64_t act_bytes) {
  const Config& cfg = job.cfg;
  collective_guard(job.host, [&] {
    const std::vector<ModuleDecl> modules = job.family.modules(cfg.model);
    const int num_shards = static_cast<int>(
        shards_for(cfg.fsdp.sharding_strategy, job.world, job.mesh_shard_size()));
    const auto layouts = build_unit_layouts(modules, cfg.fsdp, num_shards);
    print_banner(job, layouts, /*list_units=*/true);
    result.plan = plan_memory(modules, cfg, job.world, job.mesh_shard_size(),
                              num_optimizer_states(cfg.optim.name));
    result.planned_activation_bytes = act_bytes;
    print_memory_plan(job, result.plan, act_bytes);
    for (const auto& l : layouts) result.num_params += l.numel;
  });
}

}  // namespace fsdp::train_impl
