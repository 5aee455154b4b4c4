// Tests of the checkpoint layer: shard files round-trip bit-exactly, incompatibilities are
// reported as input errors naming the file, the step-directory protocol (latest, commit),
// the safetensors writer/reader, and the merge of a tiny hand-built GPT-2 checkpoint into
// Hugging Face names and layouts. Layouts are built by hand here (FlatParamLayout::build
// lives in the fsdp layer, which this layer does not link).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <csignal>

#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/async_writer.hpp"
#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/checkpoint/merge.hpp"
#include "fsdp/checkpoint/resume.hpp"
#include "fsdp/model/model.hpp"
#include "fsdp/checkpoint/safetensors.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/core/atomic_file.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/h5/hdf5.hpp"
#include "child_process.hpp"

namespace fs = std::filesystem;
using namespace fsdp;
using namespace fsdp::ckpt;
using nlohmann::json;

namespace {

// A fresh, empty scratch directory per test.
class CheckpointTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("fsdp_test_checkpoint_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// Packs params in order and pads to a multiple of num_shards (what FlatParamLayout::build does).
FlatParamLayout make_layout(const std::string& unit, std::vector<ParamSpec> params, int64_t num_shards) {
  FlatParamLayout l;
  l.unit_name = unit;
  for (auto& p : params) {
    FlatEntry e;
    e.offset = l.numel;
    l.numel += p.numel();
    e.spec = std::move(p);
    l.entries.push_back(std::move(e));
  }
  l.num_shards = num_shards;
  l.padded_numel = (l.numel + num_shards - 1) / num_shards * num_shards;
  l.shard_numel = l.padded_numel / num_shards;
  return l;
}

ParamSpec spec(const std::string& name, std::vector<int64_t> shape, bool decay = true) {
  ParamSpec p;
  p.name = name;
  p.shape = std::move(shape);
  p.weight_decay = decay;
  return p;
}

// Distinct, non-trivial values: element i of buffer `tag`.
std::vector<float> values(int64_t n, float tag) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = tag + 0.001f * static_cast<float>(i) + 1e-7f * static_cast<float>(i * i);
  return v;
}

CheckpointMeta make_meta(int shard_size, int shard_index) {
  CheckpointMeta m;
  m.step = 1234;
  m.world_size = shard_size;
  m.shard_size = shard_size;
  m.replicate_size = 1;
  m.shard_index = shard_index;
  m.sharding_strategy = "FULL_SHARD";
  m.optimizer = "adamw";
  m.model_config_json = R"({"model_type":"gpt2","n_layer":1})";
  m.train_config_toml = "[train]\nseed = 42\n";
  m.seed = 0xFEDCBA9876543210ull;  // does not fit int64: must survive the bit cast
  m.sampler_epoch = 3;
  m.sampler_position = 777;
  m.run_id = "0123456789abcdef0123456789abcdef";
  m.launch_id = "fedcba9876543210fedcba9876543210";
  return m;
}

// Shard `s` of one unit whose full padded flat buffers (per dataset) are `bufs`.
UnitShardView shard_view(const FlatParamLayout& layout, int s,
                         const std::map<std::string, std::vector<float>>& bufs) {
  UnitShardView v;
  v.layout = &layout;
  const int64_t off = layout.shard_begin(s);
  for (const auto& [name, buf] : bufs) {
    if (name == "param") v.param = buf.data() + off;
    else v.state.emplace_back(name, buf.data() + off);
  }
  return v;
}

// Writes the shard files of `layouts` whose full padded flat buffers are `full` (per unit,
// per dataset) into `dir`, shard_size files.
void write_checkpoint(const std::string& dir, const CheckpointMeta& base,
                      const std::vector<FlatParamLayout>& layouts,
                      const std::vector<std::map<std::string, std::vector<float>>>& full) {
  fs::create_directories(dir);
  for (int s = 0; s < base.shard_size; ++s) {
    CheckpointMeta m = base;
    m.shard_index = s;
    std::vector<UnitShardView> views;
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      views.push_back(shard_view(layouts[u], s, full[u]));
    }
    write_shard_file((fs::path(dir) / shard_file_name(s, base.shard_size)).string(), m, views);
  }
}

// Runs `f`, expecting fsdp::Error with exit code 2 whose message contains every `needle`.
template <class F>
void expect_input_error(F&& f, std::vector<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "expected fsdp::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitInputError) << e.what();
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << "\n  lacks: " << n;
  }
}

// Two units with padding: unit 0 numel 4*3+5 = 17, unit 1 numel 7, shard_size 2.
std::vector<FlatParamLayout> two_units(int64_t shards) {
  return {make_layout("root", {spec("wte.weight", {4, 3}, false), spec("ln_f.bias", {5}, false)}, shards),
          make_layout("h.0", {spec("h.0.mlp.c_fc.bias", {7})}, shards)};
}

std::vector<std::map<std::string, std::vector<float>>> full_buffers(const std::vector<FlatParamLayout>& ls) {
  std::vector<std::map<std::string, std::vector<float>>> full;
  float tag = 1.0f;
  for (const auto& l : ls) {
    std::map<std::string, std::vector<float>> m;
    for (const char* d : {"param", "exp_avg", "exp_avg_sq"}) {
      m[d] = values(l.padded_numel, tag);
      tag += 10.0f;
    }
    full.push_back(std::move(m));
  }
  return full;
}

}  // namespace

TEST_F(CheckpointTest, ShardFilesRoundTripBitExactly) {
  const auto layouts = two_units(2);
  ASSERT_EQ(layouts[0].padded_numel, 18);  // 17 + 1 padding
  ASSERT_EQ(layouts[1].padded_numel, 8);   // 7 + 1 padding
  const auto full = full_buffers(layouts);
  const std::string dir = path("step");
  write_checkpoint(dir, make_meta(2, 0), layouts, full);

  // Atomic writes leave no temporary files behind.
  std::vector<std::string> names;
  for (const auto& de : fs::directory_iterator(dir)) names.push_back(de.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"shard_00000-of-00002.h5", "shard_00001-of-00002.h5"}));

  for (int s = 0; s < 2; ++s) {
    const ShardFile f = ShardFile::open((fs::path(dir) / shard_file_name(s, 2)).string());
    const CheckpointMeta& m = f.meta();
    EXPECT_EQ(m.step, 1234);
    EXPECT_EQ(m.world_size, 2);
    EXPECT_EQ(m.shard_size, 2);
    EXPECT_EQ(m.replicate_size, 1);
    EXPECT_EQ(m.shard_index, s);
    EXPECT_EQ(m.sharding_strategy, "FULL_SHARD");
    EXPECT_EQ(m.optimizer, "adamw");
    EXPECT_EQ(m.model_config_json, R"({"model_type":"gpt2","n_layer":1})");
    EXPECT_EQ(m.train_config_toml, "[train]\nseed = 42\n");
    EXPECT_EQ(m.seed, 0xFEDCBA9876543210ull);
    EXPECT_EQ(m.sampler_epoch, 3);
    EXPECT_EQ(m.sampler_position, 777);
    ASSERT_EQ(f.num_units(), 2);
    for (int u = 0; u < 2; ++u) {
      const FlatParamLayout& a = f.layouts()[u];
      const FlatParamLayout& b = layouts[u];
      EXPECT_EQ(a.unit_name, b.unit_name);
      EXPECT_EQ(a.numel, b.numel);
      EXPECT_EQ(a.padded_numel, b.padded_numel);
      EXPECT_EQ(a.num_shards, b.num_shards);
      EXPECT_EQ(a.shard_numel, b.shard_numel);
      ASSERT_EQ(a.entries.size(), b.entries.size());
      for (std::size_t i = 0; i < a.entries.size(); ++i) {
        EXPECT_EQ(a.entries[i].spec.name, b.entries[i].spec.name);
        EXPECT_EQ(a.entries[i].spec.shape, b.entries[i].spec.shape);
        EXPECT_EQ(a.entries[i].spec.weight_decay, b.entries[i].spec.weight_decay);
        EXPECT_EQ(a.entries[i].offset, b.entries[i].offset);
      }
      EXPECT_EQ(f.state_names(u), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
      for (const char* d : {"param", "exp_avg", "exp_avg_sq"}) {
        std::vector<float> got(b.shard_numel, -1.0f);
        f.read_unit(u, d, got.data());
        EXPECT_EQ(0, std::memcmp(got.data(), full[u].at(d).data() + b.shard_begin(s), got.size() * sizeof(float)))
            << "unit " << u << " " << d << " shard " << s;
      }
    }
    EXPECT_FALSE(f.has_dataset(0, "momentum_buffer"));
    expect_input_error([&] { std::vector<float> x(9); f.read_unit(0, "momentum_buffer", x.data()); },
                       {shard_file_name(s, 2), "momentum_buffer"});
    // The file is compatible with the run that wrote it.
    CheckpointMeta run = make_meta(2, s);
    EXPECT_NO_THROW(f.check_compatible(run, layouts));
  }

  // Flat reads across the shard boundary gather from both files.
  const CheckpointSet set = CheckpointSet::open(dir);
  EXPECT_EQ(set.shard_size(), 2);
  std::vector<float> got(12);
  set.read_flat(0, "exp_avg", 4, 12, got.data());  // [4, 16) spans shard 0 [0,9) and 1 [9,18)
  EXPECT_EQ(0, std::memcmp(got.data(), full[0].at("exp_avg").data() + 4, 12 * sizeof(float)));
}

// The background writer writes from its staging buffers, which may be changed only after
// wait(); buffers are reused between saves; a failed write rethrows from wait() and leaves
// no file; nothing in flight makes wait() a no-op.
TEST_F(CheckpointTest, AsyncShardWriterWritesStagedCopiesAndReportsFailures) {
  const auto layouts = two_units(1);
  const auto full = full_buffers(layouts);
  AsyncShardWriter w;
  EXPECT_TRUE(w.finished());
  EXPECT_FALSE(w.busy());
  EXPECT_NO_THROW(w.wait());
  auto stage = [&](float bias) {
    std::vector<UnitShardView> views;
    std::size_t i = 0;
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      UnitShardView v{&layouts[u], nullptr, {}};
      for (const char* d : {"param", "exp_avg", "exp_avg_sq"}) {
        const auto& src = full[u].at(d);
        float* dst = w.buffer(i++, static_cast<int64_t>(src.size()));
        for (std::size_t k = 0; k < src.size(); ++k) dst[k] = src[k] + bias;
        if (std::string(d) == "param") v.param = dst;
        else v.state.push_back({d, dst});
      }
      views.push_back(std::move(v));
    }
    return views;
  };
  for (int save = 0; save < 2; ++save) {
    const float bias = static_cast<float>(save);
    const std::string file = path("async_" + std::to_string(save) + ".h5");
    w.start(file, make_meta(1, 0), stage(bias));
    EXPECT_TRUE(w.busy());
    EXPECT_THROW(w.buffer(0, 1), Error);  // the thread may be reading the buffers
    EXPECT_THROW(w.start(file, make_meta(1, 0), {}), Error);
    // Poll (bounded) until the thread says it is done; wait() then does not block.
    for (int i = 0; i < 200000 && !w.finished(); ++i) std::this_thread::yield();
    w.wait();
    EXPECT_FALSE(w.busy());
    EXPECT_GT(w.last_write_ms(), 0.0);
    const ShardFile f = ShardFile::open(file);
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      for (const char* d : {"param", "exp_avg", "exp_avg_sq"}) {
        std::vector<float> got(static_cast<std::size_t>(layouts[u].shard_numel));
        f.read_unit(static_cast<int>(u), d, got.data());
        for (std::size_t k = 0; k < got.size(); ++k) {
          ASSERT_EQ(got[k], full[u].at(d)[k] + bias) << "save " << save << " unit " << u << " " << d;
        }
      }
    }
  }
  // A write into a missing directory fails in the thread; wait() rethrows it once, naming
  // the file, and nothing is left.
  const std::string bad = path("missing_dir/shard.h5");
  w.start(bad, make_meta(1, 0), stage(0.0f));
  try {
    w.wait();
    ADD_FAILURE() << "wait() did not rethrow the write's failure";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(w.wait());
  EXPECT_FALSE(fs::exists(bad));
  EXPECT_FALSE(fs::exists(bad + ".tmp"));
  // Destroying a writer with a write in flight joins it (no crash, the file is complete).
  {
    AsyncShardWriter w2;
    std::vector<UnitShardView> views;
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      UnitShardView v{&layouts[u], full[u].at("param").data(), {}};
      for (const char* d : {"exp_avg", "exp_avg_sq"}) v.state.push_back({d, full[u].at(d).data()});
      views.push_back(std::move(v));
    }
    w2.start(path("joined.h5"), make_meta(1, 0), std::move(views));
  }
  EXPECT_NO_THROW(ShardFile::open(path("joined.h5")).verify_all());
}

