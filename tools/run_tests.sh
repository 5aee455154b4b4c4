#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs the whole ctest suite
# (unit tests, multi-rank tests under mpirun, end-to-end CLI tests). CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
# Open MPI refuses root without these; CI containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "${FSDP_BUILD_DIR:-build}"
# -LE slurm: tests/slurm/multinode.sh (a local two-node Slurm, minutes) runs only on request:
# ctest -L slurm (README "Building by hand").
ctest --output-on-failure -j 1 -LE slurm "$@"
