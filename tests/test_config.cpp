// tests/test_config.cpp: the run configuration (fsdp/config/config.hpp): defaults, the
// example inputs/*.toml, --set overrides of every value type (enums included), the one-line
// exit-code-2 errors for each kind of bad input, to_toml round trips, and docs/config.md
// checked against the key table (every key, no other, each stated default).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fsdp/config/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/model/model.hpp"  // parse_config / load_config over the registered families

namespace fsdp {
namespace {

using testing::HasSubstr;

const std::string kInputs = std::string(FSDP_SOURCE_DIR) + "/inputs/";
// Smallest valid file: the only required key without a default is data.path.
const std::string kMinimal = "[data]\npath = \"tokens.h5\"\n";

// Runs parse_config and returns the InputError message ("" if it did not throw), checking
// that the error is one line with exit code 2.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "input.toml", overrides);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitInputError) << e.what();
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

TEST(Config, DefaultsMatchHeader) {
  const Config c = parse_config(kMinimal, "min.toml", {});
  Config expected;
  expected.model = model_defaults("gpt2");  // Config{} holds model.type only (config knows no model)
  expected.data.path = "tokens.h5";
  expected.source_path = "min.toml";
  expected.fsdp.transformer_layer_cls_to_wrap = {"GPT2Block"};  // unset: the model's classes
  EXPECT_EQ(c, expected);
  EXPECT_EQ(c.model.type, "gpt2");
  EXPECT_EQ(c.model.integer("n_layer"), 4);
  EXPECT_EQ(c.model.integer("n_embd"), 128);
  EXPECT_EQ(c.data.seq_len, 128);
  EXPECT_EQ(c.train.global_batch_size, 32);
  EXPECT_EQ(c.train.seed, 1234u);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.optim.name, OptimizerKind::adamw);
  EXPECT_EQ(c.fsdp.sharding_strategy, ShardingStrategy::FULL_SHARD);
  EXPECT_EQ(c.fsdp.auto_wrap_policy, AutoWrapPolicy::TRANSFORMER_BASED_WRAP);
  EXPECT_EQ(c.fsdp.transformer_layer_cls_to_wrap, std::vector<std::string>{"GPT2Block"});
  EXPECT_EQ(c.fsdp.backward_prefetch, BackwardPrefetch::BACKWARD_PRE);
  EXPECT_FALSE(c.fsdp.forward_prefetch);  // PyTorch FSDP's default
  EXPECT_TRUE(c.fsdp.limit_all_gathers);
  // MixedPrecision() with no dtypes is full fp32; GradScaler's defaults.
  EXPECT_EQ(c.mixed_precision.param_dtype, DType::f32);
  EXPECT_EQ(c.mixed_precision.reduce_dtype, DType::f32);
  EXPECT_FALSE(c.mixed_precision.uses_fp16());
  EXPECT_DOUBLE_EQ(c.mixed_precision.init_scale, 65536.0);
  EXPECT_DOUBLE_EQ(c.mixed_precision.growth_factor, 2.0);
  EXPECT_DOUBLE_EQ(c.mixed_precision.backoff_factor, 0.5);
  EXPECT_EQ(c.mixed_precision.growth_interval, 2000);
}

TEST(Config, FortunesInput) {
  const Config c = load_config(kInputs + "gpt2_fortunes.toml", {});
  EXPECT_EQ(c.source_path, kInputs + "gpt2_fortunes.toml");
  // Structure of the main job; its step counts are tuning and free to change.
  EXPECT_EQ(c.model.integer("n_layer"), 4);
  EXPECT_EQ(c.model.integer("n_head"), 4);
  EXPECT_EQ(c.model.integer("n_embd"), 128);
  EXPECT_EQ(c.model.integer("n_positions"), 256);
  EXPECT_EQ(c.model.integer("vocab_size"), 256);
  EXPECT_EQ(c.data.source, DataSource::hdf5);
  EXPECT_EQ(c.data.path, "data/fortunes.h5");
  EXPECT_EQ(c.data.seq_len, 128);
  EXPECT_EQ(c.train.global_batch_size, 32);
  EXPECT_EQ(c.train.run_dir, "runs/fortunes");
  EXPECT_EQ(c.optim.name, OptimizerKind::adamw);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-3);
  EXPECT_DOUBLE_EQ(c.optim.min_lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.optim.grad_clip, 1.0);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.99);
  EXPECT_EQ(c.fsdp.sharding_strategy, ShardingStrategy::FULL_SHARD);
  EXPECT_EQ(c.fsdp.auto_wrap_policy, AutoWrapPolicy::TRANSFORMER_BASED_WRAP);
  EXPECT_EQ(c.fsdp.transformer_layer_cls_to_wrap, std::vector<std::string>{"GPT2Block"});
  EXPECT_EQ(c.fsdp.backward_prefetch, BackwardPrefetch::BACKWARD_PRE);
  EXPECT_TRUE(c.fsdp.forward_prefetch);
  EXPECT_TRUE(c.fsdp.limit_all_gathers);
  EXPECT_EQ(c.mixed_precision, MixedPrecisionConfig{});  // fp32
  EXPECT_EQ(c.eval.max_windows, 0);
}

TEST(Config, TinyInput) {
  const Config c = load_config(kInputs + "tiny.toml", {});
  EXPECT_EQ(c.model.integer("n_layer"), 2);
  EXPECT_EQ(c.model.integer("n_head"), 2);
  EXPECT_EQ(c.model.integer("n_embd"), 16);
  EXPECT_EQ(c.model.integer("n_positions"), 32);
  EXPECT_EQ(c.data.source, DataSource::synthetic);
  EXPECT_TRUE(c.data.path.empty());
  EXPECT_EQ(c.data.seq_len, 16);
  EXPECT_EQ(c.train.global_batch_size, 8);
  EXPECT_EQ(c.train.max_steps, 5);
}

TEST(Config, EveryInputFileLoads) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kInputs)) {
    if (entry.path().extension() != ".toml") continue;
    EXPECT_NO_THROW(load_config(entry.path().string(), {})) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 2);
}

TEST(Config, OverridesOfEachType) {
  const Config c = parse_config(
      kMinimal, "min.toml",
      {"model.n_layer=7",                                   // int
       "optim.lr=3e-4", "optim.grad_clip=2",                // float, int for a float key
       "fsdp.sharding_strategy=NO_SHARD",                   // bare word -> string
       "train.run_dir=\"runs/quoted dir\"",                 // quoted string
       "data.path=other/file.h5",                           // bare path
       "fsdp.transformer_layer_cls_to_wrap=[\"GPT2Block\"]",  // array
       "fsdp.limit_all_gathers=false",                      // bool
       "train.seed=99", " eval.every = 5 "});               // spaces around
  EXPECT_EQ(c.model.integer("n_layer"), 7);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optim.grad_clip, 2.0);
  EXPECT_EQ(c.fsdp.sharding_strategy, ShardingStrategy::NO_SHARD);
  EXPECT_EQ(c.train.run_dir, "runs/quoted dir");
  EXPECT_EQ(c.data.path, "other/file.h5");
  EXPECT_EQ(c.fsdp.transformer_layer_cls_to_wrap, std::vector<std::string>{"GPT2Block"});
  EXPECT_FALSE(c.fsdp.limit_all_gathers);
  EXPECT_EQ(c.train.seed, 99u);
  EXPECT_EQ(c.eval.every, 5);
}

TEST(Config, EnumAndMixedPrecisionKeysFromFile) {
  const Config c = parse_config(
      "[optim]\nname = \"sgd\"\n"
      "[fsdp]\nauto_wrap_policy = \"NO_WRAP\"\nbackward_prefetch = \"BACKWARD_POST\"\n"
      "forward_prefetch = true\n"
      "[mixed_precision]\nparam_dtype = \"bf16\"\nreduce_dtype = \"fp32\"\n"
      "init_scale = 1024\ngrowth_factor = 1.5\nbackoff_factor = 0.25\ngrowth_interval = 10\n",
      "mp.toml", {"data.path=tokens.h5"});
  EXPECT_EQ(c.optim.name, OptimizerKind::sgd);
  EXPECT_EQ(c.fsdp.auto_wrap_policy, AutoWrapPolicy::NO_WRAP);
  EXPECT_EQ(c.fsdp.backward_prefetch, BackwardPrefetch::BACKWARD_POST);
  EXPECT_TRUE(c.fsdp.forward_prefetch);
  EXPECT_EQ(c.mixed_precision.param_dtype, DType::bf16);
  EXPECT_EQ(c.mixed_precision.reduce_dtype, DType::f32);
  EXPECT_FALSE(c.mixed_precision.uses_fp16());
  EXPECT_DOUBLE_EQ(c.mixed_precision.init_scale, 1024.0);  // an integer for a float key
  EXPECT_DOUBLE_EQ(c.mixed_precision.growth_factor, 1.5);
  EXPECT_DOUBLE_EQ(c.mixed_precision.backoff_factor, 0.25);
  EXPECT_EQ(c.mixed_precision.growth_interval, 10);

  const Config h = parse_config("[mixed_precision]\nreduce_dtype = \"fp16\"\n", "mp.toml",
                                {"data.path=tokens.h5"});
  EXPECT_EQ(h.mixed_precision.param_dtype, DType::f32);
  EXPECT_EQ(h.mixed_precision.reduce_dtype, DType::f16);
  EXPECT_TRUE(h.mixed_precision.uses_fp16());
}