TEST_F(CheckpointTest, IncompatibleRunIsAnInputErrorNamingTheFile) {
  const auto layouts = two_units(2);
  const std::string dir = path("step");
  write_checkpoint(dir, make_meta(2, 0), layouts, full_buffers(layouts));
  const std::string file = (fs::path(dir) / shard_file_name(0, 2)).string();
  const ShardFile f = ShardFile::open(file);

  CheckpointMeta run = make_meta(4, 0);
  run.world_size = 2;
  expect_input_error([&] { f.check_compatible(run, two_units(4)); },
                     {file, "incompatible checkpoint", "shard_size", "checkpoint has 2, run has 4"});

  run = make_meta(2, 0);
  run.optimizer = "sgd";
  expect_input_error([&] { f.check_compatible(run, layouts); }, {file, "optimizer", "checkpoint has adamw, run has sgd"});

  auto other = layouts;  // a different model: wte has 5 rows
  other[0] = make_layout("root", {spec("wte.weight", {5, 3}), spec("ln_f.bias", {5})}, 2);
  expect_input_error([&] { f.check_compatible(make_meta(2, 0), other); }, {file, "incompatible checkpoint", "numel", "17", "20"});

  other = layouts;  // same sizes, a parameter renamed
  other[1].entries[0].spec.name = "h.0.mlp.c_proj.bias";
  expect_input_error([&] { f.check_compatible(make_meta(2, 0), other); },
                     {file, "name", "checkpoint has h.0.mlp.c_fc.bias, run has h.0.mlp.c_proj.bias"});

  other = layouts;  // same numel, different shape
  other[0].entries[0].spec.shape = {3, 4};
  expect_input_error([&] { f.check_compatible(make_meta(2, 0), other); }, {file, "wte.weight shape", "[4,3]", "[3,4]"});

  expect_input_error([&] { f.check_compatible(make_meta(2, 0), {layouts[0]}); }, {file, "number of FSDP units"});

  // Resuming with another shard count: the file the run looks for does not exist, and the
  // message says why.
  CheckpointMeta four = make_meta(4, 3);
  expect_input_error([&] { open_for_resume(dir, four, two_units(4)); },
                     {dir, "incompatible checkpoint", "shard_size", "checkpoint has 2, run has 4"});
  const ShardFile ok = open_for_resume(dir, make_meta(2, 1), layouts);
  EXPECT_EQ(ok.meta().shard_index, 1);
  expect_input_error([&] { open_for_resume(dir, run, layouts); }, {"optimizer"});
}

TEST_F(CheckpointTest, MissingOrForeignShardFilesAreInputErrors) {
  const auto layouts = two_units(2);
  const std::string dir = path("step");
  write_checkpoint(dir, make_meta(2, 0), layouts, full_buffers(layouts));
  const std::string missing = (fs::path(dir) / shard_file_name(1, 2)).string();
  fs::remove(missing);
  expect_input_error([&] { CheckpointSet::open(dir); }, {missing, "missing shard file"});
  expect_input_error([&] { merge_to_hf(dir, path("out")); }, {missing});
  EXPECT_FALSE(fs::exists(path("out/model.safetensors")));

  expect_input_error([&] { CheckpointSet::open(path("nope")); }, {path("nope")});
  fs::create_directories(path("empty"));
  expect_input_error([&] { CheckpointSet::open(path("empty")); }, {path("empty"), "no shard files"});

  // An HDF5 file that is not a checkpoint.
  const std::string foreign = path("foreign.h5");
  {
    auto f = h5::File::create(foreign);
    f.set_attr("/", "format", std::string("something.else"));
    f.close();
  }
  expect_input_error([&] { ShardFile::open(foreign); }, {foreign, "not an fsdp_train checkpoint"});

  // Shard files from different steps do not form a checkpoint.
  const std::string mixed = path("mixed");
  write_checkpoint(mixed, make_meta(2, 0), layouts, full_buffers(layouts));
  CheckpointMeta later = make_meta(2, 1);
  later.step = 99;
  auto full = full_buffers(layouts);
  write_shard_file((fs::path(mixed) / shard_file_name(1, 2)).string(), later,
                   {{&layouts[0], full[0].at("param").data() + 9, {}}, {&layouts[1], full[1].at("param").data() + 4, {}}});
  expect_input_error([&] { CheckpointSet::open(mixed); },
                     {shard_file_name(1, 2), "step 99", "differs from", shard_file_name(0, 2), "step 1234"});

  // Same step, but shards of two different runs (another config fingerprint).
  const std::string runs = path("two_runs");
  CheckpointMeta a = make_meta(2, 0);
  a.config_fingerprint = config_fingerprint("[train]\nseed = 1\n");
  write_checkpoint(runs, a, layouts, full);
  CheckpointMeta b = make_meta(2, 1);
  b.config_fingerprint = config_fingerprint("[train]\nseed = 2\n");
  ASSERT_NE(a.config_fingerprint, b.config_fingerprint);
  write_shard_file((fs::path(runs) / shard_file_name(1, 2)).string(), b,
                   {{&layouts[0], full[0].at("param").data() + 9, {}}, {&layouts[1], full[1].at("param").data() + 4, {}}});
  expect_input_error([&] { CheckpointSet::open(runs); },
                     {shard_file_name(1, 2) + ": config_fingerprint " + b.config_fingerprint + " differs from",
                      shard_file_name(0, 2), "different runs"});
}

TEST_F(CheckpointTest, WriteRejectsMismatchedLayoutAndLeavesNoFile) {
  const auto layouts = two_units(4);  // built for 4 shards
  std::vector<float> buf(64, 0.0f);
  CheckpointMeta m = make_meta(2, 0);
  EXPECT_THROW(write_shard_file(path("x.h5"), m, {{&layouts[0], buf.data(), {}}}), Error);
  EXPECT_FALSE(fs::exists(path("x.h5")));
  EXPECT_FALSE(fs::exists(path("x.h5.tmp")));
  // An unwritable destination: the temp file cannot be created, nothing is left.
  m = make_meta(4, 0);
  EXPECT_THROW(write_shard_file(path("no/such/dir/x.h5"), m, {{&layouts[0], buf.data(), {}}}), Error);
}

// fsdp::AtomicFile: the final name is either the old content or the complete new one, no
// temporary survives a failure, and errors name the final path once with the system reason.
TEST_F(CheckpointTest, AtomicFileCommitsOrLeavesNothing) {
  const std::string f = path("f.txt");
  write_file_atomically(f, "one\n");
  auto read = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(read(f), "one\n");
  write_file_atomically(f, "two\n");
  EXPECT_EQ(read(f), "two\n");
  EXPECT_FALSE(fs::exists(f + ".tmp"));

  // A writer that fails half-way: the old content stays, the temporary is removed, the
  // message names f (the "<tmp>: " prefix of the writer's message is replaced), exit code kept.
  try {
    AtomicFile a(f);
    a.write([&](const std::string& tmp) {
      std::ofstream(tmp) << "half";
      throw InputError(tmp + ": disk on fire");
    });
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), f + ": disk on fire");
    EXPECT_EQ(e.exit_code(), kExitInputError);
  }
  EXPECT_EQ(read(f), "two\n");
  EXPECT_FALSE(fs::exists(f + ".tmp"));

  // Destroyed without commit: nothing published, no temporary; a stale temporary from an
  // earlier crash is removed on construction.
  std::ofstream(f + ".tmp") << "stale";
  {
    AtomicFile a(f);
    EXPECT_FALSE(fs::exists(a.tmp_path()));
    std::ofstream(a.tmp_path()) << "unfinished";
  }
  EXPECT_FALSE(fs::exists(f + ".tmp"));
  EXPECT_EQ(read(f), "two\n");

  // Unwritable destination: Error naming the final path and strerror.
  try {
    write_file_atomically(path("no/such/dir/g.txt"), "x");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path("no/such/dir/g.txt") + ": cannot create"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
  // commit() of a temporary that was never written names the final path.
  AtomicFile missing(path("m.txt"));
  try {
    missing.commit();
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path("m.txt") + ": ", 0), 0u) << e.what();
  }
  EXPECT_FALSE(fs::exists(path("m.txt")));
}

TEST_F(CheckpointTest, DirectoryNamesCommitAndLatest) {
  EXPECT_EQ(step_dir_name(100), "step_00000100");
  EXPECT_EQ(shard_file_name(3, 16), "shard_00003-of-00016.h5");
  const std::string run = path("run");
  EXPECT_EQ(step_dir(run, 7), (fs::path(run) / "checkpoints" / "step_00000007").string());
  EXPECT_EQ(tmp_step_dir(run, 7), step_dir(run, 7) + ".tmp");

  EXPECT_EQ(find_latest(run), std::nullopt);  // no checkpoints yet

  // Save step 5: write into the tmp dir, commit, publish.
  prepare_tmp_step_dir(tmp_step_dir(run, 5));
  std::ofstream(tmp_step_dir(run, 5) + "/a") << "first";
  commit_step_dir(tmp_step_dir(run, 5), step_dir(run, 5));
  publish_latest(run, 5);
  EXPECT_FALSE(fs::exists(tmp_step_dir(run, 5)));
  EXPECT_EQ(find_latest(run), step_dir(run, 5));
  std::ifstream latest(fs::path(run) / "checkpoints" / "latest");
  std::string content;
  std::getline(latest, content);
  EXPECT_EQ(content, "step_00000005");
  EXPECT_FALSE(fs::exists(fs::path(run) / "checkpoints" / "latest.tmp"));

  // Saving step 5 again replaces the directory; a stale tmp dir is cleared first.
  fs::create_directories(tmp_step_dir(run, 5) + "/stale");
  prepare_tmp_step_dir(tmp_step_dir(run, 5));
  EXPECT_TRUE(fs::is_empty(tmp_step_dir(run, 5)));
  std::ofstream(tmp_step_dir(run, 5) + "/b") << "second";
  commit_step_dir(tmp_step_dir(run, 5), step_dir(run, 5));
  EXPECT_TRUE(fs::exists(step_dir(run, 5) + "/b"));
  EXPECT_FALSE(fs::exists(step_dir(run, 5) + "/a"));
  EXPECT_FALSE(fs::exists(step_dir(run, 5) + ".old"));

  // latest naming a directory that is gone is an input error naming the file.
  publish_latest(run, 9);
  expect_input_error([&] { find_latest(run); }, {"latest", "step_00000009", "does not exist"});
}

// The trainer's same-config check names the first differing key (sorted), values as TOML.
TEST(ConfigDifference, FirstDifferingKeyWithBothValues) {
  const std::string a = "[optim]\nlr = 0.001\nname = \"adamw\"\n[train]\nseed = 1\n";
  EXPECT_EQ(first_config_difference(a, a, "a", "b"), std::nullopt);
  // The same values in another text are equal.
  const std::string reordered = "[train]\nseed = 1\n[optim]\nname = 'adamw'\nlr = 1e-3\n";
  EXPECT_EQ(first_config_difference(a, reordered, "a", "b"), std::nullopt);
  const std::string b = "[optim]\nlr = 0.002\nname = \"sgd\"\n[train]\nseed = 1\n";
  const auto d = first_config_difference(a, b, "a", "b");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->key, "optim.lr");
  EXPECT_EQ(d->a_value, "0.001");
  EXPECT_EQ(d->b_value, "0.002");
  const std::string no_train = "[optim]\nlr = 0.001\nname = \"adamw\"\n";
  const auto absent = first_config_difference(a, no_train, "a", "b");
  ASSERT_TRUE(absent);
  EXPECT_EQ(absent->key, "train.seed");
  EXPECT_EQ(absent->b_value, "(absent)");
  expect_input_error([&] { first_config_difference(a, "[optim", "a", "rank 1's config"); },
                     {"rank 1's config", "not valid TOML"});
}

// remove_temporaries_on_signal (fsdp_merge, fsdp_prepare): SIGTERM during a write removes
// the temporaries of the live AtomicFiles (not a committed one's final file) and the process
// still ends by the signal; a signal the process inherited as ignored stays ignored.
TEST_F(CheckpointTest, ASignalRemovesTheLiveTemporaries) {
  const std::string f = path("model.safetensors"), g = path("config.json");
  write_file_atomically(f, "old");
  for (const int sig : {SIGTERM, SIGINT, SIGHUP}) {
    const int status = test_util::in_child([&] {
      remove_temporaries_on_signal();
      AtomicFile done(g);
      done.write([](const std::string& tmp) { std::ofstream(tmp) << "{}"; });
      AtomicFile live(f);
      std::ofstream(live.tmp_path()) << "half";
      ::raise(sig);
      _exit(3);  // not reached
    });
    ASSERT_TRUE(WIFSIGNALED(status)) << "signal " << sig << ": status " << status;
    EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_FALSE(fs::exists(f + ".tmp")) << "signal " << sig;
    std::ifstream in(f);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "old");
    EXPECT_TRUE(fs::exists(g));
    fs::remove(g);
  }
  // SIGTERM ignored before: still ignored, the writer goes on to its normal end.
  const int status = test_util::in_child([&] {
    ::signal(SIGTERM, SIG_IGN);
    remove_temporaries_on_signal();
    AtomicFile live(f);
    std::ofstream(live.tmp_path()) << "half";
    ::raise(SIGTERM);
    _exit(4);
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 4);
}

