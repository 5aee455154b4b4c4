// Sharded checkpoint -> Hugging Face model directory (see fsdp/checkpoint/merge.hpp); the
// names, layouts and config.json come from the checkpoint's model family; one model.safetensors
// or Hugging Face's shards (safetensors::ModelWriter). One full tensor (plus its transpose) in
// memory at a time.
#include "fsdp/checkpoint/merge.hpp"

#include <filesystem>
#include <map>
#include <regex>

#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/checkpoint/safetensors.hpp"
#include "fsdp/core/atomic_file.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/output_lock.hpp"
#include "fsdp/core/progress.hpp"
#include "fsdp/model/model.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace fsdp::ckpt {

namespace {

// `p` absolute, with `.`/`..` folded and the symlinks of its existing part resolved.
fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  if (ec) abs = fs::path(p);
  fs::path c = fs::weakly_canonical(abs, ec);
  if (ec) c = abs.lexically_normal();
  // "a/b/" and "a/b" are the same directory.
  if (!c.has_filename() && c.has_parent_path()) c = c.parent_path();
  return c;
}

// Whether `p` is `base` or lies below it (both resolved).
bool within(const fs::path& p, const fs::path& base) {
  auto b = base.begin(), q = p.begin();
  for (; b != base.end(); ++b, ++q)
    if (q == p.end() || *q != *b) return false;
  return true;
}

// What `dir` (an existing directory) is to a checkpoint, "" if nothing: a checkpoints tree
// (named "checkpoints", holding `latest` or a step_<digits> directory) or a step directory
// (holding shard_<i>-of-<n>.h5 files).
std::string checkpoint_role(const fs::path& dir) {
  static const std::regex shard(R"(shard_\d{5,}-of-\d{5,}\.h5)");
  static const std::regex step(R"(step_\d{8,}(\.tmp|\.old|\.deleting)?)");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  const bool named = dir.filename() == "checkpoints";
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string name = de.path().filename().string();
    if (std::regex_match(name, shard)) return "the checkpoint step directory";
    if (named && (name == "latest" || std::regex_match(name, step))) return "the checkpoints tree";
  }
  return "";
}

}  // namespace

void check_merge_output_dir(const std::string& step_dir, const std::string& out_dir) {
  const fs::path step = resolved(step_dir), out = resolved(out_dir);
  auto refuse = [&](const std::string& what, const fs::path& where) {
    throw InputError("OUT_DIR " + out_dir + " is inside " + what + " " + where.string() +
                     " (a model written there would mix with the shards, and the next save of the step "
                     "or a fresh run would remove or refuse it); choose a directory outside " +
                     where.string());
  };
  if (within(out, step)) refuse("the checkpoint STEP_DIR", step);
  // The directories from OUT_DIR up to the root: none may be a step directory or the
  // checkpoints tree (STEP_DIR's own or another run's). Directories that do not exist yet
  // hold nothing.
  for (fs::path a = out;; a = a.parent_path()) {
    if (const std::string role = checkpoint_role(a); !role.empty()) refuse(role, a);
    if (a == a.parent_path() || a.empty()) break;
  }
}

