// CUPTI activity collection for the profiler (see fsdp/cuda/cupti_collector.hpp). The only
// file that calls CUPTI.
#include "fsdp/cuda/cupti_collector.hpp"

#ifdef FSDP_WITH_CUPTI

#include <cupti.h>
#include <cxxabi.h>

#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/core/process.hpp"
#include "fsdp/cuda/check.hpp"

namespace fsdp::cuda {
namespace {

[[noreturn]] void throw_cupti_error(CUptiResult code, const char* call, const char* file, int line) {
  const char* message = nullptr;
  if (cuptiGetResultString(code, &message) != CUPTI_SUCCESS || !message) message = "unknown error";
  std::ostringstream os;
  os << "CUPTI error in " << call << " at " << file << ":" << line << " (" << fsdp::where()
     << "): " << message;
  throw Error(os.str());
}

#define FSDP_CHECK_CUPTI(call)                                                      \
  do {                                                                              \
    CUptiResult fsdp_cupti_rc_ = (call);                                            \
    if (fsdp_cupti_rc_ != CUPTI_SUCCESS)                                            \
      throw_cupti_error(fsdp_cupti_rc_, #call, __FILE__, __LINE__);                 \
  } while (0)

constexpr std::size_t kBufferBytes = std::size_t{8} << 20;
constexpr std::size_t kBufferAlign = 8;  // CUPTI's record alignment
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

uint64_t CUPTIAPI steady_timestamp() { return static_cast<uint64_t>(Profiler::now_ns()); }

// CUPTI clock minus the steady clock, nanoseconds (the steady reads bracket CUPTI's).
int64_t clock_offset() {
  const int64_t before = Profiler::now_ns();
  uint64_t cupti = 0;
  FSDP_CHECK_CUPTI(cuptiGetTimestamp(&cupti));
  const int64_t after = Profiler::now_ns();
  return static_cast<int64_t>(cupti) - (before + after) / 2;
}

const char* memcpy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return "HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return "AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA: return "AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD: return "AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return "DtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "Unknown";
  }
}

const char* memory_kind(unsigned kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE: return "Pageable";
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED: return "Pinned";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE: return "Device";
    case CUPTI_ACTIVITY_MEMORY_KIND_ARRAY: return "Array";
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED: return "Managed";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC: return "Device Static";
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC: return "Managed Static";
    default: return "Unknown";
  }
}

class CuptiCollector;
// CUPTI's buffer callbacks carry no user pointer: the collector started in this process.
std::mutex g_mutex;
CuptiCollector* g_active = nullptr;

class CuptiCollector final : public ActivityCollector {
 public:
  ~CuptiCollector() override {
    if (!started_ || stopped_) return;
    try {
      std::vector<TraceEvent> unused;
      stop(unused);
    } catch (...) {
    }
  }

