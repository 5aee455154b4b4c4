// fsdp/checkpoint/merge.hpp: sharded checkpoint -> Hugging Face model directory.
//
// What `fsdp_merge STEP_DIR OUT_DIR` does, as a library function (so tests call it without
// a process): read every shard file of a step directory, rebuild each full parameter from
// the flat shards, rename and re-lay it as the model family's Hugging Face class expects
// (ModelFamily::hf_tensor: GPT2LMHeadModel, T5ForConditionalGeneration, ...), and stream it into
// OUT_DIR/model.safetensors (fp32, or bf16 / fp16 rounded to nearest-even: MergeOptions::dtype,
// config.json's torch_dtype saying so) with OUT_DIR/config.json (ModelFamily::hf_config) beside
// it, or, when the tensors' bytes exceed MergeOptions::max_shard_size (save_pretrained's
// max_shard_size, default "5GB"), into Hugging Face's sharded layout:
// OUT_DIR/model-00001-of-0000N.safetensors ... and OUT_DIR/model.safetensors.index.json
// (safetensors::ModelWriter). The result loads with `<Class>.from_pretrained(OUT_DIR)`.
// Vocabulary-padded tensors (model.pad_vocab_multiple; the checkpoint's model_config records
// it) are written with the model's own vocab_size rows only, so the output is byte-identical
// to an unpadded run's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/checkpoint/safetensors.hpp"

namespace fsdp {
class ProgressMeter;  // fsdp/core/progress.hpp
}

namespace fsdp::ckpt {

// The file in OUT_DIR that merge_to_hf holds an fsdp::OutputLock on while it writes there
// (removed when it returns; a killed merge's leftover holds no lock and is taken over).
inline constexpr const char* kMergeLockName = ".fsdp_merge.lock";

// Merges the checkpoint in `step_dir` into `out_dir` (created if missing): the weights as
// safetensors::ModelWriter writes them (out_dir/model.safetensors when the tensors' bytes
// are at most options.max_shard_size, else out_dir/model-0000k-of-0000N.safetensors and
// out_dir/model.safetensors.index.json, in that writer's crash-safe order; a previous merge's
// weight files in out_dir are removed once the new ones are in place), then out_dir/config.json,
// each file written under a temp name and renamed. Parameters are looked up by name wherever
// they live (any wrap policy), written in the family's declaration order, which is also the
// order they are assigned to shards. Throws InputError (exit 2) before anything is read if
// out_dir lies inside a checkpoint (check_merge_output_dir: `fsdp_merge STEP STEP`, or
// STEP/hf, or run/checkpoints/hf), and naming the file on a
// missing/inconsistent shard file, an unsupported model_type, a missing, duplicated,
// unknown or wrongly-shaped parameter, and naming the file and tensor on a dataset whose
// checksum does not match or that holds a non-finite value (CheckpointSet::verify_all runs
// before out_dir is created, so a refused checkpoint leaves no output); InputError "OUT_DIR:
// <out_dir> is being written by another process (it holds <out_dir>/.fsdp_merge.lock); ..."
// while another merge into out_dir runs (fsdp::OutputLock on kMergeLockName in out_dir, held
// from out_dir's creation to the return, so two merges never remove each other's files);
// InputError if options.max_shard_size < 1 or options.dtype is not f32, bf16 or f16 (before
// anything is read); fsdp::Error (exit 1)
// on an I/O failure, e.g. a full disk (the weights of out_dir then load as before the merge,
// or, if a previous merge of the same shard count was being replaced, do not load at all:
// never a mix of the two; config.json is written after the weights).
// `progress` (optional; fsdp_merge's status line on a terminal): a kItems meter counting
// tensors, told set_total(tensors, their bytes in the output dtype) once the checkpoint is
// verified and checked, then update(tensors written, bytes written) after each tensor (bytes
// of the output dtype); never finish()ed here (the caller owns it).
struct MergeOptions {
  // Bytes of tensor data per weight file at most (a tensor larger than this gets a file of
  // its own); save_pretrained's max_shard_size. safetensors::parse_shard_size reads "5GB".
  int64_t max_shard_size = safetensors::kDefaultMaxShardSize;
  // The weights' dtype: f32 (the checkpoint's master weights exactly), bf16 or f16 (each value
  // rounded to nearest-even, as model.to(torch.bfloat16).save_pretrained() writes; half the
  // bytes). Another dtype is InputError before anything is read; an fp16 overflow is
  // InputError naming the tensor (safetensors::Writer::write_next), with out_dir as before.
  DType dtype = DType::f32;
};
struct MergeStats {
  int64_t num_tensors = 0;
  int64_t num_elements = 0;
  int64_t total_size = 0;           // bytes of tensor data (num_elements x the dtype's size)
  std::vector<std::string> files;   // weight files written in out_dir, shard order
  bool sharded = false;             // files are shards named by model.safetensors.index.json
};
// Refuses an output directory inside a checkpoint: InputError (exit 2) "OUT_DIR <out_dir> is
// inside <what> <dir> (...); choose a directory outside <dir>" when `out_dir` is `step_dir` or
// below it, or when `out_dir` or any directory above it is a checkpoints tree (an existing
// directory named "checkpoints" holding `latest` or a step_<8+ digits> entry: STEP_DIR's own
// tree or another run's) or a step directory (one holding shard_<i>-of-<n>.h5 files). Paths
// are compared absolute, with "." and ".." folded and the symlinks of their existing part
// resolved, so a link into the tree is refused too. Reads directory listings only; creates
// nothing. merge_to_hf calls it first.
void check_merge_output_dir(const std::string& step_dir, const std::string& out_dir);

MergeStats merge_to_hf(const std::string& step_dir, const std::string& out_dir, ProgressMeter* progress = nullptr,
                       const MergeOptions& options = {});

}  // namespace fsdp::ckpt
