// fsdp/train/collective_guard.hpp: fail on every rank, never hang.
//
// A phase that can fail on some ranks only (opening a file, reading a checkpoint shard,
// writing one) runs inside collective_guard(). Every rank then agrees, with one all-reduce,
// whether any rank failed: if so, the lowest failing rank throws AgreedFailure with its own
// message (and is the one that prints it) and every other rank throws PeerFailed with the same exit code, so
// all ranks exit together instead of waiting in the next collective. The guarded phase must
// not itself call collectives that a failing rank could skip.
#pragma once

#include <exception>
#include <functional>

#include "fsdp/comm/communicator.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {

// The failure every rank agreed on, rethrown on the lowest failing rank with the original
// message and exit code: the one line to print. All ranks are past the guard's all-reduce,
// so exiting normally (MPI_Finalize) cannot hang.
class AgreedFailure : public Error {
 public:
  AgreedFailure(const std::string& message, int exit_code) : Error(message, exit_code) {}
};

// Thrown on the other ranks; its message is not printed (the failing rank prints its own).
class PeerFailed : public Error {
 public:
  explicit PeerFailed(int exit_code) : Error("a peer rank failed", exit_code) {}
};

// Runs `phase`; collective over `world`. Rethrows as described above.
void collective_guard(Communicator& world, const std::function<void()>& phase);

}  // namespace fsdp
