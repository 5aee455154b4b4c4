// Resharding on resume (docs/checkpoint.md "Resharding on resume"), run by ctest under mpirun
// at 1, 2 and 4 ranks.
//
// Reader tests (every rank on its own files): a checkpoint written with N shards and one unit
// layout is read back by ckpt::read_resharded for M shards and another layout, matched by
// parameter name; the values must be the saved ones bit for bit and the padding zero. A
// missing or renamed parameter and a shape mismatch are input errors naming the tensor; old
// shard files the new shard does not overlap are not read (a corrupted one goes unnoticed).
//
// Training tests: a run saved on the world communicator continues on one rank
// (runtime().self()) and back on the world (also with fsdp.cpu_offload on, off and on again
// for the three legs), and HYBRID_SHARD continues as FULL_SHARD; losses
// and final parameters match an uninterrupted run within 1e-5 relative (only the summation
// order of the reductions changes with the world size; attn.c_attn.bias within 1e-4, see
// expect_params_close).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/fsdp/flat_param.hpp"
#include "train_util.hpp"

namespace fs = std::filesystem;
using namespace fsdp;
using namespace test_util;

namespace {

ParamSpec spec(const std::string& name, std::vector<int64_t> shape) {
  ParamSpec p;
  p.name = name;
  p.shape = std::move(shape);
  return p;
}

// The value a parameter element holds in the test checkpoints: distinct per parameter,
// element and dataset.
float value_of(const std::string& name, int64_t i, int dataset) {
  float h = 0;
  for (char ch : name) h = h * 0.5f + static_cast<float>(ch) * 0.01f;
  return h + 0.001f * static_cast<float>(i) + 10.0f * static_cast<float>(dataset);
}

const std::vector<std::string> kDatasets = {"param", "exp_avg", "exp_avg_sq"};

// The parameters of the test model: 3 + 8 + 5 + 7 = 23 elements.
std::vector<ParamSpec> params() {
  return {spec("wte.weight", {1, 3}), spec("h.0.w", {2, 4}), spec("h.0.b", {5}), spec("ln_f.bias", {7})};
}

// Two units, "root" {wte.weight, ln_f.bias} and "h.0" {h.0.w, h.0.b}, for `shards` shards.
std::vector<FlatParamLayout> two_units(int64_t shards) {
  const auto p = params();
  return {FlatParamLayout::build("root", {p[0], p[3]}, shards),
          FlatParamLayout::build("h.0", {p[1], p[2]}, shards)};
}

// One unit holding everything (NO_WRAP), in another order.
std::vector<FlatParamLayout> one_unit(int64_t shards) {
  const auto p = params();
  return {FlatParamLayout::build("root", {p[2], p[0], p[3], p[1]}, shards)};
}

// The padded flat buffer of `l` for `dataset`: every parameter's values, 0 in the padding.
std::vector<float> full_flat(const FlatParamLayout& l, int dataset) {
  std::vector<float> v(static_cast<std::size_t>(l.padded_numel), 0.0f);
  for (const FlatEntry& e : l.entries)
    for (int64_t i = 0; i < e.spec.numel(); ++i) v[e.offset + i] = value_of(e.spec.name, i, dataset);
  return v;
}

// Writes a checkpoint of `layouts` (num_shards each) into `dir`; returns the directory.
std::string write_checkpoint(const std::string& dir, const std::vector<FlatParamLayout>& layouts) {
  const int n = static_cast<int>(layouts.front().num_shards);
  fs::create_directories(dir);
  std::vector<std::vector<std::vector<float>>> full;  // unit, dataset
  for (const auto& l : layouts) {
    full.emplace_back();
    for (int d = 0; d < 3; ++d) full.back().push_back(full_flat(l, d));
  }
  for (int s = 0; s < n; ++s) {
    ckpt::CheckpointMeta m;
    m.step = 2;
    m.world_size = n;
    m.shard_size = n;
    m.shard_index = s;
    m.optimizer = "adamw";
    m.model_config_json = "{}";
    m.train_config_toml = "";
    std::vector<ckpt::UnitShardView> views;
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      const int64_t b = layouts[u].shard_begin(s);
      ckpt::UnitShardView v{&layouts[u], full[u][0].data() + b, {}};
      v.state.push_back({"exp_avg", full[u][1].data() + b});
      v.state.push_back({"exp_avg_sq", full[u][2].data() + b});
      views.push_back(std::move(v));
    }
    ckpt::write_shard_file((fs::path(dir) / ckpt::shard_file_name(s, n)).string(), m, views);
  }
  return dir;
}