TEST(Config, DeviceAndCommKeys) {
  const Config d = parse_config("", "empty.toml", {"data.path=tokens.h5"});
  EXPECT_EQ(d.train.device, DeviceKind::auto_);
  EXPECT_EQ(d.comm.backend, CommBackend::auto_);
  EXPECT_DOUBLE_EQ(d.comm.timeout_s, 600.0);
  const Config c = parse_config("[train]\ndevice = \"cuda\"\n[comm]\nbackend = \"nccl\"\ntimeout_s = 30\n",
                                "dev.toml", {"data.path=tokens.h5"});
  EXPECT_EQ(c.train.device, DeviceKind::cuda);
  EXPECT_EQ(c.comm.backend, CommBackend::nccl);
  EXPECT_DOUBLE_EQ(c.comm.timeout_s, 30.0);
  const Config o = parse_config("", "dev.toml",
                                {"data.path=tokens.h5", "train.device=cpu", "comm.backend=mpi"});
  EXPECT_EQ(o.train.device, DeviceKind::cpu);
  EXPECT_EQ(o.comm.backend, CommBackend::mpi);
  EXPECT_EQ(parse_config(to_toml(c), "again.toml", {}), [&] {
    Config x = c;
    x.source_path = "again.toml";
    return x;
  }());
  auto message = [](const std::string& text) {
    try {
      parse_config(text, "dev.toml", {"data.path=tokens.h5"});
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("[train]\ndevice = \"gpu\"\n"),
            "dev.toml: train.device: unknown value \"gpu\" (expected one of auto, cpu, cuda)");
  EXPECT_EQ(message("[comm]\nbackend = \"gloo\"\n"),
            "dev.toml: comm.backend: unknown value \"gloo\" (expected one of auto, nccl, mpi)");
  EXPECT_EQ(message("[comm]\ntimeout_s = 0\n"),
            "dev.toml: comm.timeout_s: 0 is out of range (expected > 0)");
  EXPECT_EQ(message("[train]\ndevice = \"cpu\"\n[comm]\nbackend = \"nccl\"\n"),
            "dev.toml: comm.backend: \"nccl\" needs train.device = \"cuda\" or \"auto\"");
}

TEST(Config, AccumulationAndCheckpointingKeys) {
  const Config d = parse_config("", "acc.toml", {"data.path=tokens.h5"});
  EXPECT_EQ(d.train.micro_batch_size, 0);
  EXPECT_FALSE(d.fsdp.activation_checkpointing);
  const Config c = parse_config("[train]\nmicro_batch_size = 2\n[fsdp]\nactivation_checkpointing = true\n",
                                "acc.toml", {"data.path=tokens.h5"});
  EXPECT_EQ(c.train.micro_batch_size, 2);
  EXPECT_TRUE(c.fsdp.activation_checkpointing);
  Config again = parse_config(to_toml(c), "acc.toml", {});
  EXPECT_EQ(again, c);
  // fsdp.recompute_num_layers: -1 (every block) unless set; the models take both keys as one.
  EXPECT_EQ(d.fsdp.recompute_num_layers, -1);
  EXPECT_EQ(d.fsdp.checkpointing(), fsdp::ActivationCheckpointing(false));
  EXPECT_EQ(c.fsdp.checkpointing(), fsdp::ActivationCheckpointing(true));
  const Config first =
      parse_config("[fsdp]\nactivation_checkpointing = true\nrecompute_num_layers = 3\n",
                   "acc.toml", {"data.path=tokens.h5"});
  EXPECT_EQ(first.fsdp.checkpointing(), fsdp::ActivationCheckpointing::first_blocks(3));
  EXPECT_EQ(parse_config(to_toml(first), "acc.toml", {}), first);
  try {
    parse_config("", "acc.toml", {"data.path=tokens.h5", "train.micro_batch_size=-1"});
    ADD_FAILURE() << "no error";
  } catch (const fsdp::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("train.micro_batch_size: -1 is out of range"));
    EXPECT_EQ(e.exit_code(), 2);
  }
}

// fsdp.cpu_offload (PyTorch's CPUOffload), also under Accelerate's name fsdp.offload_params
// in the file and in --set; to_toml writes the table's name; both names at once is an error.
TEST(Config, CpuOffloadAndItsAccelerateAlias) {
  EXPECT_FALSE(parse_config("", "off.toml", {"data.path=t.h5"}).fsdp.cpu_offload);
  const Config file = parse_config("[fsdp]\noffload_params = true\n", "off.toml", {"data.path=t.h5"});
  EXPECT_TRUE(file.fsdp.cpu_offload);
  EXPECT_THAT(to_toml(file), HasSubstr("cpu_offload = true"));
  EXPECT_THAT(to_toml(file), testing::Not(HasSubstr("offload_params")));
  EXPECT_EQ(parse_config(to_toml(file), "off.toml", {}), file);
  EXPECT_TRUE(parse_config("", "off.toml", {"data.path=t.h5", "fsdp.offload_params=true"}).fsdp.cpu_offload);
  EXPECT_FALSE(parse_config("[fsdp]\ncpu_offload = true\n", "off.toml",
                            {"data.path=t.h5", "fsdp.offload_params=false"}).fsdp.cpu_offload);
  try {
    parse_config("[fsdp]\noffload_params = true\ncpu_offload = false\n", "off.toml", {"data.path=t.h5"});
    ADD_FAILURE() << "no error";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "off.toml: fsdp.offload_params and fsdp.cpu_offload are both given (the first is "
              "another name of the second)");
    EXPECT_EQ(e.exit_code(), 2);
  }
  try {
    parse_config("[fsdp]\noffload_params = 1\n", "off.toml", {"data.path=t.h5"});
    ADD_FAILURE() << "no error";
  } catch (const fsdp::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("fsdp.cpu_offload"));
    EXPECT_EQ(e.exit_code(), 2);
  }
}

// fsdp.offload_optimizer_ratio: [0, 1] (0: auto), ignored unless offload_optimizer alone is on
// (a file's ratio survives --set fsdp.offload_optimizer=false), an error beside the delayed
// update; one line naming the key, exit 2.
TEST(Config, OffloadOptimizerRatioNeedsOffloadOptimizer) {
  EXPECT_EQ(parse_config("", "r.toml", {"data.path=t.h5"}).fsdp.offload_optimizer_ratio, 1.0);
  const Config ok =
      parse_config("[fsdp]\noffload_optimizer = true\noffload_optimizer_ratio = 0.3\n", "r.toml",
                   {"data.path=t.h5"});
  EXPECT_EQ(ok.fsdp.offload_optimizer_ratio, 0.3);
  EXPECT_EQ(ok.fsdp.offloaded_fraction(), 0.3);
  EXPECT_EQ(parse_config(to_toml(ok), "r.toml", {}), ok);
  for (const char* ignored : {"[fsdp]\noffload_optimizer_ratio = 0.5\n",
                              "[fsdp]\ncpu_offload = true\noffload_optimizer = true\n"
                              "offload_optimizer_ratio = 0.5\n",
                              "[fsdp]\noffload_optimizer_ratio = 0\n"}) {
    EXPECT_EQ(parse_config(ignored, "r.toml", {"data.path=t.h5"}).fsdp.offloaded_fraction(),
              std::string(ignored).find("cpu_offload") == std::string::npos ? 0.0 : 1.0)
        << ignored;
  }
  EXPECT_EQ(parse_config("[fsdp]\noffload_optimizer = true\noffload_optimizer_ratio = 0\n",
                         "r.toml", {"data.path=t.h5"})
                .fsdp.offloaded_fraction(),
            1.0);  // auto, until the trainer resolves it
  const std::pair<std::string, std::string> bad[] = {
      {"[fsdp]\noffload_optimizer = true\noffload_optimizer_ratio = 0.5\n"
       "delayed_parameter_update = true\n",
       "r.toml: fsdp.offload_optimizer_ratio: below 1 is not supported with "
       "fsdp.delayed_parameter_update (the units on the device would step undelayed)"},
      {"[fsdp]\noffload_optimizer = true\noffload_optimizer_ratio = -0.1\n",
       "r.toml: fsdp.offload_optimizer_ratio: -0.1 is out of range"},
      {"[fsdp]\noffload_optimizer = true\noffload_optimizer_ratio = 1.5\n",
       "r.toml: fsdp.offload_optimizer_ratio: 1.5 is out of range"},
  };
  for (const auto& [text, why] : bad) {
    try {
      parse_config(text, "r.toml", {"data.path=t.h5"});
      ADD_FAILURE() << "no error: " << text;
    } catch (const fsdp::Error& e) {
      EXPECT_THAT(std::string(e.what()), HasSubstr(why));
      EXPECT_EQ(e.exit_code(), 2);
    }
  }
}

// checkpoint.enable (torchtitan's): true by default; false round-trips through to_toml, and
// beside a periodic checkpoint.every it is one line naming every, exit 2.
TEST(Config, CheckpointEnableFalseRefusesAPeriodicSave) {
  EXPECT_TRUE(parse_config("", "c.toml", {"data.path=t.h5"}).checkpoint.enable);
  const Config off = parse_config("[checkpoint]\nenable = false\n", "c.toml", {"data.path=t.h5"});
  EXPECT_FALSE(off.checkpoint.enable);
  EXPECT_EQ(parse_config(to_toml(off), "c.toml", {}), off);
  EXPECT_EQ(error_of("[checkpoint]\nenable = false\nevery = 10\n", {"data.path=t.h5"}),
            "input.toml: checkpoint.every: must be 0 with checkpoint.enable = false (no "
            "checkpoint is written; or set checkpoint.enable = true)");
}

// fsdp.delayed_parameter_update needs the resident param_dtype shards of offload_optimizer
// (and cpu_offload off: it wins when both are set); one line naming the key, exit 2.
TEST(Config, DelayedParameterUpdateNeedsOffloadOptimizer) {
  EXPECT_FALSE(parse_config("", "dpu.toml", {"data.path=t.h5"}).fsdp.delayed_parameter_update);
  const Config ok = parse_config("[fsdp]\noffload_optimizer = true\ndelayed_parameter_update = true\n",
                                 "dpu.toml", {"data.path=t.h5"});
  EXPECT_TRUE(ok.fsdp.delayed_parameter_update);
  EXPECT_EQ(parse_config(to_toml(ok), "dpu.toml", {}), ok);
  const std::string why =
      "dpu.toml: fsdp.delayed_parameter_update: needs fsdp.offload_optimizer = true and "
      "fsdp.cpu_offload = false (the delayed update keeps the device's param_dtype shards from "
      "before it)";
  for (const std::string& text : {std::string("[fsdp]\ndelayed_parameter_update = true\n"),
                                  std::string("[fsdp]\ncpu_offload = true\noffload_optimizer = true\n"
                                              "delayed_parameter_update = true\n")}) {
    try {
      parse_config(text, "dpu.toml", {"data.path=t.h5"});
      ADD_FAILURE() << "no error: " << text;
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(std::string(e.what()), why);
      EXPECT_EQ(e.exit_code(), 2);
    }
  }
}