// fsdp_merge's STEP_DIR: a step directory as given; a run directory, its checkpoints directory
// or the `latest` file itself follow `latest`; anything else is passed on for open() to judge.
TEST_F(CheckpointTest, ResolveStepDirFollowsLatest) {
  const std::string run = path("run");
  const std::string ck = checkpoints_dir(run);
  for (int64_t step : {3, 5}) {
    fs::create_directories(step_dir(run, step));
    std::ofstream(step_dir(run, step) + "/" + shard_file_name(0, 1)) << "h5";
  }
  // No `latest` yet: every form is returned as given.
  for (const std::string& p : {run, ck, step_dir(run, 3), path("nowhere")}) {
    const StepDirChoice c = resolve_step_dir(p);
    EXPECT_EQ(c.step_dir, p);
    EXPECT_EQ(c.latest, "");
  }
  publish_latest(run, 3);
  const std::string latest = (fs::path(ck) / "latest").string();
  for (const std::string& p : {run, ck, latest, run + "/", ck + "/"}) {
    const StepDirChoice c = resolve_step_dir(p);
    const fs::path want = fs::path(step_dir(run, 3)).lexically_normal();
    EXPECT_EQ(fs::path(c.step_dir).lexically_normal(), want) << p;
    EXPECT_EQ(fs::path(c.latest).lexically_normal(), fs::path(latest).lexically_normal()) << p;
  }
  // A step directory is itself, not `latest`'s step.
  EXPECT_EQ(resolve_step_dir(step_dir(run, 5)).step_dir, step_dir(run, 5));
  EXPECT_EQ(resolve_step_dir(step_dir(run, 5)).latest, "");
  // A bad `latest` is find_latest's error, naming the file.
  std::ofstream(latest, std::ios::trunc) << "step_xyz\n";
  for (const std::string& p : {run, ck, latest})
    expect_input_error([&] { resolve_step_dir(p); }, {"latest", "invalid content", "step_xyz"});
  publish_latest(run, 9);
  expect_input_error([&] { resolve_step_dir(run); }, {"latest", "step_00000009", "does not exist"});
}

// --resume=STEP: a step number or a step directory of this run (also the run directory or
// `latest`, followed); anything else is one input error naming the choice and what there is.
TEST_F(CheckpointTest, ResumeStepDirChoosesACheckpointOfThisRun) {
  const std::string run = path("run");
  const std::string ck = checkpoints_dir(run);
  for (int64_t step : {2, 4, 6}) {
    fs::create_directories(step_dir(run, step));
    std::ofstream(step_dir(run, step) + "/" + shard_file_name(0, 1)) << "h5";
  }
  fs::remove(step_dir(run, 6) + "/" + shard_file_name(0, 1));  // step 6: no shard file
  fs::create_directories(tmp_step_dir(run, 8));                // a crashed save
  std::ofstream(tmp_step_dir(run, 8) + "/" + shard_file_name(0, 1)) << "h5";
  fs::create_directories(path("other/checkpoints/step_00000002"));
  std::ofstream(path("other/checkpoints/step_00000002/") + shard_file_name(0, 1)) << "h5";
  EXPECT_EQ(checkpoint_steps(run), (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(checkpoint_steps(path("nowhere")).empty());

  auto same = [](const std::string& a, const std::string& b) {
    return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
  };
  EXPECT_TRUE(same(resume_step_dir(run, "2"), step_dir(run, 2)));
  EXPECT_TRUE(same(resume_step_dir(run, "00000004"), step_dir(run, 4)));
  EXPECT_TRUE(same(resume_step_dir(run, step_dir(run, 2)), step_dir(run, 2)));
  EXPECT_TRUE(same(resume_step_dir(run, step_dir(run, 2) + "/"), step_dir(run, 2)));
  publish_latest(run, 4);
  EXPECT_TRUE(same(resume_step_dir(run, run), step_dir(run, 4)));  // latest followed
  EXPECT_TRUE(same(resume_step_dir(run, ck + "/latest"), step_dir(run, 4)));

  expect_input_error([&] { resume_step_dir(run, "3"); },
                     {"--resume=3: ", ck,
                      "has no checkpoint of step 3 (its checkpoints: steps 2, 4)"});
  expect_input_error([&] { resume_step_dir(run, "6"); },
                     {"--resume=6: ", "no checkpoint of step 6"});
  expect_input_error([&] { resume_step_dir(run, tmp_step_dir(run, 8)); },
                     {"step_00000008.tmp is not a complete checkpoint (its checkpoints: "
                      "steps 2, 4)"});
  expect_input_error([&] { resume_step_dir(path("other"), "1"); },
                     {"no checkpoint of step 1 (its checkpoints: step 2)"});
  expect_input_error([&] { resume_step_dir(path("empty"), "1"); }, {"(it holds no checkpoint)"});
  for (const std::string& elsewhere : {path("other/checkpoints/step_00000002"), path("nowhere"),
                                       std::string("-1"), std::string("latest")}) {
    expect_input_error([&] { resume_step_dir(run, elsewhere); },
                       {"--resume=" + elsewhere + ": not a checkpoint of train.run_dir = \"" + run,
                        "fsdp_merge and model.init_from"});
  }
}

// checkpoint.save_total_limit: the newest `keep` complete checkpoints up to `latest` stay;
// nothing else in checkpoints/ is touched, and an interrupted removal's leftover goes.
TEST_F(CheckpointTest, PruneKeepsTheNewestCheckpointsUpToLatest) {
  const std::string run = path("run");
  const fs::path ck = fs::path(run) / "checkpoints";
  for (int64_t s : {1, 2, 3, 4, 5, 9}) {
    fs::create_directories(fs::path(step_dir(run, s)) / "sub");
    std::ofstream(step_dir(run, s) + "/shard_00000-of-00001.h5") << s;
  }
  fs::create_directories(tmp_step_dir(run, 3));                        // a crashed save
  fs::create_directories(ck / "step_00000007.deleting" / "deep");      // an interrupted prune
  std::ofstream(ck / "step_00000007.deleting" / "deep" / "f") << "x";
  fs::create_directories(path("elsewhere"));
  std::ofstream(path("elsewhere") + "/keep") << "x";
  fs::create_directory_symlink(path("elsewhere"), ck / "step_00000000");  // not ours: kept
  std::ofstream(ck / "step_00000001x") << "not a step directory";
  publish_latest(run, 5);

  EXPECT_TRUE(prune_step_dirs(run, 5, 0).removed.empty());  // 0: keep all
  EXPECT_TRUE(fs::exists(step_dir(run, 1)));

  const PruneResult r = prune_step_dirs(run, 5, 2);
  EXPECT_EQ(r.removed,
            (std::vector<std::string>{"step_00000001", "step_00000002", "step_00000003"}));
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(ck)) left.insert(e.path().filename().string());
  // step 9 is above `latest` (a rewound latest): not the prune's to judge.
  EXPECT_EQ(left, (std::set<std::string>{"latest", "step_00000000", "step_00000001x",
                                         "step_00000003.tmp", "step_00000004", "step_00000005",
                                         "step_00000009"}));
  EXPECT_TRUE(fs::exists(path("elsewhere") + "/keep"));
  EXPECT_EQ(find_latest(run), step_dir(run, 5));

  EXPECT_EQ(prune_step_dirs(run, 5, 1).removed, std::vector<std::string>{"step_00000004"});
  EXPECT_TRUE(fs::exists(step_dir(run, 5) + "/shard_00000-of-00001.h5"));
  EXPECT_TRUE(prune_step_dirs(run, 5, 1).removed.empty());  // nothing left to remove

  // No checkpoints directory: one error line naming it, nothing thrown.
  const PruneResult missing = prune_step_dirs(path("nowhere"), 5, 1);
  ASSERT_EQ(missing.errors.size(), 1u);
  EXPECT_NE(missing.errors[0].find("nowhere/checkpoints: cannot list"), std::string::npos)
      << missing.errors[0];
}

TEST_F(CheckpointTest, SafetensorsRoundTrip) {
  const std::string file = path("t.safetensors");
  const std::vector<safetensors::TensorInfo> infos{{"b", {2, 3}}, {"a", {5}}, {"scalar", {}}, {"long.name.x", {1, 1, 3}}};
  {
    safetensors::Writer w(file, infos, {{"step", "12"}});
    EXPECT_EQ(w.next_name(), "b");
    EXPECT_THROW(w.write_next(values(5, 0).data(), 5), Error);  // b has 6 elements
    w.write_next(values(6, 1).data(), 6);
    w.write_next(values(5, 2).data(), 5);
    w.write_next(values(1, 3).data(), 1);
    EXPECT_FALSE(fs::exists(file));  // only the temp file until finish()
    w.write_next(values(3, 4).data(), 3);
    EXPECT_EQ(w.next_name(), "");
    w.finish();
  }
  EXPECT_FALSE(fs::exists(file + ".tmp"));
  const safetensors::Reader r(file);
  EXPECT_EQ(r.header_size() % 8, 0u);
  EXPECT_EQ(fs::file_size(file), 8 + r.header_size() + 4 * (6 + 5 + 1 + 3));
  EXPECT_EQ(r.names(), (std::vector<std::string>{"b", "a", "scalar", "long.name.x"}));
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("step"), "12");
  int64_t expect_begin = 0;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const auto& e = r.entry(infos[i].name);
    EXPECT_EQ(e.dtype, "F32");
    EXPECT_EQ(e.shape, infos[i].shape);
    EXPECT_EQ(e.begin, expect_begin);  // contiguous, header order
    EXPECT_EQ(e.end, e.begin + 4 * infos[i].numel());
    expect_begin = e.end;
    EXPECT_EQ(r.read_f32(infos[i].name), values(infos[i].numel(), static_cast<float>(i + 1)));
  }
  // The raw bytes: size prefix little-endian, JSON padded with spaces.
  std::ifstream in(file, std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[i]);
  EXPECT_EQ(n, r.header_size());
  const std::string header = raw.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
  EXPECT_EQ(json::parse(header)["b"]["data_offsets"], json::array({0, 24}));

  // Abandoned writer: no file, no temp file. Too few tensors: finish() throws.
  {
    safetensors::Writer w(path("u.safetensors"), infos);
    w.write_next(values(6, 1).data(), 6);
    EXPECT_THROW(w.finish(), Error);
  }
  EXPECT_FALSE(fs::exists(path("u.safetensors")));
  EXPECT_FALSE(fs::exists(path("u.safetensors.tmp")));
  EXPECT_THROW(safetensors::Writer(path("d.safetensors"), {{"a", {1}}, {"a", {2}}}), Error);
  std::ofstream(path("bad.safetensors")) << "garbage!garbage";
  expect_input_error([&] { safetensors::Reader(path("bad.safetensors")); }, {"bad.safetensors"});
}

