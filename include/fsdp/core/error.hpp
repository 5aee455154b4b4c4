// fsdp/core/error.hpp: the one exception type of fsdp_train, and the macros that check
// every foreign call (MPI, HDF5, later CUDA/NCCL) and turn a failure into fsdp::Error.
//
// An Error carries a user-facing message (one line: name the file, key or rank and what
// was expected) and the process exit code: 2 for bad user input (config, CLI, dataset,
// incompatible checkpoint), 1 for internal/runtime failures.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace fsdp {

inline constexpr int kExitInputError = 2;  // bad config, CLI, data file or checkpoint
inline constexpr int kExitRuntimeError = 1;
// Stopped early on SIGTERM / SIGINT / SIGUSR1 after saving a checkpoint at the step boundary
// all ranks agreed on: `--resume` continues the run (docs/checkpoint.md "Signals").
inline constexpr int kExitInterrupted = 3;

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, int exit_code = kExitRuntimeError)
      : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const noexcept { return exit_code_; }

 private:
  int exit_code_;
};

// Bad user input (exit code 2). `message` should already name the key or file.
inline Error InputError(const std::string& message) { return Error(message, kExitInputError); }

// Bytes from a stranger (a file name found in a folder, a tensor name, a lock file's line)
// made printable on one line: printable ASCII kept except '\\' and '\'', every other byte as
// \xNN; cut after `max_bytes` input bytes with "...". Error messages quote untrusted text so.
std::string printable(std::string_view bytes, std::size_t max_bytes = 4096);

namespace detail {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_hdf5_error(const char* call, const char* file, int line);
}  // namespace detail

}  // namespace fsdp

// Checks an MPI call's return code; throws fsdp::Error with file:line and MPI's message.
#define FSDP_CHECK_MPI(call)                                                    \
  do {                                                                          \
    int fsdp_mpi_rc_ = (call);                                                  \
    if (fsdp_mpi_rc_ != 0) ::fsdp::detail::throw_mpi_error(fsdp_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)

// Checks an HDF5 call returning herr_t or hid_t (negative = failure); evaluates to the value.
#define FSDP_CHECK_HDF5(call)                                                             \
  ([&]() {                                                                                \
    auto fsdp_h5_rc_ = (call);                                                            \
    if (fsdp_h5_rc_ < 0) ::fsdp::detail::throw_hdf5_error(#call, __FILE__, __LINE__);     \
    return fsdp_h5_rc_;                                                                   \
  }())
