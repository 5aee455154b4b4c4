// CUDA streams and events (see fsdp/cuda/stream.hpp).
#include "fsdp/cuda/stream.hpp"

#include "fsdp/core/error.hpp"
#include "fsdp/cuda/check.hpp"

namespace fsdp::cuda {

CudaStream::CudaStream(int priority) {
  FSDP_CHECK_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}

CudaStream::~CudaStream() {
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaStream::wait(Event& event) {
  if (auto* e = dynamic_cast<CudaEvent*>(&event)) {
    FSDP_CHECK_CUDA(cudaStreamWaitEvent(stream_, e->handle(), 0));
  } else {
    event.synchronize();  // a host-side event (an MPI request): wait for it on the host
  }
}

void CudaStream::synchronize() { FSDP_CHECK_CUDA(cudaStreamSynchronize(stream_)); }

CudaEvent::CudaEvent(bool timing) : timing_(timing) {
  FSDP_CHECK_CUDA(cudaGetDevice(&device_));
  FSDP_CHECK_CUDA(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

void CudaEvent::make_device_current() const {
  int current = -1;
  FSDP_CHECK_CUDA(cudaGetDevice(&current));
  if (current != device_) FSDP_CHECK_CUDA(cudaSetDevice(device_));
}

CudaEvent::~CudaEvent() {
  if (event_) cudaEventDestroy(event_);
}

void CudaEvent::record(Stream& stream) { FSDP_CHECK_CUDA(cudaEventRecord(event_, native(stream))); }
void CudaEvent::synchronize() {
  make_device_current();
  FSDP_CHECK_CUDA(cudaEventSynchronize(event_));
}

bool CudaEvent::query() {
  make_device_current();
  const cudaError_t rc = cudaEventQuery(event_);
  if (rc == cudaErrorNotReady) return false;
  FSDP_CHECK_CUDA(rc);
  return true;
}

double CudaEvent::seconds_since(TimedEvent& earlier) {
  auto* e = dynamic_cast<CudaEvent*>(&earlier);
  if (!e || !e->timing_ || !timing_) {
    throw Error("CudaEvent::seconds_since: both events must be CUDA events created with timing");
  }
  float ms = 0.f;
  FSDP_CHECK_CUDA(cudaEventElapsedTime(&ms, e->event_, event_));
  return 1e-3 * static_cast<double>(ms);
}

cudaStream_t native(Stream& stream) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  if (!s) throw Error("expected a CUDA stream, got a host stream");
  return s->handle();
}

}  // namespace fsdp::cuda