TEST(HfMapping, Gpt2NamesAndTransposes) {
  const fsdp::ModelFamily& gpt2 = fsdp::model_family("gpt2");
  const fsdp::ModelConfig mc = fsdp::model_defaults("gpt2");
  auto hf_gpt2_tensor = [&](const std::string& n, const std::vector<int64_t>& shape) {
    return gpt2.hf_tensor(mc, n, shape);
  };
  auto t = hf_gpt2_tensor("h.11.attn.c_attn.weight", {12, 4});
  ASSERT_TRUE(t);
  EXPECT_EQ(t->name, "transformer.h.11.attn.c_attn.weight");
  EXPECT_EQ(t->shape, (std::vector<int64_t>{4, 12}));
  EXPECT_TRUE(t->transpose);
  for (const char* n : {"h.0.attn.c_proj.weight", "h.0.mlp.c_fc.weight", "h.0.mlp.c_proj.weight"})
    EXPECT_TRUE(hf_gpt2_tensor(n, {2, 3})->transpose) << n;
  for (const char* n : {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.bias", "ln_f.bias"}) {
    auto u = hf_gpt2_tensor(n, {2, 3});
    ASSERT_TRUE(u) << n;
    EXPECT_FALSE(u->transpose) << n;
    EXPECT_EQ(u->name, std::string("transformer.") + n);
    EXPECT_EQ(u->shape, (std::vector<int64_t>{2, 3}));
  }
  EXPECT_FALSE(hf_gpt2_tensor("lm_head.weight", {8, 4}));
  EXPECT_FALSE(hf_gpt2_tensor("h.x.ln_1.weight", {4}));
  EXPECT_FALSE(hf_gpt2_tensor("h.0.ln_3.weight", {4}));
}

namespace {

// The tiny GPT-2 of the merge tests: n_layer 1, C 4, V 8, P 4.
constexpr int64_t C = 4, V = 8, P = 4;
const char* kTinyConfig =
    R"({"model_type":"gpt2","n_layer":1,"n_head":2,"n_embd":4,"n_positions":4,"vocab_size":8,"layer_norm_epsilon":1e-05})";

std::vector<ParamSpec> root_specs() {
  return {spec("wte.weight", {V, C}), spec("wpe.weight", {P, C}), spec("ln_f.weight", {C}), spec("ln_f.bias", {C})};
}
std::vector<ParamSpec> block_specs() {
  const std::string h = "h.0.";
  return {spec(h + "ln_1.weight", {C}),          spec(h + "ln_1.bias", {C}),
          spec(h + "attn.c_attn.weight", {3 * C, C}), spec(h + "attn.c_attn.bias", {3 * C}),
          spec(h + "attn.c_proj.weight", {C, C}),  spec(h + "attn.c_proj.bias", {C}),
          spec(h + "ln_2.weight", {C}),          spec(h + "ln_2.bias", {C}),
          spec(h + "mlp.c_fc.weight", {4 * C, C}),   spec(h + "mlp.c_fc.bias", {4 * C}),
          spec(h + "mlp.c_proj.weight", {C, 4 * C}), spec(h + "mlp.c_proj.bias", {C})};
}

// Known full tensor of each parameter: a value unique to (parameter, element).
std::map<std::string, std::vector<float>> known_tensors() {
  std::map<std::string, std::vector<float>> t;
  float tag = 1.0f;
  for (const auto& specs : {root_specs(), block_specs()})
    for (const auto& s : specs) {
      t[s.name] = values(s.numel(), tag);
      tag += 1.0f;
    }
  return t;
}

// Writes a checkpoint of the tiny model with `layouts` (any grouping of the parameters).
void write_tiny(const std::string& dir, const std::vector<FlatParamLayout>& layouts, int shards) {
  const auto known = known_tensors();
  std::vector<std::map<std::string, std::vector<float>>> full;
  for (const auto& l : layouts) {
    std::vector<float> flat(l.padded_numel, 0.0f);
    for (const auto& e : l.entries) std::copy(known.at(e.spec.name).begin(), known.at(e.spec.name).end(), flat.begin() + e.offset);
    full.push_back({{"param", flat}, {"exp_avg", values(l.padded_numel, -5.0f)}});
  }
  CheckpointMeta m = make_meta(shards, 0);
  m.model_config_json = kTinyConfig;
  write_checkpoint(dir, m, layouts, full);
}

void expect_hf_output(const std::string& out) {
  const auto known = known_tensors();
  const safetensors::Reader r(out + "/model.safetensors");
  std::vector<std::string> expect_names;
  for (const auto& specs : {root_specs(), block_specs()})
    for (const auto& s : specs) expect_names.push_back("transformer." + s.name);
  std::vector<std::string> got_names = r.names();
  std::sort(got_names.begin(), got_names.end());
  std::sort(expect_names.begin(), expect_names.end());
  EXPECT_EQ(got_names, expect_names);  // 16 tensors, no lm_head.weight
  EXPECT_EQ(r.names().front(), "transformer.wte.weight");  // HF state-dict order
  EXPECT_EQ(r.names().back(), "transformer.ln_f.bias");

  // Untransposed tensors are copied exactly.
  for (const char* n : {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias", "h.0.ln_1.bias",
                        "h.0.attn.c_attn.bias", "h.0.mlp.c_fc.bias", "h.0.mlp.c_proj.bias"}) {
    EXPECT_EQ(r.read_f32(std::string("transformer.") + n), known.at(n)) << n;
  }
  EXPECT_EQ(r.entry("transformer.wte.weight").shape, (std::vector<int64_t>{V, C}));
  // Linear weights [out, in] become Conv1D [in, out]: hf[i][o] == ours[o][i].
  const std::map<std::string, std::pair<int64_t, int64_t>> lin{{"h.0.attn.c_attn.weight", {3 * C, C}},
                                                             {"h.0.attn.c_proj.weight", {C, C}},
                                                             {"h.0.mlp.c_fc.weight", {4 * C, C}},
                                                             {"h.0.mlp.c_proj.weight", {C, 4 * C}}};
  for (const auto& [n, oi] : lin) {
    const auto [o_dim, i_dim] = oi;
    const std::string hn = "transformer." + n;
    EXPECT_EQ(r.entry(hn).shape, (std::vector<int64_t>{i_dim, o_dim})) << n;
    const auto hf = r.read_f32(hn);
    const auto& ours = known.at(n);
    for (int64_t o = 0; o < o_dim; ++o)
      for (int64_t i = 0; i < i_dim; ++i) ASSERT_EQ(hf[i * o_dim + o], ours[o * i_dim + i]) << n << " " << o << "," << i;
  }

  std::ifstream in(out + "/config.json");
  const json cfg = json::parse(in);
  EXPECT_EQ(cfg["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(cfg["model_type"], "gpt2");
  EXPECT_EQ(cfg["vocab_size"], V);
  EXPECT_EQ(cfg["n_positions"], P);
  EXPECT_EQ(cfg["n_embd"], C);
  EXPECT_EQ(cfg["n_layer"], 1);
  EXPECT_EQ(cfg["n_head"], 2);
  EXPECT_TRUE(cfg["n_inner"].is_null());
  EXPECT_EQ(cfg["activation_function"], "gelu_new");
  EXPECT_EQ(cfg["resid_pdrop"], 0.0);
  EXPECT_EQ(cfg["embd_pdrop"], 0.0);
  EXPECT_EQ(cfg["attn_pdrop"], 0.0);
  EXPECT_DOUBLE_EQ(cfg["layer_norm_epsilon"].get<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(cfg["initializer_range"].get<double>(), 0.02);
  EXPECT_EQ(cfg["bos_token_id"], V - 1);
  EXPECT_EQ(cfg["eos_token_id"], V - 1);
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  EXPECT_FALSE(fs::exists(out + "/config.json.tmp"));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors.tmp"));
}

}  // namespace

TEST_F(CheckpointTest, MergeTinyGpt2IntoHuggingFaceLayout) {
  const std::vector<FlatParamLayout> layouts{make_layout("root", root_specs(), 2), make_layout("h.0", block_specs(), 2)};
  const std::string dir = path("run/checkpoints/step_00001234");
  write_tiny(dir, layouts, 2);
  const MergeStats st = merge_to_hf(dir, path("hf"));
  EXPECT_EQ(st.num_tensors, 16);
  EXPECT_EQ(st.num_elements, V * C + P * C + 2 * C + 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C);
  expect_hf_output(path("hf"));

  // Keep the checkpoint and its merge for the fsdp_merge command-line test
  // (tests/check_merge.py, ctest fsdp_merge_cli), which compares against them.
  const fs::path keep = fs::path(FSDP_BINARY_DIR) / "test_checkpoint_fixture";
  fs::create_directories(keep);
  fs::remove_all(keep / "step_00001234");
  fs::remove_all(keep / "hf_expected");
  fs::copy(dir, keep / "step_00001234", fs::copy_options::recursive);
  fs::copy(path("hf"), keep / "hf_expected", fs::copy_options::recursive);
}

// BF16 and F16 tensors: the header's dtype and offsets (2 bytes per element), the bytes
// torch's round-to-nearest-even gives (f32_to_bf16 / f32_to_f16: ties to even, checked on
// values chosen to tie), read back as those values; an fp16 overflow is an input error naming
// the tensor and leaves no file; shards are sized by the stored bytes.
TEST_F(CheckpointTest, SafetensorsWritesBf16AndF16RoundedToNearestEven) {
  using fsdp::DType;
  // 1 + 2^-8 ties between bf16's 1 and 1 + 2^-7 (to 1: even); 1 + 3 * 2^-8 ties to 1 + 2^-6;
  // 1 + 2^-11 ties in fp16 (to 1). 65504 is fp16's largest; 1e-8 is below fp16's subnormals.
  const std::vector<float> x = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-11f, -2.5f,
                                65504.0f, 1e-8f, 0.0f, -0.0f, 3.14159265f};
  const int64_t n = static_cast<int64_t>(x.size());
  const std::string file = path("h.safetensors");
  {
    safetensors::Writer w(file, {{"b", {n}, DType::bf16}, {"h", {n}, DType::f16}, {"f", {n}}});
    for (int i = 0; i < 3; ++i) w.write_next(x.data(), n);
    w.finish();
  }
  const safetensors::Reader r(file);
  EXPECT_EQ(fs::file_size(file), 8 + r.header_size() + (2 + 2 + 4) * static_cast<uint64_t>(n));
  EXPECT_EQ(r.entry("b").dtype, "BF16");
  EXPECT_EQ(r.entry("h").dtype, "F16");
  EXPECT_EQ(r.entry("f").dtype, "F32");
  EXPECT_EQ(r.entry("h").begin, 2 * n);
  EXPECT_EQ(r.entry("f").begin, 4 * n);
  const std::vector<float> b = r.read_f32("b"), h = r.read_f32("h");
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(h[2], 1.0f);
  EXPECT_EQ(h[4], 65504.0f);
  EXPECT_EQ(h[5], 0.0f);
  EXPECT_TRUE(std::signbit(b[7]) && std::signbit(h[7]));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(b[i], fsdp::bf16_to_f32(fsdp::f32_to_bf16(x[i]))) << i;
    EXPECT_EQ(h[i], fsdp::f16_to_f32(fsdp::f32_to_f16(x[i]))) << i;
  }
  EXPECT_EQ(r.read_f32("f"), x);
  {
    safetensors::Writer w(path("o.safetensors"), {{"big", {2}, DType::f16}});
    const std::vector<float> big = {1.0f, 70000.0f};
    expect_input_error([&] { w.write_next(big.data(), 2); }, {"\"big\"", "element 1", "70000", "fp16"});
  }
  EXPECT_FALSE(fs::exists(path("o.safetensors")));
  EXPECT_FALSE(fs::exists(path("o.safetensors.tmp")));
  // 3 tensors of 6 bf16 elements (12 bytes each) in 24-byte shards: two per shard.
  EXPECT_EQ(safetensors::assign_shards({{"a", {6}, DType::bf16}, {"b", {6}, DType::bf16}, {"c", {6}, DType::bf16}}, 24),
            (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(safetensors::assign_shards({{"a", {6}}, {"b", {6}}, {"c", {6}}}, 24), (std::vector<int>{0, 1, 2}));
}

// fsdp_merge --dtype bf16 / fp16: every tensor is the fp32 merge's value rounded, the file
// half the size, config.json's torch_dtype the dtype; nothing else changes.
TEST_F(CheckpointTest, MergeToBf16OrFp16RoundsEveryTensor) {
  const std::vector<FlatParamLayout> layouts{make_layout("root", root_specs(), 2), make_layout("h.0", block_specs(), 2)};
  const std::string dir = path("run/checkpoints/step_00000007");
  write_tiny(dir, layouts, 2);
  const MergeStats f32 = merge_to_hf(dir, path("hf32"));
  const safetensors::Reader ref(path("hf32/model.safetensors"));
  std::ifstream ref_in(path("hf32/config.json"));
  json ref_cfg = json::parse(ref_in);
  for (const fsdp::DType t : {fsdp::DType::bf16, fsdp::DType::f16}) {
    const std::string name = fsdp::to_string(t) == std::string_view("bf16") ? "bf16" : "fp16";
    fsdp::ckpt::MergeOptions options;
    options.dtype = t;
    const MergeStats st = merge_to_hf(dir, path("hf_" + name), nullptr, options);
    EXPECT_EQ(st.num_elements, f32.num_elements) << name;
    EXPECT_EQ(st.total_size, 2 * st.num_elements) << name;
    EXPECT_EQ(f32.total_size, 4 * f32.num_elements);
    const safetensors::Reader r(path("hf_" + name + "/model.safetensors"));
    ASSERT_EQ(r.names(), ref.names()) << name;
    for (const std::string& tensor : ref.names()) {
      EXPECT_EQ(r.entry(tensor).dtype, t == fsdp::DType::bf16 ? "BF16" : "F16") << tensor;
      EXPECT_EQ(r.entry(tensor).shape, ref.entry(tensor).shape) << tensor;
      std::vector<float> want = ref.read_f32(tensor);
      for (float& v : want) v = fsdp::round_to(t, v);
      EXPECT_EQ(r.read_f32(tensor), want) << name << " " << tensor;
    }
    std::ifstream in(path("hf_" + name + "/config.json"));
    json cfg = json::parse(in);
    EXPECT_EQ(cfg["torch_dtype"], t == fsdp::DType::bf16 ? "bfloat16" : "float16");
    cfg.erase("torch_dtype");
    json ref_rest = ref_cfg;
    ref_rest.erase("torch_dtype");
    EXPECT_EQ(cfg, ref_rest) << name;
  }
  fsdp::ckpt::MergeOptions bad;
  bad.dtype = fsdp::DType::i32;
  expect_input_error([&] { merge_to_hf(dir, path("hf_i32"), nullptr, bad); }, {"dtype int32", "fp32, bf16 or fp16"});
  EXPECT_FALSE(fs::exists(path("hf_i32")));
}

TEST_F(CheckpointTest, MergeFindsParametersByNameWhateverTheWrapping) {
  // NO_WRAP-like: one unit holding everything, block first, 7 shards (300 elements + 1 padding).
  auto all = block_specs();
  for (auto& s : root_specs()) all.push_back(s);
  const std::vector<FlatParamLayout> layouts{make_layout("root", all, 7)};
  ASSERT_EQ(layouts[0].padded_numel, 301);
  const std::string dir = path("step");
  write_tiny(dir, layouts, 7);
  merge_to_hf(dir, path("hf"));
  expect_hf_output(path("hf"));

  // A parameter missing from the checkpoint is named.
  const std::vector<FlatParamLayout> partial{make_layout("root", root_specs(), 1)};
  write_tiny(path("partial"), partial, 1);
  expect_input_error([&] { merge_to_hf(path("partial"), path("hf2")); }, {"h.0.ln_1.weight", "missing"});
}

namespace {

// A tiny T5 v1.1-style model (gated-gelu, untied head): 1 encoder and 1 decoder block.
fsdp::ModelConfig tiny_t5() {
  fsdp::ModelConfig c = fsdp::model_defaults("t5");
  c.set("vocab_size", int64_t{259});
  c.set("d_model", int64_t{8});
  c.set("d_kv", int64_t{4});
  c.set("d_ff", int64_t{12});
  c.set("num_layers", int64_t{1});
  c.set("num_decoder_layers", int64_t{1});
  c.set("num_heads", int64_t{2});
  c.set("relative_attention_num_buckets", int64_t{8});
  c.set("relative_attention_max_distance", int64_t{16});
  c.set("feed_forward_proj", std::string("gated-gelu"));
  c.set("tie_word_embeddings", false);
  c.pad_vocab_multiple = 1;  // shared and lm_head [259, 8], as Hugging Face holds them
  return c;
}

}  // namespace

TEST_F(CheckpointTest, MergeTinyT5IntoHuggingFaceLayout) {
  const fsdp::ModelConfig mc = tiny_t5();
  const fsdp::ModelFamily& t5 = fsdp::model_family("t5");
  // One unit per module (like T5Block wrapping plus the small modules), 3 shards.
  std::vector<FlatParamLayout> layouts;
  std::map<std::string, std::vector<float>> known;
  std::vector<std::map<std::string, std::vector<float>>> full;
  float tag = 1.0f;
  for (const ModuleDecl& m : t5.modules(mc)) {
    layouts.push_back(make_layout(m.name, m.params, 3));
    std::vector<float> flat(layouts.back().padded_numel, 0.0f);
    for (const FlatEntry& e : layouts.back().entries) {
      known[e.spec.name] = values(e.spec.numel(), tag);
      tag += 1.0f;
      std::copy(known[e.spec.name].begin(), known[e.spec.name].end(), flat.begin() + e.offset);
    }
    full.push_back({{"param", flat}});
  }
  CheckpointMeta meta = make_meta(3, 0);
  meta.model_config_json = fsdp::model_config_json(mc).dump();
  const std::string dir = path("t5/checkpoints/step_00001234");
  write_checkpoint(dir, meta, layouts, full);
  const MergeStats st = merge_to_hf(dir, path("hf"));
  EXPECT_EQ(st.num_tensors, static_cast<int64_t>(known.size()));

  const safetensors::SafetensorsFile r(path("hf") + "/model.safetensors");
  EXPECT_EQ(r.names().size(), known.size());
  EXPECT_EQ(r.names().front(), "shared.weight");
  const int64_t V = 259, D = 8, I = 8, F = 12;  // inner dim = num_heads * d_kv
  const std::map<std::string, std::vector<int64_t>> expect{
      {"shared.weight", {V, D}},
      {"encoder.block.0.layer.0.SelfAttention.q.weight", {I, D}},
      {"encoder.block.0.layer.0.SelfAttention.o.weight", {D, I}},
      {"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", {8, 2}},
      {"encoder.block.0.layer.0.layer_norm.weight", {D}},
      {"encoder.block.0.layer.1.DenseReluDense.wi_0.weight", {F, D}},
      {"encoder.block.0.layer.1.DenseReluDense.wi_1.weight", {F, D}},
      {"encoder.block.0.layer.1.DenseReluDense.wo.weight", {D, F}},
      {"encoder.final_layer_norm.weight", {D}},
      {"decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", {8, 2}},
      {"decoder.block.0.layer.1.EncDecAttention.k.weight", {I, D}},
      {"decoder.block.0.layer.1.layer_norm.weight", {D}},
      {"decoder.block.0.layer.2.DenseReluDense.wi_0.weight", {F, D}},
      {"decoder.final_layer_norm.weight", {D}},
      {"lm_head.weight", {V, D}}};
  for (const auto& [name, shape] : expect) {
    ASSERT_TRUE(r.has(name)) << name;
    EXPECT_EQ(r.entry(name).shape, shape) << name;
    EXPECT_EQ(r.read_f32(name), known.at(name)) << name;  // T5 keeps nn.Linear [out, in]
  }
  for (const auto& n : r.names()) EXPECT_TRUE(known.count(n)) << n;  // our names are HF's

  std::ifstream in(path("hf") + "/config.json");
  const json cfg = json::parse(in);
  EXPECT_EQ(cfg["architectures"], json::array({"T5ForConditionalGeneration"}));
  EXPECT_EQ(cfg["model_type"], "t5");
  EXPECT_EQ(cfg["vocab_size"], V);
  EXPECT_EQ(cfg["d_model"], D);
  EXPECT_EQ(cfg["d_kv"], 4);
  EXPECT_EQ(cfg["d_ff"], F);
  EXPECT_EQ(cfg["num_layers"], 1);
  EXPECT_EQ(cfg["num_decoder_layers"], 1);
  EXPECT_EQ(cfg["num_heads"], 2);
  EXPECT_EQ(cfg["relative_attention_num_buckets"], 8);
  EXPECT_EQ(cfg["relative_attention_max_distance"], 16);
  EXPECT_EQ(cfg["feed_forward_proj"], "gated-gelu");
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  EXPECT_EQ(cfg["is_encoder_decoder"], true);
  // The family reads its own config.json back to the same [model] keys (init_from's check).
  EXPECT_EQ(t5.from_hf_config(cfg, "config.json").values, mc.values);

  // Kept for the fsdp_merge command-line test (check_merge.py --t5-step-dir/--t5-expected).
  const fs::path keep = fs::path(FSDP_BINARY_DIR) / "test_checkpoint_fixture";
  fs::create_directories(keep);
  fs::remove_all(keep / "t5_step_00001234");
  fs::remove_all(keep / "t5_hf_expected");
  fs::copy(dir, keep / "t5_step_00001234", fs::copy_options::recursive);
  fs::copy(path("hf"), keep / "t5_hf_expected", fs::copy_options::recursive);
}

TEST(ModelConfigJson, CarriesTheVocabularyPadding) {
  // model_config JSON round-trips pad_vocab_multiple; a JSON without it (written before it
  // existed) reads as 1, the unpadded tensors such checkpoints hold; a bad value is an input
  // error naming the origin and the key.
  fsdp::ModelConfig c = fsdp::model_defaults("gpt2");
  c.pad_vocab_multiple = 64;
  json j = fsdp::model_config_json(c);
  EXPECT_EQ(j["pad_vocab_multiple"], 64);
  EXPECT_EQ(fsdp::model_config_from_json(j, "f.h5"), c);
  j.erase("pad_vocab_multiple");
  EXPECT_EQ(fsdp::model_config_from_json(j, "f.h5").pad_vocab_multiple, 1);
  for (const json bad : {json(0), json(-128), json(1.5), json("128"), json(int64_t{1} << 20)}) {
    j["pad_vocab_multiple"] = bad;
    expect_input_error([&] { fsdp::model_config_from_json(j, "f.h5"); },
                       {"f.h5: model config \"pad_vocab_multiple\": expected an integer 1 <= x <= 65536"});
  }
}

TEST(ModelConfigJson, KeysAddedLaterReadAsTheirDefaults) {
  // A checkpoint written before a key existed (here Phi-3's LongRoPE and partial rotary keys,
  // added after Phi-3) holds no value for it: it reads as the key's default, the old build's
  // behaviour, so the checkpoint still merges; a key of the wrong type is still refused.
  fsdp::ModelConfig c = fsdp::model_defaults("phi3");
  c.set("num_hidden_layers", int64_t{2});
  json j = fsdp::model_config_json(c);
  for (const char* k : {"partial_rotary_factor", "original_max_position_embeddings",
                        "rope_scaling.short_factor", "rope_scaling.long_factor", "pad_token_id"}) {
    ASSERT_TRUE(j.contains(k)) << k;
    j.erase(k);
  }
  EXPECT_EQ(fsdp::model_config_from_json(j, "f.h5"), c);
  j["num_hidden_layers"] = "2";
  expect_input_error([&] { fsdp::model_config_from_json(j, "f.h5"); },
                     {"f.h5: model config \"num_hidden_layers\": expected an integer"});
  j["num_hidden_layers"] = 2;
  j["rope_scaling.short_factor"] = {1.0, "x"};
  expect_input_error([&] { fsdp::model_config_from_json(j, "f.h5"); },
                     {"f.h5: model config \"rope_scaling.short_factor\": expected an array of numbers"});
}

TEST_F(CheckpointTest, MergeOfAVocabularyPaddedCheckpointIsByteIdentical) {
  // A checkpoint of a vocabulary-padded model (model.pad_vocab_multiple = 128: GPT-2 wte
  // [128, 4] for vocab 8; T5 shared and lm_head [384, 8] for vocab 259) merges into exactly
  // the bytes of the unpadded checkpoint holding the same values (pad 1, today's layout):
  // the pad rows are cut (they hold garbage here, so a leak would show), config.json has
  // vocab_size. Each checkpoint is written to the same step directory (the merged metadata
  // names it) and merged.
  fsdp::ModelConfig gpt2 = fsdp::model_defaults("gpt2");
  gpt2.set("n_layer", int64_t{1});
  gpt2.set("n_head", int64_t{2});
  gpt2.set("n_embd", int64_t{4});
  gpt2.set("n_positions", int64_t{4});
  gpt2.set("vocab_size", int64_t{8});
  for (fsdp::ModelConfig mc : {gpt2, tiny_t5()}) {
    const fsdp::ModelFamily& family = fsdp::model_family(mc.type);
    const std::string dir = path(mc.type + "/checkpoints/step_00000007");
    std::string merged[2];
    for (int padded = 0; padded < 2; ++padded) {
      mc.pad_vocab_multiple = padded ? 128 : 1;
      std::vector<FlatParamLayout> layouts;
      std::vector<std::map<std::string, std::vector<float>>> full;
      float tag = 1.0f;
      int vocab_tensors = 0;
      for (const ModuleDecl& m : family.modules(mc)) {
        layouts.push_back(make_layout(m.name, m.params, 3));
        std::vector<float> flat(layouts.back().padded_numel, 0.0f);
        for (const FlatEntry& e : layouts.back().entries) {
          const std::vector<float> own = values(e.spec.unpadded_numel(), tag);
          tag += 1.0f;
          std::copy(own.begin(), own.end(), flat.begin() + e.offset);
          std::fill(flat.begin() + e.offset + e.spec.unpadded_numel(), flat.begin() + e.offset + e.spec.numel(), 99.0f);
          if (e.spec.numel() > e.spec.unpadded_numel()) ++vocab_tensors;
        }
        full.push_back({{"param", flat}});
      }
      EXPECT_EQ(vocab_tensors, padded ? (mc.type == "t5" ? 2 : 1) : 0) << mc.type;
      CheckpointMeta meta = make_meta(3, 0);
      meta.model_config_json = fsdp::model_config_json(mc).dump();
      fs::remove_all(dir);
      write_checkpoint(dir, meta, layouts, full);
      const std::string out = path(mc.type + "_hf_" + std::to_string(padded));
      merge_to_hf(dir, out);
      std::ifstream st(out + "/model.safetensors", std::ios::binary), cj(out + "/config.json", std::ios::binary);
      merged[padded] = std::string(std::istreambuf_iterator<char>(st), {}) + "|" +
                       std::string(std::istreambuf_iterator<char>(cj), {});
    }
    EXPECT_GT(merged[0].size(), 100u) << mc.type;
    EXPECT_TRUE(merged[0] == merged[1]) << mc.type << ": merged files differ";
  }
}

// ---- integrity: checksums, finiteness, attribute ranges (format version 2) ----
namespace {

// Raw HDF5 edits, the way a corrupted or forged file would look.
void raw_set_i64(const std::string& file, const std::string& obj, const std::string& name, int64_t v) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) H5Eprint2(H5E_DEFAULT, stderr);
  ASSERT_GE(f, 0);
  if (H5Aexists_by_name(f, obj.c_str(), name.c_str(), H5P_DEFAULT) > 0)
    H5Adelete_by_name(f, obj.c_str(), name.c_str(), H5P_DEFAULT);
  const hid_t sp = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate_by_name(f, obj.c_str(), name.c_str(), H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0);
  EXPECT_GE(H5Awrite(a, H5T_NATIVE_INT64, &v), 0);
  H5Aclose(a);
  H5Sclose(sp);
  H5Fclose(f);
}

// Replaces an attribute by a fixed-length string (the reader takes either kind).
void raw_set_str(const std::string& file, const std::string& obj, const std::string& name, const std::string& v) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  if (H5Aexists_by_name(f, obj.c_str(), name.c_str(), H5P_DEFAULT) > 0)
    H5Adelete_by_name(f, obj.c_str(), name.c_str(), H5P_DEFAULT);
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, v.size());
  const hid_t sp = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate_by_name(f, obj.c_str(), name.c_str(), t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0);
  EXPECT_GE(H5Awrite(a, t, v.data()), 0);
  H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
  H5Fclose(f);
}

void raw_delete_attr(const std::string& file, const std::string& obj, const std::string& name) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  EXPECT_GE(H5Adelete_by_name(f, obj.c_str(), name.c_str(), H5P_DEFAULT), 0);
  H5Fclose(f);
}

