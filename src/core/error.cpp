// Formatting of foreign-library failures into fsdp::Error (see fsdp/core/error.hpp).
#include "fsdp/core/error.hpp"

#include <hdf5.h>
#include <mpi.h>

#include <cstdlib>
#include <cstring>
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
  // The outermost message of HDF5's error stack, and the system error of a failed read or
  // write deeper in it (the sec2 driver records "errno = 28, error message = '...'"), so a
  // full disk reads "No space left on device" instead of only "can't write data".
  struct Found {
    std::string detail;
    int sys_errno = 0;
  } found;
  auto walk = [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
    auto* f = static_cast<Found*>(data);
    if (!err->desc) return 0;
    if (n == 0) f->detail = err->desc;
    if (f->sys_errno == 0) {
      const char* e = std::strstr(err->desc, "errno = ");
      if (e) f->sys_errno = std::atoi(e + 8);
    }
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &found);
  H5Eclear2(H5E_DEFAULT);
  std::ostringstream os;
  os << "HDF5 error in " << call << " at " << file << ":" << line;
  if (!found.detail.empty()) os << ": " << found.detail;
  if (found.sys_errno > 0) os << ": " << std::strerror(found.sys_errno);
  throw Error(os.str());
}

}  // namespace fsdp::detail
