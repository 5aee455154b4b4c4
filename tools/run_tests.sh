#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs the whole ctest suite
# (unit tests, multi-rank tests under mpirun, end-to-end CLI tests). CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
# CUDA code is compiled for the A100 and H100/H200 (sm_80, sm_90) where a GPU is visible, to
# run the gpu tests; without one only compiled (the gpu tests exit 77), for sm_90 alone: about
# a minute less of CI's build. FSDP_CUDA_ARCHS overrides (e.g. "80;90").
if [[ -z "${FSDP_CUDA_ARCHS:-}" ]]; then
  if nvidia-smi -L >/dev/null 2>&1; then FSDP_CUDA_ARCHS="80;90"; else FSDP_CUDA_ARCHS=90; fi
fi
tools/build.sh "-DCMAKE_CUDA_ARCHITECTURES=$FSDP_CUDA_ARCHS"
# Open MPI refuses root without these; CI containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "${FSDP_BUILD_DIR:-build}"
# -LE slurm: tests/slurm/multinode.sh (a local two-node Slurm, minutes) runs only on request:
# ctest -L slurm (README "Building by hand"). -j nproc: a test takes as many of the slots as
# its PROCESSORS (the ranks it starts; more than the cores: all of them), so the one-process
# tests run side by side and each multi-rank test alone (2-core VM: 417 s against ~600 s).
ctest --output-on-failure -j "$(nproc)" -LE slurm "$@"