  void start() override {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_active) throw Error("profiler: CUPTI is already collecting for another profiler in this process");
      g_active = this;
    }
    started_ = true;
    FSDP_CHECK_CUPTI(cuptiActivityRegisterCallbacks(&buffer_requested, &buffer_completed));
    // Our clock for every timestamp, registered before any kind is enabled (CUPTI's rule);
    // a CUPTI that refuses keeps its own clock and the offset is measured instead.
    own_clock_ = cuptiActivityRegisterTimestampCallback(&steady_timestamp) == CUPTI_SUCCESS;
    offset_ns_ = own_clock_ ? 0 : clock_offset();
    for (CUpti_ActivityKind kind : kKinds) FSDP_CHECK_CUPTI(cuptiActivityEnable(kind));
  }

  void stop(std::vector<TraceEvent>& out) override {
    if (!started_ || stopped_) return;
    stopped_ = true;
    struct Release {  // the process's collector slot, whatever happens below
      CuptiCollector* self;
      ~Release() {
        std::lock_guard<std::mutex> lock(g_mutex);
        if (g_active == self) g_active = nullptr;
      }
    } release{this};
    FSDP_CHECK_CUDA(cudaDeviceSynchronize());
    for (CUpti_ActivityKind kind : kKinds) FSDP_CHECK_CUPTI(cuptiActivityDisable(kind));
    FSDP_CHECK_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    const int64_t offset = own_clock_ ? 0 : (offset_ns_ + clock_offset()) / 2;
    std::lock_guard<std::mutex> lock(g_mutex);
    for (TraceEvent& e : events_) {
      e.start_ns -= offset;
      out.push_back(std::move(e));
    }
    events_.clear();
  }

  int64_t dropped_records() const override { return dropped_; }

 private:
  static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0;  // as many as fit
  }

  static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer,
                                        size_t /*size*/, size_t valid) {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_active) g_active->take(context, stream, buffer, valid);
    }
    std::free(buffer);
  }

  // Converts the records of one buffer (on CUPTI's thread or in the flush; g_mutex held).
  // Never throws: a record that cannot be stored counts as dropped.
  void take(CUcontext context, uint32_t stream, uint8_t* buffer, size_t valid) noexcept {
    CUpti_Activity* record = nullptr;
    while (valid > 0 && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
      try {
        add(record);
      } catch (...) {
        ++dropped_;
      }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS) {
      dropped_ += static_cast<int64_t>(dropped);
    }
  }

  void add(const CUpti_Activity* record) {
    TraceEvent e;
    auto common = [&](uint64_t start, uint64_t end, uint32_t device, uint32_t ctx,
                      uint32_t stream, uint32_t correlation) {
      e.start_ns = static_cast<int64_t>(start);
      e.dur_ns = static_cast<int64_t>(end - start);
      e.stream = stream;
      e.args.push_back({"correlation", int64_t{correlation}});
      e.args.push_back({"device", int64_t{device}});
      e.args.push_back({"context", int64_t{ctx}});
      e.args.push_back({"stream", int64_t{stream}});
      return start != 0 && end >= start;  // incomplete records (a forced flush) have no times
    };
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        if (!common(k->start, k->end, k->deviceId, k->contextId, k->streamId, k->correlationId)) return;
        e.name = demangle(k->name);
        e.cat = "kernel";
        e.args.push_back({"grid", std::vector<int64_t>{k->gridX, k->gridY, k->gridZ}});
        e.args.push_back({"block", std::vector<int64_t>{k->blockX, k->blockY, k->blockZ}});
        e.args.push_back({"registers per thread", int64_t{k->registersPerThread}});
        e.args.push_back({"shared memory", int64_t{k->staticSharedMemory} + k->dynamicSharedMemory});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        if (!common(m->start, m->end, m->deviceId, m->contextId, m->streamId, m->correlationId)) return;
        e.name = std::string("Memcpy ") + memcpy_kind(m->copyKind) + " (" + memory_kind(m->srcKind) +
                 " -> " + memory_kind(m->dstKind) + ")";
        e.cat = "gpu_memcpy";
        e.args.push_back({"bytes", static_cast<int64_t>(m->bytes)});
        if (e.dur_ns > 0) {
          e.args.push_back({"memory bandwidth (GB/s)",
                            static_cast<double>(m->bytes) / static_cast<double>(e.dur_ns)});
        }
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        if (!common(m->start, m->end, m->deviceId, m->contextId, m->streamId, m->correlationId)) return;
        e.name = std::string("Memset (") + memory_kind(m->memoryKind) + ")";
        e.cat = "gpu_memset";
        e.args.push_back({"bytes", static_cast<int64_t>(m->bytes)});
        break;
      }
      default:
        return;
    }
    events_.push_back(std::move(e));
  }

  // The kernel's C++ name ("void fsdp::cuda::(anonymous namespace)::gelu_kernel<...>(...)");
  // a name that is not mangled comes back as it is. Cached: kernels repeat every step.
  const std::string& demangle(const char* mangled) {
    const std::string key = mangled ? mangled : "?";
    auto it = names_.find(key);
    if (it != names_.end()) return it->second;
    int status = 0;
    char* plain = abi::__cxa_demangle(key.c_str(), nullptr, nullptr, &status);
    std::string name = status == 0 && plain ? plain : key;
    std::free(plain);
    return names_.emplace(key, std::move(name)).first->second;
  }

  std::vector<TraceEvent> events_;
  std::unordered_map<std::string, std::string> names_;
  int64_t dropped_ = 0;
  int64_t offset_ns_ = 0;  // CUPTI clock - steady clock (when CUPTI keeps its own clock)
  bool own_clock_ = false;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace

std::unique_ptr<ActivityCollector> make_cupti_collector() {
  return std::make_unique<CuptiCollector>();
}

}  // namespace fsdp::cuda

#else  // no CUPTI: host ranges only

namespace fsdp::cuda {
std::unique_ptr<ActivityCollector> make_cupti_collector() { return nullptr; }
}  // namespace fsdp::cuda

#endif