TEST(Config, EnumAndMixedPrecisionOverrides) {
  const Config c = parse_config(
      kMinimal, "min.toml",
      {"optim.name=sgd", "fsdp.auto_wrap_policy=NO_WRAP", "fsdp.backward_prefetch=NO_PREFETCH",
       "fsdp.forward_prefetch=true", "mixed_precision.param_dtype=bf16",
       "mixed_precision.reduce_dtype=\"fp16\"", "mixed_precision.init_scale=128.0",
       "mixed_precision.growth_factor=4", "mixed_precision.backoff_factor=0.125",
       "mixed_precision.growth_interval=1"});
  EXPECT_EQ(c.optim.name, OptimizerKind::sgd);
  EXPECT_EQ(c.fsdp.auto_wrap_policy, AutoWrapPolicy::NO_WRAP);
  EXPECT_EQ(c.fsdp.backward_prefetch, BackwardPrefetch::NO_PREFETCH);
  EXPECT_TRUE(c.fsdp.forward_prefetch);
  EXPECT_EQ(c.mixed_precision.param_dtype, DType::bf16);
  EXPECT_EQ(c.mixed_precision.reduce_dtype, DType::f16);
  EXPECT_TRUE(c.mixed_precision.uses_fp16());
  EXPECT_DOUBLE_EQ(c.mixed_precision.init_scale, 128.0);
  EXPECT_DOUBLE_EQ(c.mixed_precision.growth_factor, 4.0);
  EXPECT_DOUBLE_EQ(c.mixed_precision.backoff_factor, 0.125);
  EXPECT_EQ(c.mixed_precision.growth_interval, 1);

  // An override beats the file's value.
  const Config f = load_config(kInputs + "gpt2_fortunes.toml",
                               {"fsdp.forward_prefetch=false", "fsdp.backward_prefetch=BACKWARD_POST",
                                "mixed_precision.param_dtype=fp16"});
  EXPECT_FALSE(f.fsdp.forward_prefetch);
  EXPECT_EQ(f.fsdp.backward_prefetch, BackwardPrefetch::BACKWARD_POST);
  EXPECT_EQ(f.mixed_precision.param_dtype, DType::f16);
}

TEST(Config, EnumNames) {
  EXPECT_STREQ(to_string(BackwardPrefetch::BACKWARD_PRE), "BACKWARD_PRE");
  EXPECT_STREQ(to_string(BackwardPrefetch::BACKWARD_POST), "BACKWARD_POST");
  EXPECT_STREQ(to_string(BackwardPrefetch::NO_PREFETCH), "NO_PREFETCH");
  EXPECT_STREQ(to_string(AutoWrapPolicy::TRANSFORMER_BASED_WRAP), "TRANSFORMER_BASED_WRAP");
  EXPECT_STREQ(to_string(AutoWrapPolicy::NO_WRAP), "NO_WRAP");
  EXPECT_STREQ(to_string(OptimizerKind::adamw), "adamw");
  EXPECT_STREQ(to_string(OptimizerKind::sgd), "sgd");
  // Each name is read back as its value.
  for (auto p : {BackwardPrefetch::BACKWARD_PRE, BackwardPrefetch::BACKWARD_POST,
                 BackwardPrefetch::NO_PREFETCH}) {
    const Config c = parse_config(kMinimal, "min.toml",
                                  {std::string("fsdp.backward_prefetch=") + to_string(p)});
    EXPECT_EQ(c.fsdp.backward_prefetch, p);
  }
  for (auto t : {DType::f32, DType::bf16, DType::f16}) {
    const Config c = parse_config(
        kMinimal, "min.toml",
        {"mixed_precision.param_dtype=" + std::string(to_string(t)),
         "mixed_precision.reduce_dtype=" + std::string(to_string(t))});
    EXPECT_EQ(c.mixed_precision.param_dtype, t);
    EXPECT_EQ(c.mixed_precision.reduce_dtype, t);
  }
}

TEST(Config, OverrideBeatsFileAndLastOverrideWins) {
  const Config c = load_config(kInputs + "gpt2_fortunes.toml",
                               {"train.max_steps=10", "optim.min_lr=0", "train.max_steps=20",
                                "train.run_dir=123", "fsdp.transformer_layer_cls_to_wrap="
                                                     "GPT2Block"});
  EXPECT_EQ(c.train.max_steps, 20);
  EXPECT_DOUBLE_EQ(c.optim.min_lr, 0.0);
  EXPECT_EQ(c.train.run_dir, "123");  // a string key takes the text as written
  EXPECT_EQ(c.fsdp.transformer_layer_cls_to_wrap, std::vector<std::string>{"GPT2Block"});
  EXPECT_EQ(c.model.integer("n_layer"), 4);  // untouched keys keep the file's values
}

TEST(Config, OverrideCanSupplyRequiredKey) {
  const Config c = parse_config("", "empty.toml", {"data.path=x.h5"});
  EXPECT_EQ(c.data.path, "x.h5");
}

TEST(Config, ParseShardingStrategy) {
  for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP,
                 ShardingStrategy::NO_SHARD, ShardingStrategy::HYBRID_SHARD,
                 ShardingStrategy::HYBRID_SHARD_ZERO2}) {
    EXPECT_EQ(parse_sharding_strategy(to_string(s)), s);
  }
  EXPECT_STREQ(to_string(ShardingStrategy::HYBRID_SHARD_ZERO2), "HYBRID_SHARD_ZERO2");
  try {
    parse_sharding_strategy("full_shard");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_THAT(e.what(), HasSubstr("fsdp.sharding_strategy: unknown value \"full_shard\""));
  }
}

// Each bad input: TOML text, overrides (after a valid `data.path=tokens.h5`), substrings of
// the message.
struct BadCase {
  std::string text;
  std::vector<std::string> overrides;
  std::vector<std::string> expect;
};

// Issue 29 items 3 and 7: numbers beyond what a key can hold, and sizes whose products would
// overflow, are one line naming the key (and its value), never a negative count later.
TEST(Config, OutOfRangeNumbersAndOverflowingSizesNameTheirKeys) {
  const std::string d = kMinimal;
  EXPECT_THAT(error_of(d, {"model.n_layer=99999999999999999999"}),
              HasSubstr("--set model.n_layer=99999999999999999999: model.n_layer: "
                        "99999999999999999999 is out of range (expected an integer"));
  EXPECT_THAT(error_of(d, {"optim.lr=1e309"}),
              HasSubstr("optim.lr: 1e309 is out of range (expected a number, a finite double)"));
  EXPECT_THAT(error_of(d, {"train.seed=18446744073709551615"}),
              HasSubstr("train.seed: 18446744073709551615 is out of range"));
  // A word is still "expected an integer, got string".
  EXPECT_THAT(error_of(d, {"model.n_layer=four"}), HasSubstr("expected an integer, got string"));
  // Model sizes are bounded (every family): widths 2^24, layers 10^4.
  EXPECT_THAT(error_of(d, {"model.n_embd=2000000000"}),
              HasSubstr("model.n_embd: 2000000000 is out of range (expected an integer 1 <= x <= 16777216)"));
  EXPECT_THAT(error_of(d, {"model.type=llama", "model.num_hidden_layers=1000000"}),
              HasSubstr("model.num_hidden_layers: 1000000 is out of range (expected an integer 1 <= x <= 10000)"));
  // Within the bounds, the parameter count is still checked: 10^4 layers of width 2^24.
  const std::string params = error_of(d, {"model.n_layer=10000", "model.n_embd=16777216",
                                          "model.n_head=1"});
  EXPECT_THAT(params, HasSubstr("parameters is more than fsdp_train counts"));
  EXPECT_THAT(params, HasSubstr("model.n_layer = 10000"));
  EXPECT_THAT(params, HasSubstr("model.n_embd = 16777216"));
  // Tokens per step and a micro-batch's activations.
  EXPECT_THAT(error_of(d, {"train.global_batch_size=9000000000000000000"}),
              HasSubstr("train.global_batch_size: 9000000000000000000 sequences x 128 tokens (data.seq_len)"));
  EXPECT_THAT(error_of(d, {"train.global_batch_size=10000000000000"}),
              HasSubstr("data.seq_len: 128 tokens x 1e+13 sequences per forward"));
  // The same bounds hold for a Config built in code (check_config).
  Config c = parse_config(d, "input.toml", {});
  c.train.global_batch_size = 9000000000000000000;
  try {
    check_config(c);
    ADD_FAILURE() << "check_config passed 9e18 sequences per step";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("train.global_batch_size"));
  }
}

