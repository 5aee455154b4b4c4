// bench_profile_ranges: what one profiler range costs (docs/benchmarks.md "Profiler").
//
//   build/bench_profile_ranges [N] [ROUNDS] [DIR]      (defaults: 100000, 5, /tmp)
//
// Times N ProfileRange scopes (fsdp/core/profiler.hpp) in four cases and prints the median
// nanoseconds per range over ROUNDS:
//   null:       profiling off (the engine and trainer hold a null Profiler*);
//   idle:       a Profiler outside its window (recording() false);
//   static:     recording a range with a literal name (the trainer's "all_reduce wait loss");
//   unit:       recording a range named and described as the engine does
//               ("all_gather wait unit 3 (h.2)" + unit, unit_name, in/out bytes, dtype, ranks).
// Each recording round uses a fresh Profiler whose N events are then written as a trace into
// DIR (removed afterwards); the median write time per 1000 events and the file size are
// printed too. A training step records about 20 + 8 x units ranges (tools/bench_profiler.sh
// prints the count of a real run).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "fsdp/core/profiler.hpp"

using Clock = std::chrono::steady_clock;

namespace {

// Median over `rounds` of the ns per range of `body(i)` run n times.
template <class F>
double ns_per_range(int64_t n, int rounds, F&& body) {
  std::vector<double> ns;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) body(i);
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
                 static_cast<double>(n));
  }
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 100000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::string dir = argc > 3 ? argv[3] : "/tmp";
  if (n < 1 || rounds < 1) {
    std::fprintf(stderr, "usage: bench_profile_ranges [N >= 1] [ROUNDS >= 1] [DIR]\n");
    return 2;
  }
  const std::string unit_name = "h.2";
  volatile int64_t sink = 0;  // keeps the loops from being removed
  auto unit_range = [&](fsdp::Profiler* p, int64_t i) {
    fsdp::ProfileRange range(p, "collective");
    if (range) {
      range.name("all_gather wait unit " + std::to_string(i % 8) + " (" + unit_name + ")")
          .arg("unit", i % 8)
          .arg("unit_name", unit_name)
          .arg("in_bytes", int64_t{1} << 20)
          .arg("out_bytes", int64_t{1} << 21)
          .arg("dtype", std::string("bf16"))
          .arg("ranks", int64_t{2});
    }
    sink = sink + i;
  };
  const double null_ns = ns_per_range(n, rounds, [&](int64_t i) { unit_range(nullptr, i); });
  fsdp::Profiler idle(2, 2, 0, dir + "/bench_profile_ranges.idle.json");  // never in its window
  idle.begin_step(1);
  const double idle_ns = ns_per_range(n, rounds, [&](int64_t i) { unit_range(&idle, i); });

  // Recording: a fresh profiler per round, written afterwards.
  const std::string path = dir + "/bench_profile_ranges.trace.json";
  std::vector<double> write_ms;
  double bytes = 0;
  auto recording = [&](bool unit) {
    std::vector<double> ns;
    for (int r = 0; r < rounds; ++r) {
      fsdp::Profiler p(1, 1, 0, path);
      p.begin_step(1);
      ns.push_back(ns_per_range(n, 1, [&](int64_t i) {
        if (unit) {
          unit_range(&p, i);
        } else {
          fsdp::ProfileRange range(&p, "collective", "all_reduce wait loss");
          sink = sink + i;
        }
      }));
      p.end_step();
      const auto t0 = Clock::now();
      p.write();
      write_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      bytes = static_cast<double>(std::filesystem::file_size(path));
      std::filesystem::remove(path);
    }
    std::sort(ns.begin(), ns.end());
    return ns[ns.size() / 2];
  };
  const double static_ns = recording(false);
  const double unit_ns = recording(true);  // write_ms's later half: the unit ranges' traces
  std::vector<double> unit_write(write_ms.begin() + rounds, write_ms.end());
  std::sort(unit_write.begin(), unit_write.end());
  std::printf("ns per range (median of %d rounds of %lld): null %.1f, idle %.1f, static %.1f, "
              "unit %.1f\n",
              rounds, static_cast<long long>(n), null_ns, idle_ns, static_ns, unit_ns);
  std::printf("writing %lld unit ranges: %.1f ms (%.2f ms per 1000), %.2f MB (%.0f bytes each)\n",
              static_cast<long long>(n), unit_write[unit_write.size() / 2],
              1e3 * unit_write[unit_write.size() / 2] / static_cast<double>(n), bytes / 1e6,
              bytes / static_cast<double>(n));
  return 0;
}
