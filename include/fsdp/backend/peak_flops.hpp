// fsdp/backend/peak_flops.hpp: a device's peak FLOP/s, the denominator of MFU (model FLOPs
// utilisation, PaLM: Chowdhery et al. 2022, appendix B).
//
// GPUs: NVIDIA's published dense (no 2:4 sparsity) peaks, by device name, for the dtype the
// matrix multiplies run in: bf16/fp16 tensor-core peaks for param_dtype bf16/fp16, the fp32
// (non-tensor-core) peak for fp32, since the CUDA backend's GEMMs compute in fp32 without
// TF32 (src/cuda/kernels_gemm.cpp). torchtitan's get_peak_flops keeps the same kind of table.
// CPUs have no published per-part table we can match; the peak is estimated as
// threads x clock x fp32 FLOP per cycle per core from the instruction set (two 256-bit FMA
// pipes: 32; Intel AVX-512 and AMD Zen 5 with two 512-bit FMA pipes: 64; the CPU backend
// computes in fp32 whatever the param_dtype). The clock is cpufreq's cpuinfo_max_freq where
// the kernel exposes it, else the clock measured by a chain of dependent adds (a VM reports
// its nominal clock while the core boosts). train.peak_flops overrides both.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fsdp/core/dtype.hpp"

namespace fsdp {

struct PeakFlops {
  double flops_per_s = 0;  // per rank: its GPU (shared: its share), or its CPU cores
  std::string source;      // how it was found, for the banner: "NVIDIA H100 80GB HBM3 bf16 dense"
};

// The published dense peak of the NVIDIA GPU called `device_name` (cudaDeviceProp::name)
// when matrix multiplies run in `compute_dtype`; nullopt for a device not in the table
// (H100 SXM/PCIe/NVL, H200, GH200, A100, L40S).
std::optional<PeakFlops> gpu_peak_flops(const std::string& device_name, DType compute_dtype);

// What the CPU peak is estimated from (read_cpu_info() on Linux).
struct CpuInfo {
  std::string vendor;              // /proc/cpuinfo vendor_id: "GenuineIntel", "AuthenticAMD"
  int family = 0;                  // "cpu family" (AMD Zen 5: 26)
  std::vector<std::string> flags;  // "flags"
  double mhz = 0;                  // max clock, MHz (0: unknown)
  std::string clock_source;        // "cpuinfo_max_freq", "measured" or "cpu MHz"
};
// This machine's: the first processor's /proc/cpuinfo entry, and the clock from
// /sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq (kHz) when present (the maximum
// boost), else measure_cpu_clock_mhz() when plausible_clock_mhz, else /proc/cpuinfo's "cpu MHz". Fields stay empty / 0
// where nothing is known.
CpuInfo read_cpu_info();

// The clock this thread runs at now, MHz: the fastest of 8 timed chains of 4e5 dependent
// 64-bit multiplies of 3 cycles each (about 10 ms in all at 1 GHz). Virtual machines show no
// cpufreq and report their nominal clock in /proc/cpuinfo while the core runs at its boost
// clock (on this project's CI: 2.60 GHz reported, 3.69 GHz measured). 0 on other than x86-64.
double measure_cpu_clock_mhz();
// Whether a measured clock is one a CPU runs at (400 MHz .. 7 GHz); read_cpu_info keeps
// /proc/cpuinfo's "cpu MHz" instead of an implausible measurement.
bool plausible_clock_mhz(double mhz);

// cores x mhz x FLOP per cycle per core (see the header comment); nullopt when the clock is
// unknown, cores <= 0, or the CPU has no AVX2 + FMA (no entry for older vector units).
// `cores`: the physical cores one rank computes on, min(its threads, the node's cores / its
// ranks), fractional when ranks oversubscribe the node.
std::optional<PeakFlops> cpu_peak_flops(const CpuInfo& cpu, double cores);

}  // namespace fsdp