// Stores the file's metadata checksum anew after a raw edit: what a forger (or a writer with a
// bug) does, so the checks behind the metadata checksum can be reached.
void reseal(const std::string& file) { raw_set_str(file, "/", kMetadataChecksumAttr, metadata_checksum(file)); }

// Overwrites element `index` of a 1-D float dataset.
void raw_write_element(const std::string& file, const std::string& ds, hsize_t index, float v) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t d = H5Dopen2(f, ds.c_str(), H5P_DEFAULT);
  ASSERT_GE(d, 0);
  const hid_t fs_ = H5Dget_space(d);
  const hsize_t one = 1;
  H5Sselect_hyperslab(fs_, H5S_SELECT_SET, &index, nullptr, &one, nullptr);
  const hid_t ms = H5Screate_simple(1, &one, nullptr);
  const herr_t rc = H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs_, H5P_DEFAULT, &v);
  if (rc < 0) H5Eprint2(H5E_DEFAULT, stderr);
  EXPECT_GE(rc, 0);
  H5Sclose(ms);
  H5Sclose(fs_);
  H5Dclose(d);
  H5Fclose(f);
}

// Byte offset of a contiguous dataset's data in its file.
uint64_t raw_offset(const std::string& file, const std::string& ds) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, ds.c_str(), H5P_DEFAULT);
  const haddr_t off = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  return off;
}

