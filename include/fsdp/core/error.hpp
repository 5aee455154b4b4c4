// fsdp/core/error.hpp: the one exception type of fsdp_train. Each foreign library's checks
// turn its failures into it where that library is used: FSDP_CHECK_MPI
// (fsdp/comm/mpi_check.hpp), FSDP_CHECK_HDF5 (fsdp/h5/hdf5.hpp), FSDP_CHECK_CUDA/CUBLAS/NCCL
// (fsdp/cuda/check.hpp); core itself links neither MPI nor HDF5.
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

// Writes `line` and a newline to file descriptor `fd` with one write(2) (retried only for
// what a partial write left), so lines of several ranks sharing a terminal or mpirun's
// forwarded stderr never interleave mid-line (std::cerr writes each << separately). Errors
// are ignored: this is the last word of a failing process. Defined in printable.cpp.
void write_line(int fd, std::string_view line);

// x as a message shows a number read from input: std::ostream's default format (6 significant
// digits: "0.15", "1e-05", "3"). Defined in printable.cpp.
std::string format_number(double x);

}  // namespace fsdp
