// fsdp/checkpoint/merge.hpp: sharded checkpoint -> Hugging Face model directory.
//
// What `fsdp_merge STEP_DIR OUT_DIR` does, as a library function (so tests call it without
// a process): read every shard file of a step directory, rebuild each full parameter from
// the flat shards, rename and re-lay it as the model family's Hugging Face class expects
// (ModelFamily::hf_tensor: GPT2LMHeadModel, T5ForConditionalGeneration), and stream it into
// OUT_DIR/model.safetensors (fp32) with OUT_DIR/config.json (ModelFamily::hf_config) beside
// it. The result loads with `<Class>.from_pretrained(OUT_DIR)`. Vocabulary-padded tensors
// (model.pad_vocab_multiple; the checkpoint's model_config records it) are written with the
// model's own vocab_size rows only, so the output is byte-identical to an unpadded run's.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp {
class ProgressMeter;  // fsdp/core/progress.hpp
}

namespace fsdp::ckpt {

// Merges the checkpoint in `step_dir` into `out_dir` (created if missing):
// out_dir/model.safetensors and out_dir/config.json, each written under a temp name and
// renamed. Parameters are looked up by name wherever they live (any wrap policy), written
// in the family's declaration order. Throws InputError (exit 2) naming the file on a
// missing/inconsistent shard file, an unsupported model_type, a missing, duplicated,
// unknown or wrongly-shaped parameter, and naming the file and tensor on a dataset whose
// checksum does not match or that holds a non-finite value (CheckpointSet::verify_all runs
// before out_dir is created, so a refused checkpoint leaves no output).
// `progress` (optional; fsdp_merge's status line on a terminal): a kItems meter counting
// tensors, told set_total(tensors, their fp32 bytes) once the checkpoint is verified and
// checked, then update(tensors written, bytes written) after each tensor; never finish()ed
// here (the caller owns it).
struct MergeStats {
  int64_t num_tensors = 0;
  int64_t num_elements = 0;
};
MergeStats merge_to_hf(const std::string& step_dir, const std::string& out_dir, ProgressMeter* progress = nullptr);

}  // namespace fsdp::ckpt
