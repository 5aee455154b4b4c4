// Formatting of CUDA, cuBLAS and NCCL failures into fsdp::Error (see fsdp/cuda/check.hpp).
#include "fsdp/cuda/check.hpp"

#include <mpi.h>
#include <unistd.h>

#include <sstream>
#include <string>

#include "fsdp/core/error.hpp"

namespace fsdp::cuda::detail {
namespace {
[[noreturn]] void fail(const char* lib, const char* call, const char* file, int line,
                       const std::string& message) {
  std::ostringstream os;
  os << lib << " error in " << call << " at " << file << ":" << line << " (" << where()
     << "): " << message;
  throw Error(os.str());
}
}  // namespace

const char* where() {
  thread_local std::string text;
  int initialised = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  if (initialised && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  text = (rank >= 0 ? "rank " + std::to_string(rank) : std::string("rank ?")) + " on " + host;
  return text.c_str();
}

void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  fail("CUDA", call, file, line, std::string(cudaGetErrorName(code)) + ": " + cudaGetErrorString(code));
}

void throw_cublas_error(cublasStatus_t code, const char* call, const char* file, int line) {
  fail("cuBLAS", call, file, line, cublasGetStatusString(code));
}

void throw_nccl_error(ncclResult_t code, const char* call, const char* file, int line) {
  std::string msg = ncclGetErrorString(code);
  if (const char* last = ncclGetLastError(nullptr); last && *last) msg += std::string(" (") + last + ")";
  fail("NCCL", call, file, line, msg);
}

}  // namespace fsdp::cuda::detail
