// tests/gpu_main.cpp: GoogleTest main for the `gpu` tests. Like mpi_main.cpp (MPI
// initialised, every rank fails if any rank failed), but first checks that a CUDA device is
// visible: if none is, it prints why and exits with code 77, which ctest reports as "Not
// Run" (SKIP_RETURN_CODE), never as passed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "rank_printer.hpp"

namespace {
constexpr int kNotRun = 77;
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  int have = (rc == cudaSuccess && devices > 0) ? 1 : 0, all_have = 0;
  MPI_Allreduce(&have, &all_have, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_have) {
    if (rank == 0) {
      std::printf("no CUDA device visible (%s): gpu tests not run\n",
                  rc == cudaSuccess ? "device count 0" : cudaGetErrorString(rc));
    }
    MPI_Finalize();
    return kNotRun;
  }
  testing::InitGoogleTest(&argc, argv);
  fsdp_test::install_rank_printer(rank);
  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