void flip_byte(const std::string& file, uint64_t offset) {
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  io.seekp(static_cast<std::streamoff>(offset));
  io.write(&c, 1);
}

std::string read_bytes(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_F(CheckpointTest, EveryDatasetCarriesItsXxh3Checksum) {
  const auto layouts = two_units(2);
  const auto full = full_buffers(layouts);
  const std::string dir = path("step");
  CheckpointMeta meta = make_meta(2, 0);
  meta.config_fingerprint = config_fingerprint(meta.train_config_toml);
  write_checkpoint(dir, meta, layouts, full);
  const std::string file = (fs::path(dir) / shard_file_name(1, 2)).string();
  {
    const h5::File f = h5::File::open_read(file);
    EXPECT_EQ(f.attr_i64("/", "format_version"), 3);
    EXPECT_EQ(f.attr_str("/", "config_fingerprint"), meta.config_fingerprint);
    EXPECT_EQ(f.attr_str("/", "run_id"), meta.run_id);
    EXPECT_EQ(f.attr_str("/", "launch_id"), meta.launch_id);
    const std::string sum = f.attr_str("/", kMetadataChecksumAttr);
    EXPECT_EQ(sum.size(), 16u);
    EXPECT_EQ(sum, metadata_checksum(file));
    EXPECT_EQ(meta.config_fingerprint.size(), 16u);
    for (int u = 0; u < 2; ++u)
      for (const char* d : {"param", "exp_avg", "exp_avg_sq"}) {
        const std::string stored = f.attr_str("/units/" + std::to_string(u) + "/" + d, "xxh3_64");
        // Shard 1's slice of the full buffer, hashed independently of the writer.
        EXPECT_EQ(stored, checksum_hex(full[u].at(d).data() + layouts[u].shard_begin(1), layouts[u].shard_numel));
        EXPECT_EQ(stored.size(), 16u);
        EXPECT_EQ(stored.find_first_not_of("0123456789abcdef"), std::string::npos) << stored;
      }
  }
  // XXH3-64 (seed 0) of the empty input, the reference value of the xxHash specification.
  EXPECT_EQ(checksum_hex(nullptr, 0), "2d06800538d394c2");
  const float one = 1.0f;
  EXPECT_NE(checksum_hex(&one, 1), checksum_hex(full[0].at("param").data() + 1, 1));
  const ShardFile sf = ShardFile::open(file);
  EXPECT_EQ(sf.meta().format_version, 3);
  EXPECT_EQ(sf.meta().config_fingerprint, meta.config_fingerprint);
  EXPECT_EQ(sf.meta().run_id, meta.run_id);
  EXPECT_EQ(sf.meta().launch_id, meta.launch_id);
  EXPECT_NO_THROW(sf.verify_all());
  const CheckpointSet set = CheckpointSet::open(dir);
  EXPECT_NO_THROW(set.verify_all());
}

TEST_F(CheckpointTest, FlippedByteIsACorruptionNamingFileAndTensor) {
  const auto layouts = two_units(2);
  const auto full = full_buffers(layouts);
  const std::string dir = path("step");
  write_checkpoint(dir, make_meta(2, 0), layouts, full);
  const std::string file = (fs::path(dir) / shard_file_name(1, 2)).string();
  const uint64_t off = raw_offset(file, "/units/1/exp_avg");
  ASSERT_NE(off, HADDR_UNDEF);
  // The offset is right: the file holds shard 1's exp_avg bytes there.
  const std::string bytes = read_bytes(file);
  const float* want = full[1].at("exp_avg").data() + layouts[1].shard_begin(1);
  ASSERT_EQ(0, std::memcmp(bytes.data() + off, want, 4 * sizeof(float)));
  flip_byte(file, off + 6);  // element 1's mantissa: still a finite float

  const std::vector<std::string> needles{file, "tensor /units/1/exp_avg (unit h.0)", "checksum mismatch",
                                         "(stored ", ", computed ", "the file is corrupted"};
  {
    const ShardFile sf = ShardFile::open(file);  // metadata only: opens fine
    std::vector<float> out(static_cast<std::size_t>(layouts[1].shard_numel));
    EXPECT_NO_THROW(sf.read_unit(1, "param", out.data()));  // other datasets are intact
    expect_input_error([&] { sf.read_unit(1, "exp_avg", out.data()); }, needles);
  }
  {
    const ShardFile sf = ShardFile::open(file);  // a partial read verifies the whole dataset
    float x = 0;
    expect_input_error([&] { sf.read_unit_range(1, "exp_avg", 3, 1, &x); }, needles);
  }
  const CheckpointSet set = CheckpointSet::open(dir);
  expect_input_error([&] { set.verify_all(); }, needles);
  std::vector<float> flat(8);
  expect_input_error([&] { set.read_flat(1, "exp_avg", 0, 8, flat.data()); }, needles);
  expect_input_error([&] { merge_to_hf(dir, path("out")); }, needles);
  EXPECT_FALSE(fs::exists(path("out")));  // refused before any output
}

TEST_F(CheckpointTest, NonFiniteValuesAreRefusedOnLoadAndSave) {
  const auto layouts = two_units(2);
  const auto full = full_buffers(layouts);
  const std::string dir = path("step");
  write_checkpoint(dir, make_meta(2, 0), layouts, full);
  const std::string file = (fs::path(dir) / shard_file_name(0, 2)).string();
  raw_write_element(file, "/units/0/param", 2, std::numeric_limits<float>::quiet_NaN());
  {
    // The checksum no longer matches: that is reported first.
    const ShardFile sf = ShardFile::open(file);
    std::vector<float> out(9);
    expect_input_error([&] { sf.read_unit(0, "param", out.data()); }, {file, "/units/0/param", "checksum mismatch"});
  }
  // A NaN with a matching checksum (a writer that hashed the NaN): the finiteness check.
  std::vector<float> shard(full[0].at("param").begin(), full[0].at("param").begin() + 9);
  shard[4] = std::numeric_limits<float>::infinity();  // flat element 4: wte.weight
  raw_write_element(file, "/units/0/param", 2, full[0].at("param")[2]);  // undo
  raw_write_element(file, "/units/0/param", 4, shard[4]);
  raw_set_str(file, "/units/0/param", "xxh3_64", checksum_hex(shard.data(), 9));
  // The dataset checksums are metadata too: changed without resealing, the file does not open.
  expect_input_error([&] { ShardFile::open(file); }, {file, "metadata checksum mismatch"});
  reseal(file);
  {
    const ShardFile sf = ShardFile::open(file);
    std::vector<float> out(9);
    expect_input_error([&] { sf.read_unit(0, "param", out.data()); },
                       {file, "tensor /units/0/param (unit root)", "element 4 (flat element 4, parameter wte.weight) is inf"});
    const CheckpointSet set = CheckpointSet::open(dir);
    expect_input_error([&] { merge_to_hf(dir, path("out")); }, {file, "element 4", "is inf"});
    EXPECT_FALSE(fs::exists(path("out")));
  }

  // Saving a NaN is an Error (not an input error) naming the step and tensor; nothing written.
  auto bad = full_buffers(layouts);
  bad[1].at("exp_avg_sq")[7] = -std::numeric_limits<float>::infinity();  // shard 1, element 3: padding
  try {
    write_checkpoint(path("bad"), make_meta(2, 0), layouts, bad);
    ADD_FAILURE() << "expected fsdp::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitRuntimeError);
    const std::string msg = e.what();
    for (const char* n : {"refusing to save step 1234", "tensor /units/1/exp_avg_sq (unit h.0) element 3",
                          "(flat element 7, padding) is -inf", "shard_00001-of-00002.h5"})
      EXPECT_NE(msg.find(n), std::string::npos) << msg << "\n  lacks: " << n;
  }
  EXPECT_FALSE(fs::exists(path("bad/shard_00001-of-00002.h5")));
  EXPECT_FALSE(fs::exists(path("bad/shard_00001-of-00002.h5.tmp")));
}

// A view of another memory (a device unit in a synchronous save) is read through its fetch,
// one dataset at a time into one reused host buffer, never through its pointers: here those
// point at NaN-filled stand-ins for device memory and the fetch copies the real values. The
// file equals the host views' dataset for dataset (unit 0 fetched, unit 1 in place, as with
// offload_optimizer_ratio), every fetch is one dataset, and a non-finite fetched value is
// the same refusal with nothing left on disk.
TEST_F(CheckpointTest, FetchedViewsWriteTheSameFileOneDatasetAtATime) {
  const auto layouts = two_units(2);
  auto full = full_buffers(layouts);
  write_checkpoint(path("host"), make_meta(2, 0), layouts, full);
  auto device = full;  // the stand-in "device" buffers: NaN everywhere
  for (auto& unit : device)
    for (auto& [name, buf] : unit) std::fill(buf.begin(), buf.end(), std::nanf(""));
  int64_t fetches = 0, largest = 0;
  auto write_fetched = [&](const std::string& dir, int s) {
    CheckpointMeta m = make_meta(2, 0);
    m.shard_index = s;
    std::vector<UnitShardView> views;
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      const bool fetched = u == 0;
      UnitShardView v = shard_view(layouts[u], s, fetched ? device[u] : full[u]);
      if (fetched) {
        v.fetch = [&, u](const float* p, float* dst, int64_t n) {
          ++fetches;
          largest = std::max(largest, n);
          for (auto& [name, buf] : device[u]) {
            if (p >= buf.data() && p < buf.data() + buf.size()) {
              const float* real = full[u].at(name).data() + (p - buf.data());
              std::copy(real, real + n, dst);
              return;
            }
          }
          FAIL() << "fetch of a pointer outside the device buffers";
        };
      }
      views.push_back(std::move(v));
    }
    fs::create_directories(dir);
    write_shard_file((fs::path(dir) / shard_file_name(s, 2)).string(), m, views);
  };
  for (int s = 0; s < 2; ++s) write_fetched(path("fetched"), s);
  EXPECT_EQ(fetches, 2 * 3);  // unit 0's param, exp_avg, exp_avg_sq on each shard
  EXPECT_EQ(largest, layouts[0].shard_numel);
  for (int s = 0; s < 2; ++s) {
    const ShardFile a = ShardFile::open((fs::path(path("host")) / shard_file_name(s, 2)).string());
    const ShardFile b =
        ShardFile::open((fs::path(path("fetched")) / shard_file_name(s, 2)).string());
    for (int u = 0; u < 2; ++u) {
      const auto n = static_cast<std::size_t>(layouts[static_cast<std::size_t>(u)].shard_numel);
      for (const char* d : {"param", "exp_avg", "exp_avg_sq"}) {
        std::vector<float> x(n), y(n);
        a.read_unit(u, d, x.data());
        b.read_unit(u, d, y.data());  // verifies the stored checksum and finiteness too
        EXPECT_EQ(x, y) << "shard " << s << " unit " << u << " " << d;
      }
    }
  }
  full[0].at("exp_avg")[layouts[0].shard_begin(1) + 1] = std::numeric_limits<float>::infinity();
  try {
    write_fetched(path("bad"), 1);
    ADD_FAILURE() << "expected fsdp::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitRuntimeError);
    const std::string msg = e.what();
    for (const char* n : {"refusing to save step 1234", "tensor /units/0/exp_avg", "element 1",
                          "is inf", "shard_00001-of-00002.h5"})
      EXPECT_NE(msg.find(n), std::string::npos) << msg << "\n  lacks: " << n;
  }
  EXPECT_FALSE(fs::exists(path("bad/shard_00001-of-00002.h5")));
  EXPECT_FALSE(fs::exists(path("bad/shard_00001-of-00002.h5.tmp")));
}

