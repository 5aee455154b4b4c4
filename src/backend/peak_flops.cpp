// Peak FLOP/s of GPUs (a table) and CPUs (an estimate); see fsdp/backend/peak_flops.hpp.
#include "fsdp/backend/peak_flops.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace fsdp {

namespace {
bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }
}  // namespace

std::optional<PeakFlops> gpu_peak_flops(const std::string& name, DType dtype) {
  // {name test, dense bf16/fp16 tensor FLOP/s, fp32 FLOP/s}, from NVIDIA's data sheets
  // (their sparse figures halved). Order matters: the more specific names first.
  struct Row {
    const char* label;
    bool (*match)(const std::string&);
    double half, fp32;
  };
  static const Row kRows[] = {
      {"H100 NVL", [](const std::string& n) { return contains(n, "H100") && contains(n, "NVL"); },
       835e12, 60e12},
      {"H100 PCIe", [](const std::string& n) { return contains(n, "H100") && contains(n, "PCIe"); },
       756e12, 51e12},
      {"H100 SXM", [](const std::string& n) { return contains(n, "H100"); }, 989.4e12, 66.9e12},
      {"H200", [](const std::string& n) { return contains(n, "H200"); }, 989.4e12, 66.9e12},
      {"A100", [](const std::string& n) { return contains(n, "A100"); }, 312e12, 19.5e12},
      {"L40S", [](const std::string& n) { return contains(n, "L40S"); }, 362e12, 91.6e12},
  };
  for (const Row& r : kRows) {
    if (!r.match(name)) continue;
    const bool half = dtype == DType::bf16 || dtype == DType::f16;
    std::ostringstream os;
    os << name << " (" << r.label << ") " << (half ? to_string(dtype) : "fp32")
       << " dense peak, published";
    return PeakFlops{half ? r.half : r.fp32, os.str()};
  }
  return std::nullopt;
}

CpuInfo read_cpu_info() {
  CpuInfo info;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) break;  // the first processor only
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "vendor_id") {
      info.vendor = value;
    } else if (key == "cpu family") {
      info.family = std::atoi(value.c_str());
    } else if (key == "flags") {
      std::istringstream words(value);
      for (std::string w; words >> w;) info.flags.push_back(w);
    } else if (key == "cpu MHz") {
      info.mhz = std::atof(value.c_str());
      info.clock_source = "cpu MHz";
    }
  }
  std::ifstream max_freq("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
  double khz = 0;
  if (max_freq >> khz && khz > 0) {
    info.mhz = khz / 1000.0;
    info.clock_source = "cpuinfo_max_freq";
  } else if (const double mhz = measure_cpu_clock_mhz(); plausible_clock_mhz(mhz)) {
    info.mhz = mhz;
    info.clock_source = "measured";
  }
  // else: /proc/cpuinfo's "cpu MHz" (kept above), the nominal clock a VM reports.
  return info;
}

bool plausible_clock_mhz(double mhz) { return mhz >= 400 && mhz <= 7000; }

double measure_cpu_clock_mhz() {
#if defined(__x86_64__)
  // A chain of dependent 64-bit integer multiplies: 3 cycles each on every x86-64 core of
  // the last fifteen years (Intel since Core 2, AMD since K8, Zen included; Agner Fog's
  // instruction tables), and, unlike a chain of adds of an immediate, not something a core
  // can fold or eliminate (adds measured 16 GHz on a VM: issue 29). The loop's counter and
  // branch issue beside it. The fastest of a few ~1 ms trials is the one no other process
  // interrupted.
  using Clock = std::chrono::steady_clock;
  constexpr long kIters = 100000;  // 4 multiplies of 3 cycles each: 1.2e6 cycles
  double best = 0;
  for (int trial = 0; trial < 8; ++trial) {
    uint64_t x = static_cast<uint64_t>(trial) | 3;
    const auto t0 = Clock::now();
    for (long i = 0; i < kIters; ++i) {
      asm volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x));
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0) best = std::max(best, 12.0 * kIters / s / 1e6);
  }
  return best;
#else
  return 0;
#endif
}

std::optional<PeakFlops> cpu_peak_flops(const CpuInfo& cpu, double cores) {
  auto has = [&](const char* f) {
    return std::find(cpu.flags.begin(), cpu.flags.end(), f) != cpu.flags.end();
  };
  if (cpu.mhz <= 0 || !(cores > 0) || !(has("avx2") && has("fma"))) return std::nullopt;
  // Two FMA pipes per core: 2 x 8 lanes x 2 FLOP with 256-bit units (AMD Zen 2-4 run
  // AVX-512 on them too), 2 x 16 x 2 with 512-bit units (Intel AVX-512, AMD Zen 5).
  const bool wide = has("avx512f") && (cpu.vendor == "GenuineIntel" ||
                                       (cpu.vendor == "AuthenticAMD" && cpu.family >= 26));
  const int per_cycle = wide ? 64 : 32;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.3g core%s x %.2f GHz (%s) x %d fp32 FLOP/cycle, estimated",
                cores, cores == 1 ? "" : "s", cpu.mhz / 1000.0, cpu.clock_source.c_str(),
                per_cycle);
  return PeakFlops{cores * cpu.mhz * 1e6 * per_cycle, buf};
}

}  // namespace fsdp
