// Formatting of foreign-library failures into fsdp::Error (see fsdp/core/error.hpp).
#include "fsdp/core/error.hpp"

#include <hdf5.h>
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

void throw_hdf5_error(const char* call, const char* file, int line) {
  // Take the innermost message of HDF5's error stack, if there is one.
  std::string detail;
  auto walk = [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
    if (n == 0 && err->desc) *static_cast<std::string*>(data) = err->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &detail);
  H5Eclear2(H5E_DEFAULT);
  std::ostringstream os;
  os << "HDF5 error in " << call << " at " << file << ":" << line;
  if (!detail.empty()) os << ": " << detail;
  throw Error(os.str());
}

}  // namespace fsdp::detail
