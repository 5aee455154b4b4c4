// tests/test_config.cpp: the run configuration (fsdp/config/config.hpp): defaults, the
// example inputs/*.toml, --set overrides of every value type, the one-line exit-code-2
// errors for each kind of bad input, and to_toml round trips.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fsdp/config/config.hpp"
#include "fsdp/core/error.hpp"

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
  expected.data.path = "tokens.h5";
  expected.source_path = "min.toml";
  EXPECT_EQ(c, expected);
  EXPECT_EQ(c.model.type, "gpt2");
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.n_embd, 128);
  EXPECT_EQ(c.data.seq_len, 128);
  EXPECT_EQ(c.train.global_batch_size, 32);
  EXPECT_EQ(c.train.seed, 1234u);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.fsdp.sharding_strategy, ShardingStrategy::FULL_SHARD);
  EXPECT_EQ(c.fsdp.transformer_layer_cls_to_wrap, std::vector<std::string>{"GPT2Block"});
  EXPECT_TRUE(c.fsdp.limit_all_gathers);
}

TEST(Config, FortunesInput) {
  const Config c = load_config(kInputs + "gpt2_fortunes.toml", {});
  EXPECT_EQ(c.source_path, kInputs + "gpt2_fortunes.toml");
  // Structure of the main job; its step counts are tuning and free to change.
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.n_embd, 128);
  EXPECT_EQ(c.model.n_positions, 256);
  EXPECT_EQ(c.model.vocab_size, 256);
  EXPECT_EQ(c.data.source, "hdf5");
  EXPECT_EQ(c.data.path, "data/fortunes.h5");
  EXPECT_EQ(c.data.seq_len, 128);
  EXPECT_EQ(c.train.global_batch_size, 32);
  EXPECT_EQ(c.train.run_dir, "runs/fortunes");
  EXPECT_EQ(c.optim.name, "adamw");
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-3);
  EXPECT_DOUBLE_EQ(c.optim.min_lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.optim.grad_clip, 1.0);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.99);
  EXPECT_EQ(c.fsdp.sharding_strategy, ShardingStrategy::FULL_SHARD);
  EXPECT_EQ(c.fsdp.auto_wrap_policy, "TRANSFORMER_BASED_WRAP");
  EXPECT_EQ(c.fsdp.transformer_layer_cls_to_wrap, std::vector<std::string>{"GPT2Block"});
  EXPECT_EQ(c.eval.max_windows, 0);
}

TEST(Config, TinyInput) {
  const Config c = load_config(kInputs + "tiny.toml", {});
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.n_head, 2);
  EXPECT_EQ(c.model.n_embd, 16);
  EXPECT_EQ(c.model.n_positions, 32);
  EXPECT_EQ(c.data.source, "synthetic");
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
  EXPECT_EQ(c.model.n_layer, 7);
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

TEST(Config, OverrideBeatsFileAndLastOverrideWins) {
  const Config c = load_config(kInputs + "gpt2_fortunes.toml",
                               {"train.max_steps=10", "optim.min_lr=0", "train.max_steps=20",
                                "train.run_dir=123", "fsdp.transformer_layer_cls_to_wrap="
                                                     "GPT2Block"});
  EXPECT_EQ(c.train.max_steps, 20);
  EXPECT_DOUBLE_EQ(c.optim.min_lr, 0.0);
  EXPECT_EQ(c.train.run_dir, "123");  // a string key takes the text as written
  EXPECT_EQ(c.fsdp.transformer_layer_cls_to_wrap, std::vector<std::string>{"GPT2Block"});
  EXPECT_EQ(c.model.n_layer, 4);  // untouched keys keep the file's values
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

TEST(Config, EachErrorIsOneLineNamingTheKey) {
  const std::vector<BadCase> cases = {
      // unknown keys and sections, with suggestions
      {"[fsdp]\nshardin_strategy = \"FULL_SHARD\"\n", {},
       {"input.toml: unknown key 'fsdp.shardin_strategy'",
        "(did you mean 'fsdp.sharding_strategy'?)"}},
      {"[fdsp]\nsharding_strategy = \"NO_SHARD\"\n", {},
       {"unknown key 'fdsp.sharding_strategy'", "did you mean 'fsdp.sharding_strategy'"}},
      {"seed = 3\n", {}, {"unknown key 'seed'", "did you mean 'train.seed'"}},
      {"[model.extra]\nx = 1\n", {}, {"unknown key 'model.extra'"}},
      {"[nonsense]\n", {}, {"unknown key 'nonsense'"}},
      {"optim = 3\n", {}, {"input.toml: optim: expected a table"}},
      // wrong types
      {"[model]\nn_layer = \"four\"\n", {},
       {"input.toml: model.n_layer: expected an integer, got string"}},
      {"[model]\nn_layer = 4.0\n", {}, {"model.n_layer: expected an integer, got float"}},
      {"[optim]\nlr = \"fast\"\n", {}, {"optim.lr: expected a number, got string"}},
      {"[optim]\nlr = nan\n", {}, {"optim.lr: expected a finite number"}},
      {"[fsdp]\nlimit_all_gathers = 1\n", {}, {"fsdp.limit_all_gathers: expected a boolean"}},
      {"[data]\nsource = 5\n", {}, {"data.source: expected a string, got integer"}},
      {"[fsdp]\ntransformer_layer_cls_to_wrap = [1]\n", {},
       {"fsdp.transformer_layer_cls_to_wrap: expected an array of strings"}},
      {"[train]\nseed = -1\n", {}, {"train.seed: -1 is negative"}},
      // model
      {"[model]\ntype = \"t5\"\n", {}, {"model.type: unknown value \"t5\"", "gpt2"}},
      {"[model]\nn_layer = 0\n", {}, {"model.n_layer: 0 is out of range (expected an integer >= 1)"}},
      {"[model]\nn_head = 0\n", {}, {"model.n_head: 0"}},
      {"[model]\nn_embd = -1\n", {}, {"model.n_embd: -1"}},
      {"[model]\nn_positions = 0\n", {}, {"model.n_positions: 0"}},
      {"[model]\nvocab_size = 0\n", {}, {"model.vocab_size: 0"}},
      {"[model]\nn_embd = 100\nn_head = 3\n", {},
       {"input.toml: model.n_embd: 100 is not divisible by model.n_head = 3"}},
      {"[model]\nlayer_norm_epsilon = 0\n", {}, {"model.layer_norm_epsilon"}},
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
      {"[optim]\nlr = 0\n", {}, {"optim.lr: 0 is out of range (expected > 0)"}},
      {"[optim]\nmin_lr = 0.01\n", {}, {"optim.min_lr: 0.01", "min_lr <= optim.lr"}},
      {"[optim]\nmin_lr = -1\n", {}, {"optim.min_lr: -1"}},
      {"[optim]\nwarmup_steps = -1\n", {}, {"optim.warmup_steps: -1"}},
      {"[optim]\ndecay_steps = 10\n", {}, {"optim.decay_steps: 10 is less than optim.warmup_steps"}},
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
      {"[fsdp]\nbackward_prefetch = \"PRE\"\n", {},
       {"fsdp.backward_prefetch: unknown value \"PRE\"", "BACKWARD_POST"}},
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
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text + (c.overrides.empty() ? "" : " --set " + c.overrides[0]));
    std::vector<std::string> overrides = {"data.path=tokens.h5"};
    overrides.insert(overrides.end(), c.overrides.begin(), c.overrides.end());
    const std::string msg = error_of(c.text, overrides);
    for (const auto& want : c.expect) EXPECT_THAT(msg, HasSubstr(want));
  }
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
  EXPECT_EQ(c.model.n_layer, 3);
  std::filesystem::remove(path);
}

