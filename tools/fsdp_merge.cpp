// fsdp_merge: turns a sharded fsdp_train checkpoint into a Hugging Face model directory.
//
//   fsdp_merge run/checkpoints/step_00001000 out/gpt2-small
//
//   fsdp_merge run/checkpoints/step_00001000 out/gpt2-xl --max-shard-size 2GB
//
//   fsdp_merge run/checkpoints/step_00001000 out/qwen3 --dtype bf16
//
//   fsdp_merge run out/latest    (run/checkpoints/latest's step; also run/checkpoints or
//                                 run/checkpoints/latest: ckpt::resolve_step_dir)
//
// Reads every shard file of the step directory (checked complete and consistent), rebuilds
// each full parameter from its flat shards, and writes OUT_DIR/model.safetensors (fp32, or
// bf16 / fp16 with --dtype; the Hugging Face names and layouts of the checkpoint's model
// family: GPT2LMHeadModel with its Conv1D layout, T5ForConditionalGeneration,
// LlamaForCausalLM, ...) and OUT_DIR/config.json, which load with
// transformers' <Class>.from_pretrained(OUT_DIR) and with fsdp_train's model.init_from. When
// the weights exceed --max-shard-size (save_pretrained's max_shard_size and its parsing,
// default "5GB" = 5 * 10^9 bytes), they are written as save_pretrained shards them:
// OUT_DIR/model-00001-of-0000N.safetensors ... and OUT_DIR/model.safetensors.index.json.
// Exit codes: 0 ok, 2 bad input (missing/incompatible shard files, bad arguments, a bad
// --max-shard-size), 1 other failures. The work is fsdp::ckpt::merge_to_hf
// (docs/checkpoint.md); this file only parses the command line.
// Progress: when stderr is a terminal, one status line on stderr rewritten in place (tensors
// written of the total, bytes, MiB/s, ETA; fsdp/core/progress.hpp), ended before the summary;
// nothing extra when stderr is not a terminal.
#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/checkpoint/merge.hpp"
#include "fsdp/core/atomic_file.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/progress.hpp"
#include "fsdp/model/model.hpp"

namespace po = boost::program_options;

namespace {
// "gpt2: GPT2LMHeadModel, t5: T5ForConditionalGeneration, ...": every registered model type
// and the class its config.json names.
std::string model_classes() {
  std::string out;
  for (const fsdp::ModelFamily* f : fsdp::model_families()) {
    const auto hf = f->hf_config(fsdp::model_defaults(f->type()));
    out += (out.empty() ? "" : ", ") + f->type() + ": " + hf.at("architectures")[0].get<std::string>();
  }
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  // SIGTERM / SIGINT / SIGHUP: the output's temporaries are removed, the final files kept.
  fsdp::remove_temporaries_on_signal();
  std::string step_dir, out_dir, max_shard_size = "5GB", dtype = "fp32";
  po::options_description visible("Options");
  visible.add_options()("help,h", "print this help and exit")(
      "dtype", po::value<std::string>(&dtype)->value_name("fp32|bf16|fp16"),
      "dtype of the weights written (default fp32, the checkpoint's master weights exactly); "
      "bf16 or fp16 round each value to nearest-even, as model.to(dtype).save_pretrained() "
      "does, in half the bytes; config.json's torch_dtype says which")(
      "max-shard-size", po::value<std::string>(&max_shard_size)->value_name("SIZE"),
      "largest weight file, as save_pretrained's max_shard_size (default 5GB): bytes, or "
      "an integer with KB/MB/GB (10^3, 10^6, 10^9 bytes) or KiB/MiB/GiB (2^10, 2^20, 2^30); "
      "larger models are written as model-0000k-of-0000N.safetensors shards with "
      "model.safetensors.index.json");
  po::options_description hidden;
  hidden.add_options()("step-dir", po::value<std::string>(&step_dir), "checkpoint step directory")(
      "out-dir", po::value<std::string>(&out_dir), "output directory");
  po::options_description all;
  all.add(visible).add(hidden);
  po::positional_options_description pos;
  pos.add("step-dir", 1).add("out-dir", 1);
  const std::string usage =
      "usage: fsdp_merge STEP_DIR OUT_DIR [--dtype fp32|bf16|fp16] [--max-shard-size SIZE]\n"
      "  Merges the sharded checkpoint STEP_DIR (e.g. run/checkpoints/step_00001000; a run\n"
      "  directory, its checkpoints directory or checkpoints/latest: the step `latest` names)\n"
      "  into OUT_DIR/model.safetensors and OUT_DIR/config.json: a Hugging Face model\n"
      "  directory of the checkpoint's model type, loadable with from_pretrained or\n"
      "  model.init_from:\n"
      "    " + model_classes() + ".\n"
      "  Weights of more than SIZE bytes (default 5GB) are written as save_pretrained\n"
      "  shards them: model-00001-of-0000N.safetensors ... and model.safetensors.index.json.\n";
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << usage << visible;
      return 0;
    }
    if (step_dir.empty() || out_dir.empty()) {
      std::cerr << "fsdp_merge: expected two arguments STEP_DIR OUT_DIR\n" << usage;
      return fsdp::kExitInputError;
    }
  } catch (const po::error& e) {
    fsdp::write_line(2, std::string("fsdp_merge: ") + e.what() + " (fsdp_merge --help for usage)");
    return fsdp::kExitInputError;
  }
  fsdp::ckpt::MergeOptions options;
  const std::optional<fsdp::DType> parsed = fsdp::enum_from_name<fsdp::DType>(dtype);
  if (!parsed || (*parsed != fsdp::DType::f32 && *parsed != fsdp::DType::bf16 &&
                  *parsed != fsdp::DType::f16)) {
    fsdp::write_line(2, "fsdp_merge: --dtype: unknown value \"" + fsdp::printable(dtype, 40) +
                               "\" (expected one of fp32, bf16, fp16)");
    return fsdp::kExitInputError;
  }
  options.dtype = *parsed;
  try {
    options.max_shard_size = fsdp::safetensors::parse_shard_size(max_shard_size, "--max-shard-size");
  } catch (const fsdp::Error& e) {
    fsdp::write_line(2, std::string("fsdp_merge: ") + e.what());
    return e.exit_code();
  }
  try {
    // Ended by finish(), or on an error by its destructor before the catch prints.
    auto progress = fsdp::ProgressMeter::on_terminal(
        {.label = "fsdp_merge", .unit = fsdp::ProgressUnit::kItems, .noun = "tensors"});
    const fsdp::ckpt::StepDirChoice from = fsdp::ckpt::resolve_step_dir(step_dir);
    if (!from.latest.empty())
      std::cout << "fsdp_merge: merging " << from.step_dir << " (named by " << from.latest
                << ")" << std::endl;
    const auto stats = fsdp::ckpt::merge_to_hf(from.step_dir, out_dir, &progress, options);
    progress.finish();
    std::cout << "fsdp_merge: wrote " << stats.num_tensors << " tensors (" << stats.num_elements
              << " parameters) to " << out_dir << "/";
    if (stats.sharded) {
      std::cout << fsdp::safetensors::kIndexFileName << " (" << stats.files.size() << " shards: "
                << stats.files.front() << " ... " << stats.files.back() << ")";
    } else {
      std::cout << stats.files.front();
    }
    std::cout << " and config.json\n";
    return 0;
  } catch (const fsdp::Error& e) {
    fsdp::write_line(2, std::string("fsdp_merge: ") + e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    fsdp::write_line(2, std::string("fsdp_merge: ") + e.what());
    return fsdp::kExitRuntimeError;
  }
}