TEST_F(CheckpointTest, Version1FilesLoadWithoutChecksums) {
  const auto layouts = two_units(2);
  const auto full = full_buffers(layouts);
  const std::string dir = path("step");
  write_checkpoint(dir, make_meta(2, 0), layouts, full);
  // Turn both files into what format version 1 wrote: no checksums, no fingerprint (and none
  // of version 3's metadata checksum and ids).
  for (int s = 0; s < 2; ++s) {
    const std::string file = (fs::path(dir) / shard_file_name(s, 2)).string();
    raw_set_i64(file, "/", "format_version", 1);
    raw_delete_attr(file, "/", "config_fingerprint");
    for (const char* a : {kMetadataChecksumAttr, "run_id", "launch_id"}) raw_delete_attr(file, "/", a);
    for (int u = 0; u < 2; ++u)
      for (const char* d : {"param", "exp_avg", "exp_avg_sq"})
        raw_delete_attr(file, "/units/" + std::to_string(u) + "/" + d, "xxh3_64");
  }
  const std::string file = (fs::path(dir) / shard_file_name(0, 2)).string();
  {
    const ShardFile sf = ShardFile::open(file);
    EXPECT_EQ(sf.meta().format_version, 1);
    EXPECT_EQ(sf.meta().config_fingerprint, "");
    std::vector<float> out(9);
    sf.read_unit(0, "exp_avg", out.data());
    EXPECT_EQ(0, std::memcmp(out.data(), full[0].at("exp_avg").data(), 9 * sizeof(float)));
    EXPECT_NO_THROW(CheckpointSet::open(dir).verify_all());
  }
  // Version 1 has no checksum to catch a flipped byte, but a non-finite value is still refused.
  raw_write_element(file, "/units/0/exp_avg", 2, std::numeric_limits<float>::quiet_NaN());
  const ShardFile sf = ShardFile::open(file);
  std::vector<float> out(9);
  expect_input_error([&] { sf.read_unit(0, "exp_avg", out.data()); }, {file, "/units/0/exp_avg", "element 2", "is nan"});
  // A version-2 (or later) file without its checksum attribute is corrupted, not version 1
  // (the metadata checksum catches the deletion first; resealed, the read does).
  const std::string dir2 = path("step2");
  write_checkpoint(dir2, make_meta(2, 0), layouts, full);
  const std::string file2 = (fs::path(dir2) / shard_file_name(0, 2)).string();
  raw_delete_attr(file2, "/units/1/param", "xxh3_64");
  expect_input_error([&] { ShardFile::open(file2); }, {file2, "metadata checksum mismatch"});
  reseal(file2);
  {
    const ShardFile sf2 = ShardFile::open(file2);
    expect_input_error([&] { sf2.read_unit(1, "param", out.data()); }, {file2, "/units/1/param", "no xxh3_64 checksum"});
  }
  // Versions this build does not know are refused.
  raw_set_i64(file2, "/", "format_version", 4);
  expect_input_error([&] { ShardFile::open(file2); }, {file2, "unsupported checkpoint format_version 4"});
}

TEST_F(CheckpointTest, StepAttributeOutOfRangeIsAnInputError) {
  const auto layouts = two_units(2);
  const std::string dir = path("step");
  write_checkpoint(dir, make_meta(2, 0), layouts, full_buffers(layouts));
  const std::string file = (fs::path(dir) / shard_file_name(0, 2)).string();
  // Changed after the save, any value is a metadata checksum mismatch; the range checks stand
  // behind it for a file whose checksum was computed over the bad value (resealed).
  raw_set_i64(file, "/", "step", -5);
  expect_input_error([&] { ShardFile::open(file); }, {file, "metadata checksum mismatch"});
  reseal(file);
  expect_input_error([&] { ShardFile::open(file); }, {file, "root attribute step = -5 is out of range"});
  expect_input_error([&] { CheckpointSet::open(dir); }, {file, "step = -5"});
  raw_set_i64(file, "/", "step", int64_t{1} << 62);
  reseal(file);
  expect_input_error([&] { ShardFile::open(file); }, {file, "root attribute step = 4611686018427387904 is out of range"});
  raw_set_i64(file, "/", "step", kMaxStep);  // the bound itself is accepted ...
  raw_set_i64(file, "/", "optimizer_updates", 7);
  reseal(file);
  EXPECT_EQ(ShardFile::open(file).meta().step, kMaxStep);
  raw_set_i64(file, "/", "optimizer_updates", -1);  // ... optimizer_updates must lie in [0, step]
  reseal(file);
  expect_input_error([&] { ShardFile::open(file); }, {file, "optimizer_updates = -1"});
}

// ---- identity (run_id, launch_id) and the metadata checksum (format version 3) ----
namespace {

// Replaces byte `at` of the one occurrence of `needle` in `file` by `to` (one changed byte,
// as a bad disk or a careless edit makes it).
void edit_byte(const std::string& file, const std::string& needle, std::size_t at, char to) {
  const std::string bytes = read_bytes(file);
  const std::size_t pos = bytes.find(needle);
  ASSERT_NE(pos, std::string::npos) << needle << " not in " << file;
  ASSERT_EQ(bytes.find(needle, pos + 1), std::string::npos) << needle << " twice in " << file;
  ASSERT_NE(bytes[pos + at], to);
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(pos + at));
  io.write(&to, 1);
}

// Every file below `dir` with its content: a refused command must leave it as it was.
std::map<std::string, std::string> tree_contents(const std::string& dir) {
  std::map<std::string, std::string> t;
  for (const auto& de : fs::recursive_directory_iterator(dir))
    t[de.path().string()] = de.is_regular_file() ? read_bytes(de.path().string()) : "<dir>";
  return t;
}

}  // namespace

TEST_F(CheckpointTest, RunAndLaunchIdsAreRandomHexAndWrittenIntoEveryShard) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = new_run_id();
    EXPECT_TRUE(is_run_id(id)) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 1000u);
  for (const char* bad : {"", "0123456789abcdef0123456789abcde", "0123456789ABCDEF0123456789abcdef",
                          "0123456789abcdef0123456789abcdef0", "0123456789abcdef 123456789abcdef"})
    EXPECT_FALSE(is_run_id(bad)) << bad;

  const auto layouts = two_units(2);
  CheckpointMeta meta = make_meta(2, 0);
  meta.run_id = new_run_id();
  meta.launch_id = new_run_id();
  write_checkpoint(path("step"), meta, layouts, full_buffers(layouts));
  const CheckpointSet set = CheckpointSet::open(path("step"));
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(set.shard(s).meta().run_id, meta.run_id);
    EXPECT_EQ(set.shard(s).meta().launch_id, meta.launch_id);
  }
  // The writer refuses a meta without ids (before touching the disk): every shard must carry them.
  for (std::string CheckpointMeta::* id : {&CheckpointMeta::run_id, &CheckpointMeta::launch_id}) {
    CheckpointMeta bad = meta;
    bad.*id = "not-an-id";
    try {
      write_checkpoint(path("no_id"), bad, layouts, full_buffers(layouts));
      ADD_FAILURE() << "expected fsdp::Error";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), kExitRuntimeError);
      EXPECT_NE(std::string(e.what()).find("is not 32 lowercase hex digits"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(fs::is_empty(path("no_id")));
  }
}

// Issue 29 item 5: a shard of a run that differs only in optim.lr (a key that may change on
// resume, so the config fingerprints are equal) copied into another run's step directory.
TEST_F(CheckpointTest, ShardsOfTwoRunsOrTwoLaunchesAreRefusedByMergeAndResume) {
  const std::vector<FlatParamLayout> layouts{make_layout("root", root_specs(), 2), make_layout("h.0", block_specs(), 2)};
  auto run = [&](const std::string& lr) {
    CheckpointMeta m = make_meta(2, 0);
    m.model_config_json = kTinyConfig;
    m.train_config_toml = "[optim]\nlr = " + lr + "\n[train]\nseed = 42\n";
    m.config_fingerprint = config_fingerprint(m.train_config_toml);
    m.run_id = new_run_id();
    m.launch_id = new_run_id();
    return m;
  };
  const CheckpointMeta a = run("0.001"), b = run("0.0005");
  ASSERT_EQ(a.config_fingerprint, b.config_fingerprint);  // nothing else tells the runs apart
  std::vector<std::map<std::string, std::vector<float>>> full_a, full_b;
  for (const auto& l : layouts) {
    full_a.push_back({{"param", values(l.padded_numel, 1.0f)}, {"exp_avg", values(l.padded_numel, 2.0f)}});
    full_b.push_back({{"param", values(l.padded_numel, 3.0f)}, {"exp_avg", values(l.padded_numel, 4.0f)}});
  }
  const std::string dir_a = path("a/checkpoints/step_00001234"), dir_b = path("b/checkpoints/step_00001234");
  write_checkpoint(dir_a, a, layouts, full_a);
  write_checkpoint(dir_b, b, layouts, full_b);
  EXPECT_NO_THROW(CheckpointSet::open(dir_a));
  const std::string shard1 = (fs::path(dir_a) / shard_file_name(1, 2)).string();
  const std::string shard0 = (fs::path(dir_a) / shard_file_name(0, 2)).string();
  fs::copy_file((fs::path(dir_b) / shard_file_name(1, 2)).string(), shard1, fs::copy_options::overwrite_existing);
  const std::vector<std::string> needles{shard1 + ": run_id " + b.run_id + " differs from " + shard0 +
                                             " (run_id " + a.run_id + ")",
                                         "the shards come from different runs"};
  expect_input_error([&] { CheckpointSet::open(dir_a); }, needles);  // resume opens the set so
  expect_input_error([&] { merge_to_hf(dir_a, path("hf")); }, needles);
  EXPECT_FALSE(fs::exists(path("hf")));

  // The same run, shards of two launches (e.g. two resumed branches of one run saving the
  // same step): the run id agrees, the launch id does not.
  CheckpointMeta c = a;
  c.launch_id = new_run_id();
  write_checkpoint(path("c"), c, layouts, full_a);
  fs::copy_file((fs::path(path("c")) / shard_file_name(1, 2)).string(), shard1, fs::copy_options::overwrite_existing);
  expect_input_error([&] { CheckpointSet::open(dir_a); },
                     {shard1 + ": launch_id " + c.launch_id + " differs from " + shard0, "different launches"});
  expect_input_error([&] { merge_to_hf(dir_a, path("hf")); }, {shard1, "launch_id"});
  EXPECT_FALSE(fs::exists(path("hf")));

  // The counters every shard of one save holds alike.
  CheckpointMeta d = a;
  d.optimizer_updates = 1000;
  write_checkpoint(path("d"), d, layouts, full_a);
  fs::copy_file((fs::path(path("d")) / shard_file_name(1, 2)).string(), shard1, fs::copy_options::overwrite_existing);
  expect_input_error([&] { CheckpointSet::open(dir_a); }, {shard1 + ": optimizer_updates 1000 differs from " + shard0});
}

// Issue 29 item 6: one changed byte of metadata (the model config's epsilon, a unit's entry
// offset, the step, ...) is refused when the file is opened, naming the file; before, a
// single-shard checkpoint merged into a wrong model and --resume continued from a wrong state.
TEST_F(CheckpointTest, MetadataIsUnderAChecksumVerifiedOnOpen) {
  const std::vector<FlatParamLayout> layouts{make_layout("root", root_specs(), 1), make_layout("h.0", block_specs(), 1)};
  const std::string pristine = path("pristine");
  write_tiny(pristine, layouts, 1);
  const std::string dir = path("step"), file = (fs::path(dir) / shard_file_name(0, 1)).string();
  auto fresh = [&] {
    fs::remove_all(dir);
    fs::remove_all(path("hf"));
    fs::copy(pristine, dir, fs::copy_options::recursive);
  };
  // Every way to open the file refuses it, naming it; merge writes nothing.
  auto expect_refused = [&](const std::string& what, const std::vector<std::string>& needles) {
    SCOPED_TRACE(what);
    expect_input_error([&] { ShardFile::open(file); }, needles);
    expect_input_error([&] { CheckpointSet::open(dir); }, needles);
    expect_input_error([&] { open_for_resume(dir, make_meta(1, 0), layouts); }, needles);
    expect_input_error([&] { merge_to_hf(dir, path("hf")); }, needles);
    EXPECT_FALSE(fs::exists(path("hf")));
  };
  const std::vector<std::string> mismatch{file + ": metadata checksum mismatch (stored ", ", computed ",
                                          "the file is corrupted"};

  // The model config: layer_norm_epsilon 1e-05 -> 1e-06, one byte of the stored JSON.
  fresh();
  edit_byte(file, "\"layer_norm_epsilon\":1e-05", 25, '6');
  expect_refused("model_config", mismatch);
  reseal(file);  // what the file would be without the checksum: a wrong model merges
  merge_to_hf(dir, path("hf"));
  std::ifstream cfg(path("hf") + "/config.json");
  EXPECT_DOUBLE_EQ(json::parse(cfg)["layer_norm_epsilon"].get<double>(), 1e-6);

  // A unit's entry offset: h.0.ln_1.bias at 4 -> 5 (it would read ln_1.weight's elements).
  fresh();
  edit_byte(file, "\"name\":\"h.0.ln_1.bias\",\"offset\":4,", 32, '5');
  expect_refused("entries offset", mismatch);
  reseal(file);
  EXPECT_EQ(ShardFile::open(file).layouts()[1].entries[1].offset, 5);  // the edit took effect

  // Scalars and identity, each changed alone to another plausible value.
  const std::vector<std::pair<std::string, int64_t>> ints{
      {"step", 1233}, {"sampler_epoch", 4}, {"sampler_position", 778}, {"optimizer_updates", 1000},
      {"loss_scale_good_steps", 3}, {"seed", 43}, {"world_size", 2}, {"num_units", 1}};
  for (const auto& [attr, v] : ints) {
    fresh();
    raw_set_i64(file, "/", attr, v);
    expect_refused(attr, mismatch);
  }
  const std::vector<std::tuple<std::string, std::string, int64_t>> unit_ints{
      {"/units/1", "numel", 299}, {"/units/0", "shard_numel", 40}};
  for (const auto& [obj, attr, v] : unit_ints) {
    fresh();
    raw_set_i64(file, obj, attr, v);
    expect_refused(obj + " " + attr, mismatch);
  }
  const std::vector<std::tuple<std::string, std::string, std::string>> strs{
      {"/", "run_id", "00000000000000000000000000000000"},
      {"/", "optimizer", "sgd"},
      {"/", "train_config", "[train]\nseed = 43\n"},
      {"/units/1", "unit_name", "h.1"},
      {"/units/1", "state", "[]"},
      {"/units/0/param", "xxh3_64", "0000000000000000"}};
  for (const auto& [obj, attr, v] : strs) {
    fresh();
    raw_set_str(file, obj, attr, v);
    expect_refused(obj + " " + attr, mismatch);
  }
  // A version number lowered after the save does not turn the check off: the attribute is
  // still there and format_version is hashed too.
  fresh();
  raw_set_i64(file, "/", "format_version", 2);
  expect_refused("format_version", mismatch);
  // The checksum itself changed, or removed from a version-3 file.
  fresh();
  raw_set_str(file, "/", kMetadataChecksumAttr, "0123456789abcdef");
  expect_refused("metadata_xxh3_64", {file + ": metadata checksum mismatch (stored 0123456789abcdef, computed "});
  fresh();
  raw_delete_attr(file, "/", kMetadataChecksumAttr);
  expect_refused("no metadata_xxh3_64",
                 {file + ": no metadata_xxh3_64 attribute (format_version 3 has one): the file is corrupted"});
  // A resealed file with a malformed id is still refused.
  fresh();
  raw_set_str(file, "/", "launch_id", "x");
  reseal(file);
  expect_refused("launch_id format", {file + ": root attribute launch_id = \"x\" is not 32 lowercase hex digits"});
  // Untouched, it merges as before (the same tensors; the header names the source directory).
  fresh();
  merge_to_hf(dir, path("hf"));
  expect_hf_output(path("hf"));
}