TEST(Config, ToTomlRoundTrips) {
  // Every key away from its default, including awkward strings and floats.
  const Config c = parse_config(
      "", "custom.toml",
      {"model.n_layer=3", "model.n_head=8", "model.n_embd=64", "model.n_positions=512",
       "model.vocab_size=50257", "model.layer_norm_epsilon=1e-6", "data.source=synthetic",
       "data.path=\"a \\\"quoted\\\" path\\\\x.h5\"", "data.seq_len=511",
       "train.global_batch_size=12", "train.max_steps=77", "train.seed=4242",
       "train.run_dir=runs/r", "train.log_every=3", "train.num_threads=2", "optim.name=sgd",
       "optim.lr=0.1", "optim.min_lr=0.1", "optim.warmup_steps=0", "optim.decay_steps=70",
       "optim.weight_decay=0", "optim.grad_clip=0.3333333333333333", "optim.beta1=0.8",
       "optim.beta2=0.95", "optim.eps=1e-12", "optim.momentum=0",
       "fsdp.sharding_strategy=HYBRID_SHARD_ZERO2", "fsdp.auto_wrap_policy=NO_WRAP",
       "fsdp.transformer_layer_cls_to_wrap=[]", "fsdp.backward_prefetch=NONE",
       "fsdp.limit_all_gathers=false", "mesh.shard_size=4", "checkpoint.every=9",
       "eval.every=0", "eval.max_windows=17"});
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
    EXPECT_NE(c.mesh, defaults.mesh);
    EXPECT_NE(c.checkpoint, defaults.checkpoint);
    EXPECT_NE(c.eval, defaults.eval);
  }
  const std::string text = to_toml(c);
  const Config back = parse_config(text, "custom.toml", {});
  EXPECT_EQ(back, c) << text;
  EXPECT_EQ(to_toml(back), text);

  // The fortunes input round-trips too, and the sections come in the documented order.
  const Config f = load_config(kInputs + "gpt2_fortunes.toml", {});
  const std::string ftext = to_toml(f);
  EXPECT_EQ(parse_config(ftext, f.source_path, {}), f) << ftext;
  std::size_t last = 0;
  for (const char* sec : {"[model]", "[data]", "[train]", "[optim]", "[fsdp]", "[mesh]",
                          "[checkpoint]", "[eval]"}) {
    const std::size_t at = ftext.find(sec);
    ASSERT_NE(at, std::string::npos) << sec;
    EXPECT_GE(at, last) << sec;
    last = at;
  }
  EXPECT_THAT(ftext, HasSubstr("sharding_strategy = \"FULL_SHARD\"\n"));
  EXPECT_THAT(ftext, HasSubstr("transformer_layer_cls_to_wrap = [\"GPT2Block\"]\n"));
  EXPECT_THAT(ftext, HasSubstr("grad_clip = 1.0\n"));
  EXPECT_THAT(ftext, HasSubstr("lr = 0.003\n"));
}

}  // namespace
}  // namespace fsdp
