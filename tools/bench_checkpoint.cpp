// bench_checkpoint: what checkpoint integrity costs (docs/benchmarks.md "Checkpoint checksums").
//
//   build/bench_checkpoint [DIR] [MB] [ROUNDS]      (defaults: /tmp, 100, 5)
//
// Writes a shard file of MB megabytes (one unit: param, exp_avg, exp_avg_sq, MB/3 each)
// ROUNDS times each way, alternating: with fsdp::ckpt::write_shard_file (finiteness scan +
// XXH3-64 checksums) and "raw": the same three datasets written with the same HDF5 wrapper
// and the same AtomicFile commit (fsync, rename, directory fsync), but no scan and no
// checksums. Also times the integrity pass alone
// (first_nonfinite + checksum_hex, two passes: an upper bound of the save's fused pass) and
// the verified read (read_unit of every dataset). Prints medians.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/core/atomic_file.hpp"
#include "fsdp/h5/hdf5.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp";
  const double mb = argc > 2 ? std::stod(argv[2]) : 100.0;
  const int rounds = argc > 3 ? std::stoi(argv[3]) : 5;
  const int64_t n = static_cast<int64_t>(mb * 1e6 / 4 / 3);  // floats per dataset

  fsdp::FlatParamLayout l;
  l.unit_name = "h.0";
  fsdp::FlatEntry e;
  e.spec.name = "h.0.w";
  e.spec.shape = {n};
  l.entries.push_back(e);
  l.numel = l.padded_numel = l.shard_numel = n;
  l.num_shards = 1;
  std::vector<std::vector<float>> bufs(3, std::vector<float>(static_cast<std::size_t>(n)));
  for (int b = 0; b < 3; ++b)
    for (int64_t i = 0; i < n; ++i) bufs[b][i] = 1e-3f * static_cast<float>((i * 7919 + b) % 100003) - 50.0f;
  fsdp::ckpt::UnitShardView v{&l, bufs[0].data(), {{"exp_avg", bufs[1].data()}, {"exp_avg_sq", bufs[2].data()}}};
  fsdp::ckpt::CheckpointMeta meta;
  meta.optimizer = "adamw";
  const std::string path = (fs::path(dir) / "bench_checkpoint_shard.h5").string();

  // The save without integrity work: the same datasets through the same HDF5 wrapper and
  // the same fsdp::AtomicFile commit (file fsync, rename, directory fsync), no scan and no
  // checksums: what write_shard_file costs minus format version 2's integrity work.
  auto raw_save = [&] {
    fsdp::AtomicFile out(path + ".raw");
    out.write([&](const std::string& tmp) {
      fsdp::h5::File f = fsdp::h5::File::create(tmp);
      f.create_group("/units/0");
      const std::vector<hsize_t> shape{static_cast<hsize_t>(n)};
      f.write_f32("/units/0/param", bufs[0].data(), shape);
      f.write_f32("/units/0/exp_avg", bufs[1].data(), shape);
      f.write_f32("/units/0/exp_avg_sq", bufs[2].data(), shape);
      f.close();
    });
  };

  std::vector<double> save, raw, integrity, load;
  for (int r = 0; r < rounds; ++r) {
    // Alternate which goes first, so page-cache writeback of the previous file weighs on both.
    auto t0 = Clock::now();
    for (int k = 0; k < 2; ++k) {
      t0 = Clock::now();
      if ((r + k) % 2 == 0) {
        raw_save();
        raw.push_back(ms_since(t0));
      } else {
        fsdp::ckpt::write_shard_file(path, meta, {v});
        save.push_back(ms_since(t0));
      }
    }

    t0 = Clock::now();
    int64_t bad = 0;
    std::string sums;
    for (const auto& b : bufs) {
      bad += fsdp::ckpt::first_nonfinite(b.data(), n);
      sums += fsdp::ckpt::checksum_hex(b.data(), n);
    }
    integrity.push_back(ms_since(t0));
    if (bad != -3 || sums.size() != 48) return 1;

    const auto sf = fsdp::ckpt::ShardFile::open(path);
    std::vector<float> out(static_cast<std::size_t>(n));
    t0 = Clock::now();
    for (const char* d : {"param", "exp_avg", "exp_avg_sq"}) sf.read_unit(0, d, out.data());
    load.push_back(ms_since(t0));
  }
  fs::remove(path);
  fs::remove(path + ".raw");
  const double bytes = 3.0 * 4.0 * static_cast<double>(n);
  std::printf("shard %.1f MB in %s, %d rounds (medians)\n", bytes / 1e6, dir.c_str(), rounds);
  std::printf("save with checksums (write_shard_file, incl. fsync): %8.1f ms (min %.1f)\n", median(save),
              *std::min_element(save.begin(), save.end()));
  std::printf("save without (same datasets, same fsync):           %8.1f ms (min %.1f)\n", median(raw),
              *std::min_element(raw.begin(), raw.end()));
  std::printf("integrity pass alone (scan + XXH3-64, 2 passes):    %8.1f ms = %.2f%% of the save (%.1f GB/s)\n",
              median(integrity), 100.0 * median(integrity) / median(save), bytes / median(integrity) / 1e6);
  std::printf("verified load (read_unit x 3):                      %8.1f ms\n", median(load));
  return 0;
}
