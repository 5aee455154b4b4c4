// fsdp/comm/mpi_check.hpp: the check around every MPI call (nccl-tests' MPICHECK habit). A
// failure throws fsdp::Error (exit code 1) whose one line names the call, file:line and
// MPI's own message (MPI_Error_string). Only comm/ and the Runtime call MPI.
#pragma once

#include "fsdp/core/error.hpp"

namespace fsdp::detail {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
}  // namespace fsdp::detail

// Checks an MPI call's return code; throws fsdp::Error with file:line and MPI's message.
#define FSDP_CHECK_MPI(call)                                                    \
  do {                                                                          \
    int fsdp_mpi_rc_ = (call);                                                  \
    if (fsdp_mpi_rc_ != 0) ::fsdp::detail::throw_mpi_error(fsdp_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