class ReshardReader : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("fsdp_test_reshard_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

template <class F>
void expect_input_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected fsdp::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitInputError) << e.what();
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg << "\n  lacks: " << n;
  }
}

// Reads every new shard of `to` from `set` and compares with the expected flat buffers.
void expect_resharded(const ckpt::CheckpointSet& set, const std::vector<FlatParamLayout>& to) {
  for (const FlatParamLayout& l : to) {
    for (int d = 0; d < 3; ++d) {
      const std::vector<float> want = full_flat(l, d);
      for (int64_t s = 0; s < l.num_shards; ++s) {
        std::vector<float> got(static_cast<std::size_t>(l.shard_numel), -1.0f);
        ckpt::read_resharded(set, l, s, kDatasets[d], got.data());
        for (int64_t i = 0; i < l.shard_numel; ++i)
          ASSERT_EQ(got[i], want[l.shard_begin(s) + i])
              << l.unit_name << " " << kDatasets[d] << " shard " << s << "/" << l.num_shards << " element " << i;
      }
    }
  }
}

TEST_F(ReshardReader, DifferentShardCountsSameUnits) {
  for (int64_t from : {1, 2, 3, 4}) {
    const auto set = ckpt::CheckpointSet::open(write_checkpoint(path("from" + std::to_string(from)), two_units(from)));
    for (int64_t to : {1, 2, 3, 4, 5}) {
      SCOPED_TRACE(std::to_string(from) + " -> " + std::to_string(to));
      const auto layouts = two_units(to);
      EXPECT_EQ(ckpt::same_layouts(set.layouts(), layouts), from == to);
      expect_resharded(set, layouts);
    }
  }
}

TEST_F(ReshardReader, DifferentWrapPolicyAndPadding) {
  // Two units on 4 shards -> one unit on 3 (numel 23, padded to 24: one padding element)
  // and back; each parameter lands at its new offset, padding is 0.
  const auto set = ckpt::CheckpointSet::open(write_checkpoint(path("two"), two_units(4)));
  const auto one = one_unit(3);
  ASSERT_EQ(one[0].padded_numel - one[0].numel, 1);
  EXPECT_FALSE(ckpt::same_layouts(set.layouts(), one));
  expect_resharded(set, one);
  std::vector<float> last(static_cast<std::size_t>(one[0].shard_numel), -1.0f);
  ckpt::read_resharded(set, one[0], 2, "param", last.data());
  EXPECT_EQ(last.back(), 0.0f);  // the padding element
  EXPECT_EQ(last[last.size() - 2], value_of("h.0.w", 7, 0));  // the last parameter element

  const auto set1 = ckpt::CheckpointSet::open(write_checkpoint(path("one"), one_unit(2)));
  expect_resharded(set1, two_units(4));
}

TEST_F(ReshardReader, MissingOrRenamedParameter) {
  const auto set = ckpt::CheckpointSet::open(write_checkpoint(path("ck"), two_units(2)));
  auto renamed = two_units(2);
  renamed[1].entries[1].spec.name = "h.0.bias";
  std::vector<float> out(static_cast<std::size_t>(renamed[1].shard_numel));
  expect_input_error([&] { ckpt::read_resharded(set, renamed[1], 0, "param", out.data()); },
                     {path("ck"), "parameter h.0.bias (unit h.0) is missing from the checkpoint"});
  // An optimizer-state dataset the checkpoint does not hold names the file and dataset.
  const auto layouts = two_units(3);
  std::vector<float> x(static_cast<std::size_t>(layouts[0].shard_numel));
  expect_input_error([&] { ckpt::read_resharded(set, layouts[0], 0, "momentum_buffer", x.data()); },
                     {"shard_0000", "momentum_buffer"});
}

