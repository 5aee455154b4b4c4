// Formatting of CUDA, cuBLAS and NCCL failures into fsdp::Error (see fsdp/cuda/check.hpp).
#include "fsdp/cuda/check.hpp"

#include <sstream>
#include <string>

#include "fsdp/core/error.hpp"
#include "fsdp/core/process.hpp"

namespace fsdp::cuda::detail {
namespace {
[[noreturn]] void fail(const char* lib, const char* call, const char* file, int line,
                       const std::string& message) {
  std::ostringstream os;
  os << lib << " error in " << call << " at " << file << ":" << line << " (" << fsdp::where()
     << "): " << message;
  throw Error(os.str());
}
}  // namespace

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
