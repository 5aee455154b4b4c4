// fsdp/core/stream.hpp: ordered queues of device work (Stream) and points in them (Event),
// the CUDA stream/event model that the engine, Backend and Communicator are written against.
//
// Each is owned through std::unique_ptr / std::shared_ptr by the code that created it; the
// concrete destructor releases the native handle (cudaStreamDestroy, cudaEventDestroy) and
// never throws. A DeviceRuntime creates its streams and events
// (DeviceRuntime::create_stream/event); a Communicator's Work exposes a completion Event.
//
// On the CPU backend kernels run synchronously on the calling thread, so a host Stream is
// always idle and a host Event is complete once recorded; an Event may instead stand for a
// pending host operation (a non-blocking MPI request), and then synchronize() completes it.
#pragma once

#include <memory>

#include "fsdp/core/dtype.hpp"

namespace fsdp {

class Stream;

class Event {
 public:
  virtual ~Event() = default;
  // Captures all work enqueued on `stream` so far (cudaEventRecord).
  virtual void record(Stream& stream) = 0;
  // Blocks the host until the captured work is complete (cudaEventSynchronize).
  virtual void synchronize() = 0;
  // True when the captured work is complete; never blocks (cudaEventQuery).
  virtual bool query() = 0;
};

// An Event that also timestamps the point (an event created with timing enabled): the
// device clock of the StepTimer (fsdp/fsdp/step_timer.hpp).
class TimedEvent : public Event {
 public:
  // Seconds from the point `earlier` captured to the one this captured
  // (cudaEventElapsedTime, resolution about 0.5 us); both must be recorded and complete.
  virtual double seconds_since(TimedEvent& earlier) = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device device() const = 0;
  // Work enqueued on this stream after the call waits for `event` (cudaStreamWaitEvent);
  // the host does not block, except on a host stream, where waiting is synchronizing.
  virtual void wait(Event& event) = 0;
  // Blocks the host until all work enqueued so far is complete.
  virtual void synchronize() = 0;
};

// The host stream and event (CPU backend, host-memory communicators).
class HostStream final : public Stream {
 public:
  Device device() const override { return Device::cpu; }
  void wait(Event& event) override { event.synchronize(); }
  void synchronize() override {}
};

class HostEvent final : public Event {
 public:
  void record(Stream&) override {}
  void synchronize() override {}
  bool query() override { return true; }
};

}  // namespace fsdp
