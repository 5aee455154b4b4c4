// src/comm/communicator.cpp: what every Communicator shares (fsdp/comm/communicator.hpp):
// the collectives' opening checks and the default local_impl.
#include "fsdp/comm/communicator.hpp"

#include <cstring>
#include <string>

#include "fsdp/core/error.hpp"

namespace fsdp {

void Communicator::check_op(DType dtype, ReduceOp op, const char* what) const {
  if (op == ReduceOp::avg && !is_floating(dtype)) {
    throw Error(std::string(kind()) + "::" + what + ": ReduceOp::avg needs a floating dtype, got " +
                std::string(to_string(dtype)));
  }
}

void Communicator::check_root(int root) const {
  if (root < 0 || root >= size()) {
    throw Error(std::string(kind()) + "::broadcast: root " + std::to_string(root) +
                " is not a rank of a communicator of size " + std::to_string(size()));
  }
}

namespace {
// A collective that is already complete.
class CompleteWork final : public Work {
 public:
  void wait() override {}
  std::shared_ptr<Event> done() override { return std::make_shared<HostEvent>(); }
};
}  // namespace

std::unique_ptr<Work> Communicator::local_impl(const char* what, const void* send, void* recv,
                                               std::size_t count, DType dtype, Stream&) {
  if (device() != Device::cpu) {
    throw Error(std::string(kind()) + "::" + what +
                ": a communicator of device memory must implement local_impl");
  }
  if (count > 0 && send != recv) std::memmove(recv, send, count * dtype_size(dtype));
  return std::make_unique<CompleteWork>();
}

}  // namespace fsdp