// Files written before format version 3 (no metadata checksum, no ids) still load and merge;
// a step mixing them with version-3 shards does not.
TEST_F(CheckpointTest, Version2FilesLoadWithoutMetadataChecksumOrIds) {
  const std::vector<FlatParamLayout> layouts{make_layout("root", root_specs(), 2), make_layout("h.0", block_specs(), 2)};
  const std::string dir = path("step");
  write_tiny(dir, layouts, 2);
  merge_to_hf(dir, path("hf3"));
  auto downgrade = [&](int s) {
    const std::string file = (fs::path(dir) / shard_file_name(s, 2)).string();
    raw_set_i64(file, "/", "format_version", 2);
    for (const char* a : {kMetadataChecksumAttr, "run_id", "launch_id"}) raw_delete_attr(file, "/", a);
  };
  downgrade(1);
  expect_input_error([&] { CheckpointSet::open(dir); }, {shard_file_name(1, 2), "format_version 2 differs from"});
  downgrade(0);
  const CheckpointSet set = CheckpointSet::open(dir);
  EXPECT_EQ(set.meta().format_version, 2);
  EXPECT_EQ(set.meta().run_id, "");
  EXPECT_EQ(set.meta().launch_id, "");
  EXPECT_NO_THROW(set.verify_all());
  merge_to_hf(dir, path("hf2"));
  EXPECT_EQ(read_bytes(path("hf2") + "/model.safetensors"), read_bytes(path("hf3") + "/model.safetensors"));
  EXPECT_EQ(read_bytes(path("hf2") + "/config.json"), read_bytes(path("hf3") + "/config.json"));
}

// Issue 29 item 7: `fsdp_merge STEP STEP` wrote the model into the checkpoint tree. An OUT_DIR
// inside (or equal to) a step directory or a checkpoints tree is refused, nothing written.
TEST_F(CheckpointTest, MergeRefusesAnOutputDirectoryInsideTheCheckpoints) {
  const std::vector<FlatParamLayout> layouts{make_layout("root", root_specs(), 2), make_layout("h.0", block_specs(), 2)};
  const std::string run = path("run"), step = step_dir(run, 1234), ck = checkpoints_dir(run);
  write_tiny(step, layouts, 2);
  write_tiny(step_dir(run, 5), layouts, 2);
  publish_latest(run, 1234);
  const std::string other = path("other");  // another run's tree
  write_tiny(step_dir(other, 7), layouts, 2);
  publish_latest(other, 7);
  fs::create_directory_symlink(ck, path("link"));
  const auto before = tree_contents(dir_.string());
  const std::vector<std::pair<std::string, std::string>> refused{
      {step, "the checkpoint STEP_DIR " + step},
      {step + "/", "the checkpoint STEP_DIR " + step},
      {step + "/hf", "the checkpoint STEP_DIR " + step},
      {step + "/../step_00001234/hf/sub", "the checkpoint STEP_DIR " + step},
      {ck, "the checkpoints tree " + ck},
      {ck + "/hf", "the checkpoints tree " + ck},
      {ck + "/step_00000005", "the checkpoint step directory " + step_dir(run, 5)},
      {ck + "/step_00000005/hf", "the checkpoint step directory " + step_dir(run, 5)},
      {path("link") + "/hf", "the checkpoints tree " + ck},
      {checkpoints_dir(other) + "/hf", "the checkpoints tree " + checkpoints_dir(other)},
      {step_dir(other, 7) + "/hf", "the checkpoint step directory " + step_dir(other, 7)}};
  for (const auto& [out, what] : refused) {
    expect_input_error([&] { merge_to_hf(step, out); },
                       {"OUT_DIR " + out + " is inside " + what, "choose a directory outside"});
    EXPECT_EQ(before, tree_contents(dir_.string())) << out;
  }
  // Relative paths are resolved too.
  const fs::path cwd = fs::current_path();
  fs::current_path(ck);
  expect_input_error([&] { merge_to_hf("step_00001234", "hf"); }, {"OUT_DIR hf is inside the checkpoints tree " + ck});
  expect_input_error([&] { merge_to_hf("step_00001234", "."); }, {"OUT_DIR . is inside the checkpoints tree " + ck});
  fs::current_path(cwd);
  EXPECT_EQ(before, tree_contents(dir_.string()));
  // Beside the checkpoints tree (in the run directory) and elsewhere is fine.
  merge_to_hf(step, run + "/hf");
  expect_hf_output(run + "/hf");
  merge_to_hf(step, path("hf"));
  expect_hf_output(path("hf"));
}

TEST_F(CheckpointTest, GarbageInLatestIsQuotedEscapedAndCut) {
  const std::string run = path("run");
  fs::create_directories(checkpoints_dir(run));
  const std::string latest = (fs::path(checkpoints_dir(run)) / "latest").string();
  std::string garbage = "\x7f" "ELF\x02\x01\x01";
  garbage += std::string("\0\x1b[31m\xff\xfe", 8);
  garbage += std::string(500, 'A');
  std::ofstream(latest, std::ios::binary) << garbage;
  try {
    find_latest(run);
    ADD_FAILURE() << "expected fsdp::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.exit_code(), kExitInputError);
    EXPECT_NE(msg.find(latest + ": invalid content \"\\x7fELF\\x02\\x01\\x01\\x00\\x1b[31m\\xff\\xfeAAA"), std::string::npos) << msg;
    EXPECT_NE(msg.find("...\" (expected one line such as step_00000100)"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), latest.size() + 200) << msg;  // cut, not 500 A's
    for (unsigned char c : msg) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << msg;
  }
  std::ofstream(latest, std::ios::binary | std::ios::trunc) << "../../etc\n";
  expect_input_error([&] { find_latest(run); }, {latest, "invalid content \"../../etc\""});
  std::ofstream(latest, std::ios::binary | std::ios::trunc) << std::string(5000, 's');
  expect_input_error([&] { find_latest(run); }, {latest, "longer than 4096 bytes"});
  std::ofstream(latest, std::ios::binary | std::ios::trunc) << "";
  expect_input_error([&] { find_latest(run); }, {latest, "invalid content \"\""});
}

TEST(ResumeConfig, OnlyTheListedKeysMayChange) {
  const std::string saved =
      "[model]\ntype = \"gpt2\"\nn_head = 4\nlayer_norm_epsilon = 1e-05\n"
      "[train]\nseed = 1234\nmax_steps = 5\nglobal_batch_size = 8\n"
      "[optim]\nname = \"adamw\"\nlr = 0.001\nbeta2 = 0.999\n[eval]\nevery = 10\n";
  auto with = [](std::string t, const std::string& from, const std::string& to) {
    const auto p = t.find(from);
    EXPECT_NE(p, std::string::npos) << from;
    return t.replace(p, from.size(), to);
  };
  const std::string file = "ck/shard_00000-of-00001.h5";
  EXPECT_NO_THROW(check_resume_config(saved, saved, file));
  // Mutable keys: max_steps, lr, the whole [eval] section.
  const std::string mutated = with(with(with(saved, "max_steps = 5", "max_steps = 9"), "lr = 0.001", "lr = 0.0001"),
                                   "every = 10", "every = 3");
  EXPECT_NO_THROW(check_resume_config(saved, mutated, file));
  EXPECT_EQ(config_fingerprint(saved), config_fingerprint(mutated));
  EXPECT_TRUE(fsdp::resume_may_change("train.max_steps"));
  EXPECT_TRUE(fsdp::resume_may_change("eval.max_windows"));
  EXPECT_FALSE(fsdp::resume_may_change("train.seed"));
  EXPECT_FALSE(fsdp::resume_may_change("model.n_head"));
  // The key table's may-change flags, pinned: they decide every checkpoint's fingerprint, so a
  // change here makes existing checkpoints refuse to resume.
  for (const std::string type : {"gpt2", "t5"}) {
    std::set<std::string> may;
    for (const fsdp::KeyDescription& k :
         fsdp::describe_keys(fsdp::model_schema(fsdp::model_schemas(), type))) {
      EXPECT_EQ(k.resume_may_change, fsdp::resume_may_change(k.key)) << k.key;
      if (k.resume_may_change) may.insert(k.key);
    }
    EXPECT_EQ(may, (std::set<std::string>{
                       "model.init_from", "model.pad_vocab_multiple",
                       "model.fused_linear_cross_entropy",
                       "model.fused_linear_cross_entropy_chunk_rows", "data.path",
                       "data.paths", "data.weights", "data.attn_mask_type",
                       "data.reset_position_ids", "data.eos_token_id", "data.eod_mask_loss",
                       "train.micro_batch_size", "train.max_steps", "train.run_dir",
                       "train.log_every", "train.num_threads", "train.device", "train.cuda_graphs",
                       "train.skip_nonfinite", "train.check_memory", "train.peak_flops",
                       "train.profile_steps", "optim.lr", "optim.min_lr", "optim.lr_scheduler_type",
                       "optim.warmup_steps", "optim.decay_steps", "optim.num_decay_steps",
                       "optim.decay_type", "optim.grad_clip", "optim.moe_router_bias_update_rate",
                       "fsdp.sharding_strategy",
                       "fsdp.backward_prefetch", "fsdp.forward_prefetch",
                       "fsdp.limit_all_gathers", "fsdp.activation_checkpointing",
                       "fsdp.recompute_num_layers", "fsdp.cpu_offload",
                       "fsdp.offload_optimizer", "fsdp.offload_optimizer_ratio",
                       "fsdp.delayed_parameter_update", "fsdp.delayed_parameter_update_warmup_steps",
                       "mesh.shard_size", "comm.backend", "comm.timeout_s", "checkpoint.enable",
                       "checkpoint.every", "checkpoint.async_save", "checkpoint.save_total_limit",
                       "eval.every", "eval.max_windows", "eval.on_start"}))
        << type;
  }

  struct Case {
    std::string from, to, message;
  };
  for (const Case& c : std::vector<Case>{
           {"n_head = 4", "n_head = 8", "--resume: model.n_head differs (checkpoint has 4, config has 8) in " + file},
           {"1e-05", "1e-06", "--resume: model.layer_norm_epsilon differs (checkpoint has 1e-05, config has 1e-06)"},
           {"seed = 1234", "seed = 99", "--resume: train.seed differs (checkpoint has 1234, config has 99)"},
           {"global_batch_size = 8", "global_batch_size = 16", "train.global_batch_size differs (checkpoint has 8, config has 16)"},
           {"beta2 = 0.999", "beta2 = 0.95", "optim.beta2 differs (checkpoint has 0.999, config has 0.95)"},
           {"name = \"adamw\"", "name = \"sgd\"", "optim.name differs (checkpoint has 'adamw', config has 'sgd')"},
       }) {
    const std::string run = with(saved, c.from, c.to);
    expect_input_error([&] { check_resume_config(saved, run, file); }, {c.message});
    EXPECT_NE(config_fingerprint(saved), config_fingerprint(run)) << c.from;
  }
  // model.type is reported before the keys that follow from it.
  const std::string t5 = with(with(saved, "type = \"gpt2\"", "type = \"t5\""), "n_head = 4", "n_head = 8");
  expect_input_error([&] { check_resume_config(saved, t5, file); }, {"model.type differs (checkpoint has 'gpt2', config has 't5')"});
  // A key only one side has (another fsdp_train version) is not compared.
  EXPECT_NO_THROW(check_resume_config(saved, saved + "[data]\nseq_len = 64\n", file));
  expect_input_error([&] { check_resume_config("[model\n", saved, file); }, {file, "attribute train_config is not valid TOML"});
}
