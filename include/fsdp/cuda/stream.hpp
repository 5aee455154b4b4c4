// fsdp/cuda/stream.hpp: CUDA streams and events behind the core Stream / Event interfaces
// (fsdp/core/stream.hpp). Each owns its handle (cudaStreamCreateWithFlags non-blocking,
// cudaEventCreateWithFlags, timing disabled unless asked for) and destroys it in a
// destructor that never throws. Only code under src/cuda/ includes this.
#pragma once

#include <cuda_runtime.h>

#include "fsdp/core/stream.hpp"

namespace fsdp::cuda {

class CudaStream final : public Stream {
 public:
  // A new non-blocking stream on the current device; `priority` as cudaStreamCreateWithPriority
  // (lower is higher priority; communication streams use the highest).
  explicit CudaStream(int priority = 0);
  ~CudaStream() override;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  Device device() const override { return Device::cuda; }
  void wait(Event& event) override;  // cudaStreamWaitEvent (host events: synchronize)
  void synchronize() override;       // cudaStreamSynchronize
  cudaStream_t handle() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// A CUDA event; `timing` = true creates it with timing enabled (the StepTimer's device
// clock: seconds_since), otherwise with cudaEventDisableTiming (cheaper to record and wait).
// It may be waited on from any host thread (FsdpEngine::update_shards' host thread waits for
// each unit's gradient copy): synchronize and query first make the event's device current on
// the calling thread, so a thread that never chose one does not bind (and create) device 0's
// context.
class CudaEvent final : public TimedEvent {
 public:
  explicit CudaEvent(bool timing = false);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void record(Stream& stream) override;  // cudaEventRecord on a CudaStream (throws otherwise)
  void synchronize() override;           // cudaEventSynchronize
  bool query() override;                 // cudaEventQuery
  // cudaEventElapsedTime(earlier, this) in seconds; both must be timing CudaEvents (else
  // fsdp::Error).
  double seconds_since(TimedEvent& earlier) override;
  cudaEvent_t handle() const { return event_; }

 private:
  void make_device_current() const;
  cudaEvent_t event_ = nullptr;
  bool timing_ = false;
  int device_ = 0;  // the device current when it was created
};

// The CUDA stream behind `stream`; throws fsdp::Error if it is not a CudaStream.
cudaStream_t native(Stream& stream);

}  // namespace fsdp::cuda
