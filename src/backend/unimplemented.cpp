// Transition helper of fsdp/backend/backend.hpp (removed once every backend has every kernel).
#include "fsdp/backend/backend.hpp"

#include <string>

#include "fsdp/core/error.hpp"

namespace fsdp {

void Backend::unimplemented(const char* op) {
  throw Error(std::string("Backend::") + op + ": not implemented by this backend");
}

}  // namespace fsdp