TEST_F(ReshardReader, ShapeMismatchNamesBothShapes) {
  const auto set = ckpt::CheckpointSet::open(write_checkpoint(path("ck"), two_units(2)));
  auto p = params();
  p[1].shape = {4, 2};  // same numel, other shape
  const FlatParamLayout l = FlatParamLayout::build("h.0", {p[1], p[2]}, 3);
  std::vector<float> out(static_cast<std::size_t>(l.shard_numel));
  expect_input_error([&] { ckpt::read_resharded(set, l, 1, "param", out.data()); },
                     {path("ck"), "parameter h.0.w: shape [2,4] in the checkpoint (unit h.0) differs from the run's [4,2]"});
}

// Overwrites element `index` of a 1-D float dataset (the stored checksum then mismatches).
void raw_write_element(const std::string& file, const std::string& ds, hsize_t index, float v) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t d = H5Dopen2(f, ds.c_str(), H5P_DEFAULT);
  ASSERT_GE(d, 0);
  const hid_t space = H5Dget_space(d);
  const hsize_t one = 1;
  H5Sselect_hyperslab(space, H5S_SELECT_SET, &index, nullptr, &one, nullptr);
  const hid_t ms = H5Screate_simple(1, &one, nullptr);
  EXPECT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, ms, space, H5P_DEFAULT, &v), 0);
  H5Sclose(ms);
  H5Sclose(space);
  H5Dclose(d);
  H5Fclose(f);
}

TEST_F(ReshardReader, ReadsOnlyTheOldShardsItNeeds) {
  // Old: 2 shards; unit root holds 10 elements, 5 per shard. Old shard 1's root param is
  // corrupted. New: 4 shards of 3: new shard 0 ([0, 3)) lies in old shard 0 only, so it
  // loads; new shard 3 ([9, 12)) needs old shard 1, whose verification fails naming it.
  const std::string ck = write_checkpoint(path("ck"), two_units(2));
  const std::string bad = (fs::path(ck) / ckpt::shard_file_name(1, 2)).string();
  raw_write_element(bad, "/units/0/param", 0, 42.0f);
  const auto set = ckpt::CheckpointSet::open(ck);
  const auto l = two_units(4)[0];
  std::vector<float> out(static_cast<std::size_t>(l.shard_numel), -1.0f);
  ckpt::read_resharded(set, l, 0, "param", out.data());
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(out[i], value_of("wte.weight", i, 0));
  expect_input_error([&] { ckpt::read_resharded(set, l, 3, "param", out.data()); },
                     {bad, "tensor /units/0/param (unit root)", "checksum mismatch"});
}

