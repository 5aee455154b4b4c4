// Shape formatting (see fsdp/core/tensor.hpp).
#include "fsdp/core/tensor.hpp"

#include <sstream>

namespace fsdp {

std::string Shape::str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < nd_; ++i) os << (i ? ", " : "") << d_[static_cast<std::size_t>(i)];
  os << "]";
  return os.str();
}

}  // namespace fsdp
