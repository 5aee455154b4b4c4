// DType names and Shape formatting (see fsdp/core/dtype.hpp, fsdp/core/tensor.hpp).
#include "fsdp/core/tensor.hpp"

#include <sstream>

namespace fsdp {

std::string_view to_string(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::f64: return "fp64";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
  }
  return "unknown";
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < nd_; ++i) os << (i ? ", " : "") << d_[static_cast<std::size_t>(i)];
  os << "]";
  return os.str();
}

}  // namespace fsdp