TEST_F(ReshardReader, RepadsAVocabularyTensorByName) {
  // model.pad_vocab_multiple changed on resume: the checkpoint's wte.weight [2, 3] (vocab 2,
  // unpadded) read into a layout of wte [4, 3] with vocab_rows 2, at 1..4 new shards: the two
  // model rows come from the file, the pad rows are 0; and back from a padded [4, 3] into
  // [2, 3]. A different row width, or fewer stored rows than vocab_rows, is still an error.
  auto with_wte = [](std::vector<int64_t> shape, int64_t vocab_rows, int64_t shards) {
    ParamSpec w = spec("wte.weight", std::move(shape));
    w.vocab_rows = vocab_rows;
    return std::vector<FlatParamLayout>{FlatParamLayout::build("root", {w, spec("ln_f.bias", {7})}, shards),
                                        FlatParamLayout::build("h.0", {spec("h.0.w", {2, 4}), spec("h.0.b", {5})}, shards)};
  };
  const auto unpadded = ckpt::CheckpointSet::open(write_checkpoint(path("v2"), with_wte({2, 3}, 0, 2)));
  const auto padded = ckpt::CheckpointSet::open(write_checkpoint(path("v4"), with_wte({4, 3}, 0, 3)));
  for (int64_t m = 1; m <= 4; ++m) {
    for (int from_padded = 0; from_padded < 2; ++from_padded) {
      const auto& set = from_padded ? padded : unpadded;
      const auto layouts = with_wte(from_padded ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{4, 3}, 2, m);
      for (const std::string& ds : kDatasets) {
        const int d = static_cast<int>(&ds - kDatasets.data());
        std::vector<float> flat;
        for (int64_t s = 0; s < m; ++s) {
          std::vector<float> out(static_cast<std::size_t>(layouts[0].shard_numel), -1.0f);
          ckpt::read_resharded(set, layouts[0], s, ds, out.data());
          flat.insert(flat.end(), out.begin(), out.end());
        }
        const FlatEntry& w = layouts[0].entries[0];
        for (int64_t i = 0; i < w.spec.numel(); ++i) {
          const float want = i < 6 ? value_of("wte.weight", i, d) : 0.0f;
          ASSERT_EQ(flat[static_cast<std::size_t>(w.offset + i)], want) << "m " << m << " " << ds << " element " << i;
        }
        const FlatEntry& b = layouts[0].entries[1];
        for (int64_t i = 0; i < 7; ++i) ASSERT_EQ(flat[static_cast<std::size_t>(b.offset + i)], value_of("ln_f.bias", i, d));
      }
    }
  }
  std::vector<float> out(64);
  expect_input_error([&] { ckpt::read_resharded(unpadded, with_wte({4, 4}, 2, 1)[0], 0, "param", out.data()); },
                     {"parameter wte.weight: shape [2,3] in the checkpoint (unit root) differs from the run's [4,4]"});
  expect_input_error([&] { ckpt::read_resharded(unpadded, with_wte({4, 3}, 3, 1)[0], 0, "param", out.data()); },
                     {"parameter wte.weight: shape [2,3]", "differs from the run's [4,3]"});
  // Without vocab_rows a row-count difference is a shape mismatch, as before.
  expect_input_error([&] { ckpt::read_resharded(unpadded, with_wte({4, 3}, 0, 1)[0], 0, "param", out.data()); },
                     {"parameter wte.weight: shape [2,3]", "differs from the run's [4,3]"});
}

// ---- training ----

// Copies run_dir/checkpoints of `from` into a fresh run_dir `to` (no metrics, no lock).
void copy_checkpoints(const std::string& from, const std::string& to) {
  fs::remove_all(to);
  fs::create_directories(to);
  fs::copy(fs::path(from) / "checkpoints", fs::path(to) / "checkpoints", fs::copy_options::recursive);
}

void expect_close(const TrainResult& got, const TrainResult& ref, std::size_t first_step, const std::string& what) {
  for (std::size_t i = 0; i < got.losses.size(); ++i) {
    const double r = ref.losses.at(first_step + i);
    EXPECT_LE(std::abs(got.losses[i] - r), 1e-5 * std::abs(r)) << what << " step " << first_step + i + 1;
  }
}

// All parameters together within 1e-5, and each tensor within 1e-5 too, except
// attn.c_attn.bias within 1e-4: as in tests/test_fsdp.cpp, its key part has an exactly-zero
// gradient (softmax is shift invariant), so its AdamW updates are normalised rounding noise
// that depends on the summation order, i.e. on the world size.
void expect_params_close(const TrainResult& got, const TrainResult& ref, const std::string& what) {
  ASSERT_EQ(got.params.size(), ref.params.size());
  std::vector<float> all_got, all_ref;
  for (const auto& [name, values] : ref.params) {
    ASSERT_TRUE(got.params.count(name)) << name;
    const auto& g = got.params.at(name);
    all_got.insert(all_got.end(), g.begin(), g.end());
    all_ref.insert(all_ref.end(), values.begin(), values.end());
    const bool noisy = name.find("attn.c_attn.bias") != std::string::npos;
    EXPECT_LE(rel_diff(g, values), noisy ? 1e-4 : 1e-5) << what << " " << name;
  }
  EXPECT_LE(rel_diff(all_got, all_ref), 1e-5) << what;
}