TEST(Config, EachErrorIsOneLineNamingTheKey) {
  const std::vector<BadCase> cases = {
      // unknown keys and sections, with suggestions
      {"[fsdp]\nshardin_strategy = \"FULL_SHARD\"\n", {},
       {"input.toml: unknown key 'fsdp.shardin_strategy'",
        "(did you mean 'fsdp.sharding_strategy'?)"}},
      {"[fdsp]\nsharding_strategy = \"NO_SHARD\"\n", {},
       {"unknown key 'fdsp.sharding_strategy'", "did you mean 'fsdp.sharding_strategy'"}},
      {"seed = 3\n", {}, {"unknown key 'seed'", "did you mean 'train.seed'"}},
      {"[model.extra]\nx = 1\n", {}, {"unknown key 'model.extra.x'"}},
      {"[nonsense]\n", {}, {"unknown key 'nonsense'"}},
      {"optim = 3\n", {}, {"input.toml: optim: expected a table"}},
      // wrong types
      {"[model]\nn_layer = \"four\"\n", {},
       {"input.toml: model.n_layer: expected an integer, got string"}},
      {"[model]\nn_layer = 4.0\n", {}, {"model.n_layer: expected an integer, got float"}},
      {"[optim]\nlr = \"fast\"\n", {}, {"optim.lr: expected a number, got string"}},
      {"[optim]\nlr = nan\n", {}, {"optim.lr: expected a finite number"}},
      {"[fsdp]\nlimit_all_gathers = 1\n", {}, {"fsdp.limit_all_gathers: expected a boolean"}},
      {"[fsdp]\nrecompute_num_layers = 2\n", {},
       {"input.toml: fsdp.recompute_num_layers: must be -1 with fsdp.activation_checkpointing = "
        "false (no block recomputes; or set fsdp.activation_checkpointing = true)"}},
      {"[fsdp]\nactivation_checkpointing = true\nrecompute_num_layers = -2\n", {},
       {"input.toml: fsdp.recompute_num_layers: -2 is out of range (expected an integer >= -1; "
        "-1 = every block)"}},
      {"[model]\nn_layer = 4\n[fsdp]\nactivation_checkpointing = true\nrecompute_num_layers = 5\n",
       {}, {"input.toml: fsdp.recompute_num_layers: 5 exceeds the model's 4 transformer blocks "
            "(expected -1 <= x <= 4)"}},
      {"[model]\ntype = \"t5\"\nnum_layers = 2\nnum_decoder_layers = 3\n", {
           "fsdp.activation_checkpointing=true", "fsdp.recompute_num_layers=6"},
       {"--set fsdp.recompute_num_layers=6: fsdp.recompute_num_layers: 6 exceeds the model's 5 "
        "transformer blocks"}},
      {"[model]\ntype = \"llama\"\nnum_hidden_layers = 2\n[fsdp]\nactivation_checkpointing = "
       "true\nrecompute_num_layers = 3\n", {},
       {"fsdp.recompute_num_layers: 3 exceeds the model's 2 transformer blocks"}},
      {"[data]\nsource = 5\n", {}, {"data.source: expected a string, got integer"}},
      {"[fsdp]\ntransformer_layer_cls_to_wrap = [1]\n", {},
       {"fsdp.transformer_layer_cls_to_wrap: expected an array of strings"}},
      {"[train]\nseed = -1\n", {}, {"train.seed: -1 is negative"}},
      // model
      {"[model]\ntype = \"t6\"\n", {},
       {"input.toml: model.type: unknown value \"t6\" (expected one of gpt2, t5, llama, mistral, "
        "qwen2, qwen3, olmo2, phi3, gemma3_text, smollm3, granite, olmo3, gemma2, gemma, "
        "exaone4, qwen3_moe, mixtral, olmoe, qwen2_moe, glm4_moe, deepseek_v3, deepseek_v2, "
        "gpt_oss, llama4_text, qwen3_5_text, qwen3_5_moe_text)"}},
      {"", {"model.type=bert"}, {"--set model.type=bert: model.type: unknown value \"bert\""}},
      // Mixture of experts: more experts per token than experts (each class's key names), a
      // negative load-balancing coefficient
      {"[model]\ntype = \"qwen3_moe\"\nnum_experts = 4\nnum_experts_per_tok = 5\n", {},
       {"input.toml: model.num_experts_per_tok: 5 exceeds model.num_experts = 4"}},
      {"[model]\ntype = \"mixtral\"\nnum_local_experts = 2\nnum_experts_per_tok = 3\n", {},
       {"input.toml: model.num_experts_per_tok: 3 exceeds model.num_local_experts = 2"}},
      // (Llama 4's input-scaled routing: one expert a token)
      {"[model]\ntype = \"llama4_text\"\nnum_experts_per_tok = 2\n", {},
       {"input.toml: model.num_experts_per_tok: 2 is not supported (expected 1"}},
      // (Qwen3.5's linear layers: CPU only; their key and value heads must group)
      {"[model]\ntype = \"qwen3_5_text\"\n[train]\ndevice = \"cuda\"\n", {},
       {"input.toml: train.device: \"cuda\" is not supported for qwen3_5_text yet"}},
      {"[model]\ntype = \"qwen3_5_moe_text\"\nlinear_num_key_heads = 3\n", {},
       {"input.toml: model.linear_num_value_heads: 4 is not a multiple of "
        "model.linear_num_key_heads = 3"}},
      {"[model]\ntype = \"olmoe\"\nrouter_aux_loss_coef = -0.1\n", {},
       {"input.toml: model.router_aux_loss_coef: -0.1 is out of range"}},
      {"[model]\ntype = \"mixtral\"\nnum_experts = 4\n", {},
       {"input.toml: unknown key 'model.num_experts'", "for model.type = \"mixtral\""}},
      // [model] keys belong to the chosen family.
      {"[model]\ntype = \"t5\"\nn_layer = 2\n", {},
       {"input.toml: unknown key 'model.n_layer'", "for model.type = \"t5\""}},
      {"[model]\nd_model = 64\n", {},
       {"input.toml: unknown key 'model.d_model'", "for model.type = \"gpt2\""}},
      {"", {"model.type=t5", "model.n_embd=64"},
       {"--set model.n_embd=64: unknown key 'model.n_embd'", "for model.type = \"t5\""}},
      {"[model]\ntype = \"t5\"\nfeed_forward_proj = \"gelu\"\n", {},
       {"input.toml: model.feed_forward_proj: unknown value \"gelu\" (expected one of relu, "
        "gated-gelu)"}},
      {"[model]\ntype = \"t5\"\nd_kv = 0\n", {}, {"input.toml: model.d_kv: 0 is out of range"}},
      {"[model]\ntype = \"t5\"\nvocab_size = 256\n", {},
       {"input.toml: model.vocab_size: 256 is out of range (expected >= 259"}},
      {"[model]\ntype = \"t5\"\nrelative_attention_max_distance = 8\n", {},
       {"model.relative_attention_max_distance: 8 is out of range"}},
      {"[model]\ntype = \"t5\"\ntie_word_embeddings = 1\n", {},
       {"input.toml: model.tie_word_embeddings: expected a boolean (true or false), got integer"}},
      {"[model]\ntype = \"t5\"\n[data]\nobjective = \"causal_lm\"\n", {},
       {"input.toml: data.objective: \"causal_lm\" is not an objective of model.type = \"t5\" "
        "(expected \"seq2seq\" or \"span_corruption\")"}},
      {"[data]\nobjective = \"seq2seq\"\n", {},
       {"data.objective: \"seq2seq\" is not an objective of model.type = \"gpt2\""}},
      {"[data]\nobjective = \"mlm\"\n", {}, {"data.objective: unknown value \"mlm\""}},
      {"[model]\ntype = \"t5\"\n[fsdp]\ntransformer_layer_cls_to_wrap = [\"GPT2Block\"]\n", {},
       {"fsdp.transformer_layer_cls_to_wrap: unknown module class \"GPT2Block\" for model.type = "
        "\"t5\" (expected one of T5Block)"}},
      {"[model]\nn_layer = 0\n", {}, {"model.n_layer: 0 is out of range (expected an integer 1 <= x <= 10000)"}},
      {"[model]\nn_head = 0\n", {}, {"model.n_head: 0"}},
      {"[model]\nn_embd = -1\n", {}, {"model.n_embd: -1"}},
      {"[model]\nn_positions = 0\n", {}, {"model.n_positions: 0"}},
      {"[model]\nvocab_size = 0\n", {}, {"model.vocab_size: 0"}},
      {"[model]\nn_embd = 100\nn_head = 3\n", {},
       {"input.toml: model.n_embd: 100 is not divisible by model.n_head = 3"}},
      {"[model]\nlayer_norm_epsilon = 0\n", {}, {"model.layer_norm_epsilon"}},
      // model.pad_vocab_multiple: an integer 1 <= x <= 65536, for every model type
      {"[model]\npad_vocab_multiple = 0\n", {},
       {"input.toml: model.pad_vocab_multiple: 0 is out of range (expected an integer 1 <= x <= "
        "65536; 1 = no padding)"}},
      {"[model]\ntype = \"t5\"\npad_vocab_multiple = -128\n", {},
       {"input.toml: model.pad_vocab_multiple: -128 is out of range"}},
      {"", {"model.pad_vocab_multiple=100000"},
       {"--set model.pad_vocab_multiple=100000: model.pad_vocab_multiple: 100000 is out of range"}},
      {"[model]\npad_vocab_multiple = 1.5\n", {},
       {"input.toml: model.pad_vocab_multiple: expected an integer, got float"}},
      {"", {"model.pad_vocab_multiple=128.0"},
       {"--set model.pad_vocab_multiple=128.0: model.pad_vocab_multiple: expected an integer, got float"}},
      {"[model]\npad_vocab_multiple = \"128\"\n", {},
       {"input.toml: model.pad_vocab_multiple: expected an integer, got string"}},
      // data
      {"[data]\nsource = \"csv\"\n", {},
       {"data.source: unknown value \"csv\" (expected one of hdf5, synthetic)"}},
      {"[data]\nseq_len = 0\n", {}, {"data.seq_len: 0"}},
      {"[data]\nseq_len = 257\n", {}, {"data.seq_len: 257 exceeds model.n_positions = 256"}},
      // train
      {"[train]\nglobal_batch_size = 0\n", {}, {"train.global_batch_size: 0"}},
      {"[train]\nmax_steps = 0\n", {}, {"train.max_steps: 0"}},
      {"[train]\nnum_threads = -1\n", {}, {"train.num_threads: -1"}},
      {"[train]\nlog_every = 0\n", {}, {"train.log_every: 0"}},
      {"[train]\nrun_dir = \"\"\n", {}, {"train.run_dir: must not be empty"}},
      // optim
      {"[optim]\nname = \"adam\"\n", {},
       {"optim.name: unknown value \"adam\" (expected one of adamw, sgd)"}},
      {"[optim]\nlr = 0\n", {}, {"optim.lr: 0 is out of range (expected 0 < lr <= 10)"}},
      {"[optim]\nlr = 1e3\n", {}, {"optim.lr: 1000 is out of range (expected 0 < lr <= 10)"}},
      {"[optim]\nlr = 1e308\n", {}, {"optim.lr: 1e+308 is out of range"}},
      {"[optim]\neps = 1\n", {}, {"optim.eps: 1 is out of range (expected 0 < eps < 1)"}},
      {"[train]\nskip_nonfinite = 1\n", {}, {"train.skip_nonfinite: expected a boolean"}},
      {"[optim]\nmin_lr = 0.01\n", {}, {"optim.min_lr: 0.01", "min_lr <= optim.lr"}},
      {"[optim]\nmin_lr = -1\n", {}, {"optim.min_lr: -1"}},
      {"[optim]\nwarmup_steps = -1\n", {}, {"optim.warmup_steps: -1"}},
      {"[optim]\ndecay_steps = 10\n", {}, {"optim.decay_steps: 10 is less than optim.warmup_steps"}},
      {"[optim]\nlr_scheduler_type = \"cosine_with_restarts\"\n", {},
       {"optim.lr_scheduler_type: unknown value \"cosine_with_restarts\" (expected one of cosine, "
        "linear, constant_with_warmup, warmup_stable_decay)"}},
      {"[optim]\nlr_scheduler_type = \"warmup_stable_decay\"\n", {},
       {"optim.num_decay_steps: 0 is out of range for optim.lr_scheduler_type = "
        "\"warmup_stable_decay\" (expected 1 <= num_decay_steps <= train.max_steps - "
        "optim.warmup_steps = "}},
      {"[optim]\nlr_scheduler_type = \"warmup_stable_decay\"\nwarmup_steps = 10\n"
       "decay_steps = 50\nnum_decay_steps = 41\n",
       {}, {"optim.num_decay_steps: 41", "optim.decay_steps - optim.warmup_steps = 40)"}},
      {"[optim]\ndecay_type = \"sqrt\"\n", {},
       {"optim.decay_type: unknown value \"sqrt\" (expected one of cosine, linear, 1-sqrt)"}},
      {"[optim]\nweight_decay = -0.1\n", {}, {"optim.weight_decay: -0.1"}},
      {"[optim]\ngrad_clip = -1\n", {}, {"optim.grad_clip: -1"}},
      {"[optim]\nbeta1 = 1\n", {}, {"optim.beta1: 1 is out of range (expected 0 <= x < 1)"}},
      {"[optim]\nbeta2 = -0.5\n", {}, {"optim.beta2: -0.5"}},
      {"[optim]\neps = 0\n", {}, {"optim.eps: 0"}},
      {"[optim]\nmomentum = 1.5\n", {}, {"optim.momentum: 1.5"}},
      // fsdp
      {"[fsdp]\nsharding_strategy = \"FUL_SHARD\"\n", {},
       {"input.toml: fsdp.sharding_strategy: unknown value \"FUL_SHARD\" (expected one of "
        "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2)"}},
      {"[fsdp]\nauto_wrap_policy = \"SIZE_BASED_WRAP\"\n", {},
       {"fsdp.auto_wrap_policy: unknown value \"SIZE_BASED_WRAP\"", "NO_WRAP"}},
      {"[fsdp]\ntransformer_layer_cls_to_wrap = [\"T5Block\"]\n", {},
       {"fsdp.transformer_layer_cls_to_wrap: unknown module class \"T5Block\"", "GPT2Block"}},
      {"[fsdp]\ntransformer_layer_cls_to_wrap = []\n", {},
       {"fsdp.transformer_layer_cls_to_wrap: empty"}},
      {"[fsdp]\nauto_wrap_policy = \"no_wrap\"\n", {},
       {"input.toml: fsdp.auto_wrap_policy: unknown value \"no_wrap\" (expected one of "
        "TRANSFORMER_BASED_WRAP, NO_WRAP)"}},
      {"[fsdp]\nauto_wrap_policy = 1\n", {},
       {"fsdp.auto_wrap_policy: expected a string, got integer"}},
      {"[fsdp]\nbackward_prefetch = \"PRE\"\n", {},
       {"fsdp.backward_prefetch: unknown value \"PRE\"", "BACKWARD_POST"}},
      {"[fsdp]\nbackward_prefetch = \"NONE\"\n", {},  // the old spelling of NO_PREFETCH
       {"input.toml: fsdp.backward_prefetch: unknown value \"NONE\" (expected one of "
        "BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH)"}},
      {"[fsdp]\nforward_prefetch = \"yes\"\n", {},
       {"input.toml: fsdp.forward_prefetch: expected a boolean (true or false), got string"}},
      // mixed_precision
      {"[mixed_precision]\nparam_dtype = \"fp8\"\n", {},
       {"input.toml: mixed_precision.param_dtype: unknown value \"fp8\" (expected one of "
        "fp32, bf16, fp16)"}},
      {"[mixed_precision]\nparam_dtype = \"fp64\"\n", {},  // a DType, but not for FSDP
       {"mixed_precision.param_dtype: unknown value \"fp64\" (expected one of fp32, bf16, "
        "fp16)"}},
      {"[mixed_precision]\nreduce_dtype = \"int32\"\n", {},
       {"input.toml: mixed_precision.reduce_dtype: unknown value \"int32\" (expected one of "
        "fp32, bf16, fp16)"}},
      {"[mixed_precision]\nreduce_dtype = \"BF16\"\n", {},
       {"mixed_precision.reduce_dtype: unknown value \"BF16\""}},
      {"[mixed_precision]\nparam_dtype = 16\n", {},
       {"mixed_precision.param_dtype: expected a string, got integer"}},
      {"[mixed_precision]\ninit_scale = 0\n", {},
       {"input.toml: mixed_precision.init_scale: 0 is out of range (expected > 0)"}},
      {"[mixed_precision]\ninit_scale = -2\n", {}, {"mixed_precision.init_scale: -2"}},
      {"[mixed_precision]\ninit_scale = inf\n", {},
       {"mixed_precision.init_scale: expected a finite number, got inf"}},
      {"[mixed_precision]\ngrowth_factor = 1\n", {},
       {"input.toml: mixed_precision.growth_factor: 1 is out of range (expected > 1)"}},
      {"[mixed_precision]\ngrowth_factor = 0.5\n", {}, {"mixed_precision.growth_factor: 0.5"}},
      {"[mixed_precision]\nbackoff_factor = 1\n", {},
       {"input.toml: mixed_precision.backoff_factor: 1 is out of range (expected 0 < x < 1)"}},
      {"[mixed_precision]\nbackoff_factor = 0\n", {},
       {"mixed_precision.backoff_factor: 0 is out of range (expected 0 < x < 1)"}},
      {"[mixed_precision]\ngrowth_interval = 0\n", {},
       {"input.toml: mixed_precision.growth_interval: 0 is out of range (expected an integer "
        ">= 1)"}},
      {"[mixed_precision]\ngrowth_interval = 1.5\n", {},
       {"mixed_precision.growth_interval: expected an integer, got float"}},
      {"[mixed_precision]\nparam_dtyp = \"bf16\"\n", {},
       {"unknown key 'mixed_precision.param_dtyp'",
        "did you mean 'mixed_precision.param_dtype'"}},
      {"[mixed_precisions]\nparam_dtype = \"bf16\"\n", {},
       {"unknown key 'mixed_precisions.param_dtype'",
        "did you mean 'mixed_precision.param_dtype'"}},
      {"mixed_precision = \"bf16\"\n", {},
       {"input.toml: mixed_precision: expected a table"}},
      // mesh, checkpoint, eval
      {"[mesh]\nshard_size = -2\n", {}, {"mesh.shard_size: -2"}},
      {"[checkpoint]\nevery = -1\n", {}, {"checkpoint.every: -1"}},
      {"[eval]\nevery = -1\n", {}, {"eval.every: -1"}},
      {"[eval]\nmax_windows = -1\n", {}, {"eval.max_windows: -1"}},
      // overrides
      {"", {"model.n_layer"}, {"--set model.n_layer: expected section.key=value"}},
      {"", {"n_layer=3"}, {"--set n_layer=3: expected section.key=value"}},
      {"", {".n_layer=3"}, {"expected section.key=value"}},
      {"", {"model.n_layr=3"},
       {"--set model.n_layr=3: unknown key 'model.n_layr'", "did you mean 'model.n_layer'"}},
      {"", {"model.n_layer.x=3"}, {"unknown key 'model.n_layer.x'"}},
      {"", {"model.n_layer=abc"},
       {"--set model.n_layer=abc: model.n_layer: expected an integer, got string"}},
      {"", {"fsdp.sharding_strategy=FUL_SHARD"},
       {"--set fsdp.sharding_strategy=FUL_SHARD: fsdp.sharding_strategy: unknown value"}},
      {"", {"fsdp.transformer_layer_cls_to_wrap=[\"GPT2Block\""},
       {"--set fsdp.transformer_layer_cls_to_wrap=[\"GPT2Block\": "}},
      {"", {"model.n_head=3"}, {"model.n_embd: 128 is not divisible by model.n_head = 3"}},
      {"", {"optim.lr=-1"}, {"--set optim.lr=-1: optim.lr: -1 is out of range"}},
      {"", {"optim.name=Adam"},
       {"--set optim.name=Adam: optim.name: unknown value \"Adam\" (expected one of adamw, "
        "sgd)"}},
      {"", {"fsdp.backward_prefetch=NONE"},
       {"--set fsdp.backward_prefetch=NONE: fsdp.backward_prefetch: unknown value \"NONE\" "
        "(expected one of BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH)"}},
      {"", {"fsdp.forward_prefetch=1"},
       {"--set fsdp.forward_prefetch=1: fsdp.forward_prefetch: expected a boolean"}},
      {"", {"mixed_precision.param_dtype=fp8"},
       {"--set mixed_precision.param_dtype=fp8: mixed_precision.param_dtype: unknown value "
        "\"fp8\" (expected one of fp32, bf16, fp16)"}},
      {"", {"mixed_precision.reduce_dtype=float16"},
       {"--set mixed_precision.reduce_dtype=float16: mixed_precision.reduce_dtype: unknown "
        "value \"float16\" (expected one of fp32, bf16, fp16)"}},
      {"", {"mixed_precision.init_scale=0"},
       {"--set mixed_precision.init_scale=0: mixed_precision.init_scale: 0 is out of range"}},
      {"", {"mixed_precision.growth_factor=1.0"},
       {"--set mixed_precision.growth_factor=1.0: mixed_precision.growth_factor: 1 is out of "
        "range (expected > 1)"}},
      {"", {"mixed_precision.backoff_factor=1.5"},
       {"--set mixed_precision.backoff_factor=1.5: mixed_precision.backoff_factor: 1.5 is out "
        "of range (expected 0 < x < 1)"}},
      {"", {"mixed_precision.growth_interval=-3"},
       {"--set mixed_precision.growth_interval=-3: mixed_precision.growth_interval: -3 is out "
        "of range"}},
      {"", {"mixed_precision.growth_interval=often"},
       {"--set mixed_precision.growth_interval=often: mixed_precision.growth_interval: "
        "expected an integer, got string"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text + (c.overrides.empty() ? "" : " --set " + c.overrides[0]));
    std::vector<std::string> overrides = {"data.path=tokens.h5"};
    overrides.insert(overrides.end(), c.overrides.begin(), c.overrides.end());
    const std::string msg = error_of(c.text, overrides);
    for (const auto& want : c.expect) EXPECT_THAT(msg, HasSubstr(want));
  }
}

TEST(Config, ProfileSteps) {
  // Off by default; [first, last] from the file or --set; printed back as TOML.
  EXPECT_TRUE(parse_config(kMinimal, "min.toml", {}).train.profile_steps.empty());
  EXPECT_THAT(to_toml(parse_config(kMinimal, "min.toml", {})), HasSubstr("\nprofile_steps = []\n"));
  const Config c = parse_config(kMinimal + "[train]\nprofile_steps = [2, 3]\n", "p.toml", {});
  EXPECT_EQ(c.train.profile_steps, (std::vector<int64_t>{2, 3}));
  EXPECT_THAT(to_toml(c), HasSubstr("\nprofile_steps = [2, 3]\n"));
  EXPECT_EQ(parse_config(kMinimal, "p.toml", {"train.profile_steps=[7,7]"}).train.profile_steps,
            (std::vector<int64_t>{7, 7}));
  EXPECT_TRUE(parse_config(kMinimal + "[train]\nprofile_steps = []\n", "p.toml", {})
                  .train.profile_steps.empty());
  // The rule --profile shares.
  EXPECT_EQ(profile_steps_error(1, 1), "");
  EXPECT_EQ(profile_steps_error(0, 2), "first step 0 is out of range (expected >= 1)");
  EXPECT_EQ(profile_steps_error(3, 2), "last step 2 is before the first step 3 (expected first <= last)");
  // Bad values: one line naming the key and where it came from.
  const std::string train = kMinimal + "[train]\n";
  EXPECT_EQ(error_of(train + "profile_steps = [0, 3]\n"),
            "input.toml: train.profile_steps: first step 0 is out of range (expected >= 1)");
  EXPECT_EQ(error_of(train + "profile_steps = [5, 4]\n"),
            "input.toml: train.profile_steps: last step 4 is before the first step 5 "
            "(expected first <= last)");
  EXPECT_EQ(error_of(train + "profile_steps = [-2, 4]\n"),
            "input.toml: train.profile_steps: first step -2 is out of range (expected >= 1)");
  EXPECT_EQ(error_of(train + "profile_steps = [3]\n"),
            "input.toml: train.profile_steps: expected [first, last] (two step numbers) or [], "
            "got 1 values");
  EXPECT_EQ(error_of(train + "profile_steps = [1, 2, 3]\n"),
            "input.toml: train.profile_steps: expected [first, last] (two step numbers) or [], "
            "got 3 values");
  EXPECT_EQ(error_of(train + "profile_steps = 3\n"),
            "input.toml: train.profile_steps: expected an array of integers, got integer");
  EXPECT_EQ(error_of(train + "profile_steps = [1.5, 2]\n"),
            "input.toml: train.profile_steps: expected an array of integers, got a float element");
  EXPECT_EQ(error_of(kMinimal, {"train.profile_steps=[4,2]"}),
            "--set train.profile_steps=[4,2]: train.profile_steps: last step 2 is before the "
            "first step 4 (expected first <= last)");
  EXPECT_EQ(error_of(kMinimal, {"train.profile_steps=2:3"}),
            "--set train.profile_steps=2:3: train.profile_steps: expected an array of integers, "
            "got string");
}

TEST(Config, HdfsSourceRequiresPath) {
  EXPECT_EQ(error_of(""),
            "input.toml: data.path: required (path to an HDF5 token file, see docs/data.md)");
  EXPECT_NO_THROW(parse_config("[data]\nsource = \"synthetic\"\n", "s.toml", {}));
}

TEST(Config, MalformedTomlGivesLineAndColumn) {
  const std::string msg = error_of("[model]\nn_layer = 4\nn_head = = 2\n");
  EXPECT_THAT(msg, HasSubstr("input.toml:3:"));
  const std::string msg2 = error_of("[model\n");
  EXPECT_THAT(msg2, HasSubstr("input.toml:1:"));
}

TEST(Config, MissingFile) {
  try {
    load_config("/nonexistent/dir/run.toml", {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_STREQ(e.what(), "/nonexistent/dir/run.toml: cannot read config file");
  }
  try {
    load_config(kInputs, {});  // a directory
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_THAT(e.what(), HasSubstr("cannot read config file"));
  }
}

TEST(Config, LoadAppliesOverridesAndReportsFileErrors) {
  const auto path = std::filesystem::path(FSDP_BINARY_DIR) / "test_config_bad.toml";
  {
    std::ofstream out(path);
    out << "[data]\nsource = \"synthetic\"\n[model]\nn_layer = \"x\"\n";
  }
  try {
    load_config(path.string(), {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_EQ(std::string(e.what()),
              path.string() + ": model.n_layer: expected an integer, got string");
  }
  const Config c = load_config(path.string(), {"model.n_layer=3"});
  EXPECT_EQ(c.model.integer("n_layer"), 3);
  std::filesystem::remove(path);
}

TEST(Config, T5KeysDefaultsAndModelDependentDefaults) {
  const Config c = parse_config("[model]\ntype = \"t5\"\nd_model = 64\nfeed_forward_proj = "
                                "\"gated-gelu\"\ntie_word_embeddings = false\n",
                                "t5.toml", {"data.path=pairs.h5", "model.num_heads=8"});
  EXPECT_EQ(c.model.type, "t5");
  EXPECT_EQ(c.model.integer("d_model"), 64);
  EXPECT_EQ(c.model.integer("num_heads"), 8);
  EXPECT_EQ(c.model.integer("d_kv"), 32);  // a default of the family
  EXPECT_EQ(c.model.string("feed_forward_proj"), "gated-gelu");
  EXPECT_FALSE(c.model.boolean("tie_word_embeddings"));
  EXPECT_DOUBLE_EQ(c.model.number("layer_norm_epsilon"), 1e-6);
  EXPECT_EQ(c.model.integer("vocab_size"), 384);
  // Unset, the wrap classes and the objective are the model's.
  EXPECT_EQ(c.fsdp.transformer_layer_cls_to_wrap, std::vector<std::string>{"T5Block"});
  EXPECT_EQ(c.data.objective, Objective::seq2seq);
  EXPECT_THROW(c.model.integer("n_layer"), Error);       // not a T5 key
  EXPECT_THROW(c.model.integer("feed_forward_proj"), Error);  // a string, read as an integer
  // The resolved text loads back to the same config (model keys in the family's order).
  const std::string text = to_toml(c);
  EXPECT_THAT(text, HasSubstr("[model]\ntype = \"t5\"\ninit_from = \"\"\npad_vocab_multiple = 128\nd_model = 64\n"));
  EXPECT_EQ(parse_config(text, "t5.toml", {}), c);
  // Every input file loads, T5's included.
  EXPECT_EQ(load_config(kInputs + "t5_wordnet.toml", {}).fsdp.sharding_strategy,
            ShardingStrategy::HYBRID_SHARD);
  EXPECT_EQ(load_config(kInputs + "t5_small.toml", {}).model.integer("d_model"), 512);
}

TEST(Config, ToTomlRoundTrips) {
  // Every key away from its default, including awkward strings and floats.
  const Config c = parse_config(
      "", "custom.toml",
      {"model.n_layer=3", "model.n_head=8", "model.n_embd=64", "model.n_positions=512",
       "model.vocab_size=50257", "model.layer_norm_epsilon=1e-6", "model.pad_vocab_multiple=64",
       "data.source=synthetic",
       "data.path=\"a \\\"quoted\\\" path\\\\x.h5\"", "data.seq_len=511",
       "train.global_batch_size=12", "train.max_steps=77", "train.seed=4242",
       "train.run_dir=runs/r", "train.log_every=3", "train.num_threads=2", "optim.name=sgd",
       "optim.lr=0.1", "optim.min_lr=0.1", "optim.warmup_steps=0", "optim.decay_steps=70",
       "optim.weight_decay=0", "optim.grad_clip=0.3333333333333333", "optim.beta1=0.8",
       "optim.beta2=0.95", "optim.eps=1e-12", "optim.momentum=0",
       "fsdp.sharding_strategy=HYBRID_SHARD_ZERO2", "fsdp.auto_wrap_policy=NO_WRAP",
       "fsdp.transformer_layer_cls_to_wrap=[]", "fsdp.backward_prefetch=NO_PREFETCH",
       "fsdp.forward_prefetch=true", "fsdp.limit_all_gathers=false",
       "mixed_precision.param_dtype=fp16", "mixed_precision.reduce_dtype=bf16",
       "mixed_precision.init_scale=1e9", "mixed_precision.growth_factor=1.0000001",
       "mixed_precision.backoff_factor=0.1", "mixed_precision.growth_interval=123456789",
       "mesh.shard_size=4", "checkpoint.every=9", "eval.every=0", "eval.max_windows=17",
       "train.profile_steps=[4, 9]"});
  EXPECT_EQ(c.data.path, "a \"quoted\" path\\x.h5");
  Config defaults;
  defaults.source_path = "custom.toml";
  {
    // The config above really differs from the defaults in every section.
    EXPECT_NE(c.model, defaults.model);
    EXPECT_NE(c.data, defaults.data);
    EXPECT_NE(c.train, defaults.train);
    EXPECT_NE(c.optim, defaults.optim);
    EXPECT_NE(c.fsdp, defaults.fsdp);
    EXPECT_NE(c.mixed_precision, defaults.mixed_precision);
    EXPECT_NE(c.mesh, defaults.mesh);
    EXPECT_NE(c.checkpoint, defaults.checkpoint);
    EXPECT_NE(c.eval, defaults.eval);
  }
  {
    // Each key of those sections on its own, so no field is equal to its default by accident.
    EXPECT_EQ(c.optim.name, OptimizerKind::sgd);
    EXPECT_EQ(c.fsdp.auto_wrap_policy, AutoWrapPolicy::NO_WRAP);
    EXPECT_EQ(c.fsdp.backward_prefetch, BackwardPrefetch::NO_PREFETCH);
    EXPECT_NE(c.fsdp.forward_prefetch, defaults.fsdp.forward_prefetch);
    const auto& mp = c.mixed_precision;
    const auto& dmp = defaults.mixed_precision;
    EXPECT_NE(mp.param_dtype, dmp.param_dtype);
    EXPECT_NE(mp.reduce_dtype, dmp.reduce_dtype);
    EXPECT_NE(mp.param_dtype, mp.reduce_dtype);
    EXPECT_NE(mp.init_scale, dmp.init_scale);
    EXPECT_NE(mp.growth_factor, dmp.growth_factor);
    EXPECT_NE(mp.backoff_factor, dmp.backoff_factor);
    EXPECT_NE(mp.growth_interval, dmp.growth_interval);
  }
  const std::string text = to_toml(c);
  const Config back = parse_config(text, "custom.toml", {});
  EXPECT_EQ(back, c) << text;
  EXPECT_EQ(to_toml(back), text);
  EXPECT_THAT(text, HasSubstr("\n[optim]\nname = \"sgd\"\n"));
  EXPECT_THAT(text, HasSubstr("auto_wrap_policy = \"NO_WRAP\"\n"));
  EXPECT_THAT(text, HasSubstr("backward_prefetch = \"NO_PREFETCH\"\n"));
  EXPECT_THAT(text, HasSubstr("forward_prefetch = true\n"));
  EXPECT_THAT(text, HasSubstr("\n[mixed_precision]\nparam_dtype = \"fp16\"\n"
                              "reduce_dtype = \"bf16\"\n"));
  EXPECT_THAT(text, HasSubstr("growth_interval = 123456789\n"));
  EXPECT_THAT(text, HasSubstr("pad_vocab_multiple = 64\n"));
  EXPECT_EQ(c.model.pad_vocab_multiple, 64);

  // The defaults print every key too, and read back equal.
  Config d = parse_config(kMinimal, "min.toml", {});
  const std::string dtext = to_toml(d);
  EXPECT_EQ(parse_config(dtext, "min.toml", {}), d) << dtext;
  EXPECT_EQ(d.model.pad_vocab_multiple, 128);  // Megatron-LM's make-vocab-size-divisible-by
  EXPECT_THAT(dtext, HasSubstr("init_from = \"\"\npad_vocab_multiple = 128\n"));
  EXPECT_THAT(dtext, HasSubstr("backward_prefetch = \"BACKWARD_PRE\"\nforward_prefetch = false\n"
                               "limit_all_gathers = true\n"));
  EXPECT_THAT(dtext, HasSubstr("[mixed_precision]\nparam_dtype = \"fp32\"\nreduce_dtype = "
                               "\"fp32\"\ninit_scale = 65536.0\ngrowth_factor = 2.0\n"
                               "backoff_factor = 0.5\ngrowth_interval = 2000\n"));

  // The fortunes input round-trips too, and the sections come in the documented order.
  const Config f = load_config(kInputs + "gpt2_fortunes.toml", {});
  const std::string ftext = to_toml(f);
  EXPECT_EQ(parse_config(ftext, f.source_path, {}), f) << ftext;
  std::size_t last = 0;
  for (const char* sec : {"[model]", "[data]", "[train]", "[optim]", "[fsdp]",
                          "[mixed_precision]", "[mesh]", "[checkpoint]", "[eval]"}) {
    const std::size_t at = ftext.find(sec);
    ASSERT_NE(at, std::string::npos) << sec;
    EXPECT_GE(at, last) << sec;
    last = at;
  }
  EXPECT_THAT(ftext, HasSubstr("sharding_strategy = \"FULL_SHARD\"\n"));
  EXPECT_THAT(ftext, HasSubstr("transformer_layer_cls_to_wrap = [\"GPT2Block\"]\n"));
  EXPECT_THAT(ftext, HasSubstr("grad_clip = 1.0\n"));
  EXPECT_THAT(ftext, HasSubstr("lr = 0.003\n"));
  EXPECT_THAT(ftext, HasSubstr("forward_prefetch = true\n"));
}


// Document masking (docs/data.md "Document masking"): data.attn_mask_type, reset_position_ids
// and eos_token_id, their defaults, values, the cross-key errors (each one line naming its key)
// and their resume flags.
// optim.moe_router_bias_update_rate: only routers with a selection bias (GLM-4.5,
// DeepSeek-V3) take it; another family or class is refused naming the key; negative refused.
TEST(Config, RouterBiasUpdateNeedsASelectionBias) {
  for (const char* type : {"glm4_moe", "deepseek_v3"}) {
    EXPECT_NO_THROW(parse_config("[model]\ntype = \"" + std::string(type) + "\"\n" + kMinimal,
                                 "in.toml", {"optim.moe_router_bias_update_rate=0.001"}))
        << type;
  }
  for (const char* type : {"gpt2", "t5", "qwen3_moe", "llama"}) {
    EXPECT_THAT(error_of("[model]\ntype = \"" + std::string(type) + "\"\n" + kMinimal,
                         {"optim.moe_router_bias_update_rate=0.001"}),
                HasSubstr("optim.moe_router_bias_update_rate: > 0 needs routers with a selection "
                          "bias"))
        << type;
  }
  EXPECT_THAT(error_of(kMinimal, {"optim.moe_router_bias_update_rate=-1"}),
              HasSubstr("optim.moe_router_bias_update_rate: -1 is out of range"));
}

// data.packing: sft only, and with block_causal (else each example would see its row's
// others); an error names the key.
TEST(Config, PackingNeedsSftAndBlockCausal) {
  const std::string llama = "[model]\ntype = \"llama\"\n" + kMinimal;
  EXPECT_NO_THROW(parse_config(llama, "in.toml",
                               {"data.objective=sft", "data.packing=true",
                                "data.attn_mask_type=block_causal", "data.reset_position_ids=true"}));
  EXPECT_THAT(error_of(llama, {"data.packing=true", "data.attn_mask_type=block_causal"}),
              HasSubstr("data.packing: true needs data.objective = \"sft\" (got \"causal_lm\""));
  EXPECT_THAT(error_of(llama, {"data.objective=sft", "data.packing=true"}),
              HasSubstr("data.packing: true needs data.attn_mask_type = \"block_causal\""));
  EXPECT_THAT(error_of(llama, {"data.objective=sft", "data.attn_mask_type=block_causal"}),
              HasSubstr("or \"sft\" with data.packing = true"));
}

// data.eod_mask_loss: causal_lm with block_causal only; an error names the key.
TEST(Config, EodMaskLossNeedsBlockCausal) {
  const std::string llama = "[model]\ntype = \"llama\"\n" + kMinimal;
  EXPECT_NO_THROW(parse_config(llama, "in.toml",
                               {"data.attn_mask_type=block_causal", "data.eod_mask_loss=true"}));
  EXPECT_THAT(error_of(llama, {"data.eod_mask_loss=true"}),
              HasSubstr("data.eod_mask_loss: true needs data.objective = \"causal_lm\" with "
                        "data.attn_mask_type = \"block_causal\""));
}

TEST(Config, DocumentMaskingKeys) {
  const Config d = parse_config(kMinimal, "min.toml", {});
  EXPECT_EQ(d.data.attn_mask_type, AttnMaskType::causal);
  EXPECT_FALSE(d.data.reset_position_ids);
  EXPECT_EQ(d.data.eos_token_id, -1);
  EXPECT_STREQ(to_string(AttnMaskType::block_causal), "block_causal");
  const Config c = parse_config(
      "[model]\ntype = \"llama\"\n[data]\npath = \"t.h5\"\nattn_mask_type = \"block_causal\"\n"
      "reset_position_ids = true\n",
      "in.toml", {"data.eos_token_id=2"});
  EXPECT_EQ(c.data.attn_mask_type, AttnMaskType::block_causal);
  EXPECT_TRUE(c.data.reset_position_ids);
  EXPECT_EQ(c.data.eos_token_id, 2);
  const std::string toml = to_toml(c);
  EXPECT_THAT(toml, HasSubstr("attn_mask_type = \"block_causal\"\n"));
  EXPECT_THAT(toml, HasSubstr("reset_position_ids = true\n"));
  EXPECT_THAT(toml, HasSubstr("eos_token_id = 2\n"));
  EXPECT_EQ(parse_config(toml, "round.toml", {}), [&] {
    Config r = c;
    r.source_path = "round.toml";
    return r;
  }());
  // Block causal alone (positions run along the row) is valid; synthetic data too (the data
  // side asks for data.eos_token_id).
  const std::string llama = "[model]\ntype = \"llama\"\n" + kMinimal;
  EXPECT_NO_THROW(parse_config(llama, "min.toml", {"data.attn_mask_type=block_causal"}));
  // GPT-2 and Llama 4 take it too; longrope with reset positions does not.
  EXPECT_NO_THROW(parse_config(
      kMinimal, "min.toml", {"data.attn_mask_type=block_causal", "data.reset_position_ids=true"}));
  EXPECT_NO_THROW(parse_config("[model]\ntype = \"llama4_text\"\n" + kMinimal, "l4.toml",
                               {"data.attn_mask_type=block_causal"}));
  EXPECT_NO_THROW(parse_config("[model]\ntype = \"phi3\"\n" + kMinimal, "phi3.toml",
                               {"data.attn_mask_type=block_causal"}));
  EXPECT_THAT(error_of("[model]\ntype = \"phi3\"\nrope_scaling = { rope_type = \"longrope\", "
                       "short_factor = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, "
                       "1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, "
                       "1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, "
                       "1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], long_factor = [1.0, 1.0, 1.0, 1.0, "
                       "1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, "
                       "1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, "
                       "1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0] }\n" +
                           kMinimal,
                       {"data.attn_mask_type=block_causal", "data.reset_position_ids=true"}),
              HasSubstr("data.reset_position_ids: true is not supported with longrope"));

  EXPECT_EQ(error_of(kMinimal, {"data.attn_mask_type=document"}),
            "--set data.attn_mask_type=document: data.attn_mask_type: unknown value \"document\" "
            "(expected one of causal, block_causal)");
  EXPECT_EQ(
      error_of(kMinimal + "reset_position_ids = true\n"),
      "input.toml: data.reset_position_ids: true needs data.attn_mask_type = \"block_causal\" "
      "(positions restart at each document only with document masking)");
  EXPECT_EQ(error_of(kMinimal, {"data.reset_position_ids=true", "data.attn_mask_type=causal"}),
            "--set data.reset_position_ids=true: data.reset_position_ids: true needs "
            "data.attn_mask_type = \"block_causal\" (positions restart at each document only with "
            "document masking)");
  // Another objective: T5's seq2seq, a decoder's sft.
  const std::string t5 =
      error_of("[model]\ntype = \"t5\"\n" + kMinimal + "attn_mask_type = \"block_causal\"\n");
  EXPECT_THAT(t5,
              HasSubstr("input.toml: data.attn_mask_type: \"block_causal\" needs data.objective = "
                        "\"causal_lm\" (got \"seq2seq\""));
  EXPECT_THAT(
      error_of(llama, {"data.objective=sft", "data.attn_mask_type=block_causal"}),
      HasSubstr("data.attn_mask_type: \"block_causal\" needs data.objective = \"causal_lm\" "
                "(got \"sft\""));
  EXPECT_EQ(error_of(kMinimal, {"data.eos_token_id=-2"}),
            "--set data.eos_token_id=-2: data.eos_token_id: -2 is out of range (expected an "
            "integer >= -1)");
  const int64_t V = d.model.integer("vocab_size");
  EXPECT_EQ(error_of(kMinimal, {"data.eos_token_id=" + std::to_string(V)}),
            "data.eos_token_id: " + std::to_string(V) +
                " is out of range (expected -1 <= x < the model's vocabulary size " +
                std::to_string(V) + ")");
  EXPECT_NO_THROW(
      parse_config(kMinimal, "min.toml", {"data.eos_token_id=" + std::to_string(V - 1)}));
  // A Config built in code gets the same checks.
  Config code = d;
  code.data.reset_position_ids = true;
  try {
    check_config(code);
    ADD_FAILURE() << "check_config passed reset_position_ids without block_causal";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitInputError);
    EXPECT_THAT(std::string(e.what()), HasSubstr("data.reset_position_ids: true needs"));
  }
  // --resume may change all three; --list-keys' type column lists the enum's values.
  for (const char* key : {"data.attn_mask_type", "data.reset_position_ids", "data.eos_token_id"}) {
    EXPECT_TRUE(resume_may_change(key)) << key;
  }
  bool listed = false;
  for (const KeyDescription& k : describe_keys(model_schema(model_schemas(), "llama"))) {
    if (k.key == "data.attn_mask_type") {
      listed = true;
      EXPECT_EQ(k.type, "one of causal, block_causal");
      EXPECT_EQ(k.default_value, "\"causal\"");
      EXPECT_EQ(k.peer, "torchtitan attn_mask_type");
    }
    if (k.key == "data.eos_token_id") EXPECT_EQ(k.type, "integer >= -1");
  }
  EXPECT_TRUE(listed);
}

// ---- docs/config.md against the key table ------------------------------------------------

// "section.key" -> the value text of its line in `toml` (to_toml's output).
std::map<std::string, std::string> toml_keys(const std::string& toml) {
  std::istringstream lines(toml);
  std::map<std::string, std::string> keys;
  std::string line, section;
  while (std::getline(lines, line)) {
    if (line.empty() || line.front() == '#') continue;
    if (line.front() == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    const auto eq = line.find(" = ");
    if (eq != std::string::npos) keys[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return keys;
}

// The cells of a markdown table row ("| a | b \| c |" -> {"a", "b \| c"}), trimmed.
std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::string cur;
  for (std::size_t i = 1; i < row.size(); ++i) {
    if (row[i] == '|' && row[i - 1] != '\\') {
      const auto b = cur.find_first_not_of(' '), e = cur.find_last_not_of(' ');
      out.push_back(b == std::string::npos ? "" : cur.substr(b, e - b + 1));
      cur.clear();
    } else {
      cur += row[i];
    }
  }
  return out;
}

// docs/config.md documents exactly the keys of the key table, each under its section ([model]'s
// family keys under `type = "gpt2"`, `type = "t5"`, ... for every model.type), and each row says what the table says
// (describe_keys): the type column states the table's bounds where it has some, the "PyTorch /
// HF name" column is the table's peer name ("—" for none), the meaning starts with the table's
// one-line doc (its final period may be another punctuation mark in the docs), and each
// default it states is the default: setting a key to the documented default with --set leaves
// to_toml's output unchanged (GPT-2's defaults for the sections whose defaults depend on the
// model). "none" (data.path) stands for an unset string.
TEST(Config, DocsListEveryKeyWithItsDefault) {
  std::ifstream in(std::string(FSDP_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md missing";
  std::map<std::string, KeyDescription> table;  // "type|section.key" -> the key table's row
  // Every registered model type (a new one without its docs section fails here).
  std::vector<std::string> types;
  for (const fsdp::ModelSchema* m : model_schemas()) types.push_back(m->type());
  ASSERT_GE(types.size(), 7u);
  for (const std::string& t : types) {
    for (KeyDescription& d : describe_keys(model_schema(model_schemas(), t))) {
      table.emplace(t + "|" + d.key, std::move(d));
    }
  }
  std::map<std::string, std::string> documented;  // "type|section.key" -> default text
  std::string line, section, type = "gpt2";
  while (std::getline(in, line)) {
    if (line.rfind("## `[", 0) == 0) {
      section = line.substr(5, line.find(']') - 5);
      type = "gpt2";
    } else if (line.rfind("## ", 0) == 0) {
      section.clear();
    } else if (line.rfind("### `type = \"", 0) == 0) {
      type = line.substr(13, line.find('"', 13) - 13);
    } else if (!section.empty() && line.rfind("| `", 0) == 0) {
      const auto c = cells(line);
      ASSERT_EQ(c.size(), 5u) << line;
      const std::string key = section + "." + c[0].substr(1, c[0].size() - 2);
      if (const auto it = table.find((section == "model" ? type : std::string("gpt2")) + "|" + key);
          it != table.end()) {
        const KeyDescription& d = it->second;
        if (d.type.find_first_of("<>") != std::string::npos) {
          EXPECT_EQ(c[1], d.type) << key << ": the type column should state the key table's bounds";
        }
        EXPECT_EQ(c[3], d.peer.empty() ? "—" : d.peer) << key << ": the PyTorch / HF name column";
        ASSERT_FALSE(d.doc.empty()) << key << " has no one-line doc in the key table";
        const std::string stem = d.doc.substr(0, d.doc.size() - (d.doc.back() == '.'));
        EXPECT_EQ(c[4].substr(0, stem.size()), stem)
            << key << ": the meaning should start with the key table's one-line doc";
      }
      std::string def = c[2];
      if (def.size() >= 2 && def.front() == '`' && def.back() == '`') def = def.substr(1, def.size() - 2);
      EXPECT_TRUE(documented.emplace(type + "|" + key, def).second) << key << " documented twice";
    }
  }
  const std::vector<std::string> common = {"model.type", "model.init_from", "model.pad_vocab_multiple",
                                           "model.fused_linear_cross_entropy",
                                           "model.fused_linear_cross_entropy_chunk_rows"};
  int checked = 0;
  for (const std::string& t : types) {
    // model.type t, data.source synthetic (so no key is required).
    const std::string base = "[model]\ntype = \"" + t + "\"\n[data]\nsource = \"synthetic\"\n";
    const std::string defaults = to_toml(parse_config(base, "keys", {}));
    const auto keys = toml_keys(defaults);
    for (const auto& [key, value] : keys) {
      const bool family_key = key.rfind("model.", 0) == 0 &&
                              std::find(common.begin(), common.end(), key) == common.end();
      if (!family_key && t != "gpt2") continue;  // the sections outside [model]: once
      const auto it = documented.find((family_key ? t : std::string("gpt2")) + "|" + key);
      if (it == documented.end()) {
        ADD_FAILURE() << key << (family_key ? " (model.type = " + t + ")" : "")
                      << " is not in docs/config.md";
        continue;
      }
      if (it->second == "none") {
        EXPECT_EQ(value, "\"\"") << key << ": documented as none";
      } else if (key != "data.source") {  // set to synthetic above
        std::string got;
        try {
          got = to_toml(parse_config(base, "keys", {key + "=" + it->second}));
        } catch (const Error& e) {
          ADD_FAILURE() << key << ": documented default " << it->second << " is not a value: " << e.what();
          continue;
        }
        const std::string now = toml_keys(got)[key];
        EXPECT_EQ(now, value) << key << ": documented default " << it->second;
        if (now == value) EXPECT_TRUE(got == defaults) << key << "=" << it->second << " changed another key";
      }
      ++checked;
    }
    for (const auto& [tkey, def] : documented) {
      const std::string dt = tkey.substr(0, tkey.find('|')), key = tkey.substr(tkey.find('|') + 1);
      if (dt == t && !keys.count(key)) ADD_FAILURE() << "docs/config.md documents " << key << ", not a key";
    }
  }
  EXPECT_GT(checked, 60);
}

}  // namespace
}  // namespace fsdp