MergeStats merge_to_hf(const std::string& step_dir, const std::string& out_dir, ProgressMeter* progress,
                       const MergeOptions& options) {
  if (options.max_shard_size < 1)
    throw InputError("max_shard_size " + std::to_string(options.max_shard_size) + " is below 1 byte");
  if (options.dtype != DType::f32 && options.dtype != DType::bf16 && options.dtype != DType::f16)
    throw InputError("dtype " + std::string(to_string(options.dtype)) + " (expected fp32, bf16 or fp16)");
  check_merge_output_dir(step_dir, out_dir);  // before anything is read or written
  const CheckpointSet set = CheckpointSet::open(step_dir);
  // Every dataset's checksum and finiteness first: a corrupted checkpoint is refused
  // (InputError naming the file and tensor) before anything else is looked at or written.
  set.verify_all();
  const std::string first = set.shard(0).path();
  json cfg;
  try {
    cfg = json::parse(set.meta().model_config_json);
  } catch (const json::exception& e) {
    throw InputError(first + ": model_config attribute is not valid JSON: " + e.what());
  }
  ModelConfig model_cfg;
  std::vector<ParamSpec> expected;
  json hf_config;
  try {
    model_cfg = model_config_from_json(cfg, first);
  } catch (const Error& e) {
    throw InputError(std::string(e.what()) + " (expected one of the registered model types)");
  }
  const ModelFamily& family = model_family(model_cfg.type);
  try {
    for (const ModuleDecl& m : family.modules(model_cfg)) {
      for (const ParamSpec& p : m.params) expected.push_back(p);
    }
    hf_config = family.hf_config(model_cfg);
  } catch (const Error& e) {
    throw InputError(first + ": " + e.what());
  }

  // Index every stored parameter by name, whatever unit holds it.
  struct Loc {
    int unit;
    const FlatEntry* entry;
  };
  std::map<std::string, Loc> where;
  const auto& layouts = set.layouts();
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    for (const FlatEntry& e : layouts[u].entries) {
      if (!where.emplace(e.spec.name, Loc{static_cast<int>(u), &e}).second)
        throw InputError(first + ": parameter " + e.spec.name + " stored twice");
      if (!family.hf_tensor(model_cfg, e.spec.name, e.spec.shape))
        throw InputError(first + ": unknown " + model_cfg.type + " parameter " + e.spec.name);
    }
  }
  std::vector<safetensors::TensorInfo> infos;
  std::vector<HfTensor> hf;
  for (const ParamSpec& p : expected) {
    auto it = where.find(p.name);
    if (it == where.end())
      throw InputError(first + ": parameter " + p.name + " missing (model_config needs it)");
    if (it->second.entry->spec.shape != p.shape)
      throw InputError(first + ": parameter " + p.name + " has shape " + shape_json(it->second.entry->spec.shape) +
                       " (expected " + shape_json(p.shape) + " from model_config)");
    // The Hugging Face tensor is the model's own rows: vocabulary padding
    // (model_config's pad_vocab_multiple) stays in the checkpoint.
    hf.push_back(*family.hf_tensor(model_cfg, p.name, p.unpadded_shape()));
    infos.push_back({hf.back().name, hf.back().shape, options.dtype});
  }
  if (where.size() != expected.size())
    throw InputError(first + ": " + std::to_string(where.size()) + " parameters stored, model_config needs " +
                     std::to_string(expected.size()));

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw InputError(out_dir + ": cannot create output directory: " + ec.message());
  // One merge into out_dir at a time (a second one would remove this one's files as stale).
  // The lock file is inside out_dir, which the merge must be able to write anyway (its parent
  // need not be writable); it exists only while held.
  const OutputLock lock(out_dir, (fs::path(out_dir) / kMergeLockName).string(), "OUT_DIR");

  MergeStats stats;
  if (progress) {
    int64_t total_bytes = 0;  // payload of the weight files (their headers not counted)
    for (const safetensors::TensorInfo& t : infos) total_bytes += t.bytes();
    progress->set_total(static_cast<int64_t>(expected.size()), total_bytes);
  }
  {
    std::map<std::string, std::string> meta{{"source", fs::absolute(step_dir).lexically_normal().string()},
                                            {"step", std::to_string(set.meta().step)}};
    safetensors::ModelWriter writer(out_dir, infos, options.max_shard_size, meta);
    std::vector<float> full, trans;
    for (std::size_t k = 0; k < expected.size(); ++k) {
      const Loc& loc = where.at(expected[k].name);
      // The model's rows: a row-major prefix of the stored (possibly vocabulary-padded) tensor.
      const std::vector<int64_t> shape = expected[k].unpadded_shape();
      const int64_t n = expected[k].unpadded_numel();
      full.resize(static_cast<std::size_t>(n));
      set.read_flat(loc.unit, "param", loc.entry->offset, n, full.data());
      const float* data = full.data();
      if (hf[k].transpose) {
        const int64_t rows = shape[0], cols = shape[1];
        trans.resize(full.size());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) trans[c * rows + r] = full[r * cols + c];
        data = trans.data();
      }
      writer.write_next(data, n);
      stats.num_tensors += 1;
      stats.num_elements += n;
      if (progress) {
        progress->update(stats.num_tensors,
                         stats.num_elements * static_cast<int64_t>(dtype_size(options.dtype)));
      }
    }
    writer.finish();
    stats.total_size = writer.total_size();
    stats.files = writer.files();
    stats.sharded = writer.sharded();
  }
  hf_config["torch_dtype"] = safetensors::torch_dtype_name(options.dtype);
  const std::string cfg_path = (fs::path(out_dir) / "config.json").string();
  write_file_atomically(cfg_path, hf_config.dump(2) + "\n");
  return stats;
}

}  // namespace fsdp::ckpt
