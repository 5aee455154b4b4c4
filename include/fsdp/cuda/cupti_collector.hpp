// fsdp/cuda/cupti_collector.hpp: the profiler's device activity on the CUDA backend, from
// CUPTI's Activity API (what torch.profiler's Kineto collects): every kernel
// (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, so kernels still overlap), memcpy and memset run on
// any stream of the process between start() and stop(), as TraceEvents on the stream's
// track (fsdp/core/profiler.hpp):
//   kernel:  name demangled; cat "kernel"; args correlation (CUPTI's correlation id, which
//            ties the kernel to its launch), device, context, stream, grid [x, y, z],
//            block [x, y, z], registers per thread, shared memory (bytes, static + dynamic);
//   memcpy:  "Memcpy HtoD (Pinned -> Device)"; cat "gpu_memcpy"; args correlation, device,
//            context, stream, bytes, memory bandwidth (GB/s);
//   memset:  "Memset (Device)"; cat "gpu_memset"; args correlation, device, context, stream,
//            bytes.
// Timestamps are on Profiler::now_ns()'s clock: CUPTI is given that clock
// (cuptiActivityRegisterTimestampCallback) before any activity is enabled; where it refuses,
// the offset between cuptiGetTimestamp and the steady clock, measured at start() and stop()
// and averaged, is subtracted.
//
// CUPTI hands records to process-wide callbacks without a user pointer, so one collector at a
// time may be started in a process (a second start() throws fsdp::Error). stop() synchronizes
// the current device, disables the activity kinds and flushes every buffer
// (cuptiActivityFlushAll(FLUSH_FORCED)); records the buffers could not hold are counted in
// dropped_records(). Buffers: 8 MiB each, allocated as CUPTI asks and freed once read.
//
// Only built where CMake found libcupti (FSDP_WITH_CUPTI); make_cupti_collector() then returns
// the collector, else null (the trace then holds host ranges only).
#pragma once

#include <memory>

#include "fsdp/core/profiler.hpp"

namespace fsdp::cuda {

// A CUPTI activity collector (see above), or null without CUPTI. Does not touch CUPTI
// before start().
std::unique_ptr<ActivityCollector> make_cupti_collector();

}  // namespace fsdp::cuda
