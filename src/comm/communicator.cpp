// src/comm/communicator.cpp: what every Communicator shares (fsdp/comm/communicator.hpp):
// ReduceOp's names and the collectives' opening checks.
#include "fsdp/comm/communicator.hpp"

#include <string>

#include "fsdp/core/error.hpp"

namespace fsdp {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
  }
  return "unknown";
}

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

}  // namespace fsdp