// Steps 1-2 on the world, 3-4 on one rank, 5-6 on the world again, each leg resumed from the
// previous one's checkpoint, with fsdp.cpu_offload = offload[leg] (checkpoints do not depend
// on it); the uninterrupted one-rank run is the reference.
void world_to_one_rank_and_back(const std::array<bool, 3>& offload, const std::string& tag) {
  // Reference: 6 uninterrupted FULL_SHARD steps on one rank (each rank its own).
  Config c = small_config(fresh_dir("ref" + tag) + "/rank" + std::to_string(test_util::world_rank()));
  c.train.max_steps = 6;
  c.checkpoint.every = 2;
  const TrainResult ref = run(c, On::self);
  ASSERT_EQ(ref.losses.size(), 6u);

  // Steps 1-2 on the world (shard_size = world size), saved at 2.
  c.train.run_dir = fresh_dir("world_a" + tag);
  c.fsdp.cpu_offload = offload[0];
  const TrainResult a = run(c, On::world, /*stop_after=*/2);
  ASSERT_EQ(a.losses.size(), 2u);
  expect_close(a, ref, 0, "world" + tag);
  MPI_Barrier(MPI_COMM_WORLD);

  // Steps 3-4 on one rank (each rank on its own copy of the checkpoint), saved at 4.
  const std::string self_dir = fresh_dir("self" + tag) + "/rank" + std::to_string(test_util::world_rank());
  copy_checkpoints(c.train.run_dir, self_dir);
  c.train.run_dir = self_dir;
  c.fsdp.cpu_offload = offload[1];
  const TrainResult b = run(c, On::self, /*stop_after=*/4, /*resume=*/true);
  ASSERT_EQ(b.losses.size(), 2u);
  expect_close(b, ref, 2, "one rank" + tag);

  // Steps 5-6 back on the world, from rank 0's step-4 checkpoint.
  const std::string world_b = fresh_dir("world_b" + tag);
  if (test_util::world_rank() == 0) copy_checkpoints(self_dir, world_b);
  MPI_Barrier(MPI_COMM_WORLD);
  c.train.run_dir = world_b;
  c.fsdp.cpu_offload = offload[2];
  const TrainResult d = run(c, On::world, 0, /*resume=*/true);
  ASSERT_EQ(d.losses.size(), 2u);
  EXPECT_EQ(d.final_step, 6);
  expect_close(d, ref, 4, "world again" + tag);
  expect_params_close(d, ref, "final" + tag);
}

TEST(ReshardResume, WorldToOneRankAndBack) { world_to_one_rank_and_back({false, false, false}, ""); }

// issue 22: an offloaded run resumes without offload on another world size, and back.
TEST(ReshardResume, OffloadedWorldToOneRankWithoutOffloadAndBack) {
  world_to_one_rank_and_back({true, false, true}, " (offload on, off, on)");
}

TEST(ReshardResume, HybridToFullShard) {
  Config c = small_config(fresh_dir("hybrid_ref") + "/rank" + std::to_string(test_util::world_rank()));
  c.train.max_steps = 4;
  c.checkpoint.every = 2;
  const TrainResult ref = run(c, On::self);

  c.train.run_dir = fresh_dir("hybrid");
  c.fsdp.sharding_strategy = ShardingStrategy::HYBRID_SHARD;
  c.mesh.shard_size = std::min(2, world_size());
  const TrainResult a = run(c, On::world, /*stop_after=*/2);
  ASSERT_EQ(a.losses.size(), 2u);
  expect_close(a, ref, 0, "hybrid");
  c.fsdp.sharding_strategy = ShardingStrategy::FULL_SHARD;
  c.mesh.shard_size = 0;
  const TrainResult b = run(c, On::world, 0, /*resume=*/true);
  ASSERT_EQ(b.losses.size(), 2u);
  expect_close(b, ref, 2, "full shard");
  expect_params_close(b, ref, "final");
}

}  // namespace
