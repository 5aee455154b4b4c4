// MPI failures as fsdp::Error (see fsdp/comm/mpi_check.hpp).
#include "fsdp/comm/mpi_check.hpp"

#include <mpi.h>

#include <sstream>

namespace fsdp::detail {

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(code, text, &len);
  std::ostringstream os;
  os << "MPI error in " << call << " at " << file << ":" << line << ": " << text;
  throw Error(os.str());
}

}  // namespace fsdp::detail
