#!/usr/bin/env bash
# Configures and builds fsdp_train (Release) into ${FSDP_BUILD_DIR:-build}.
# Extra arguments go to cmake's configure step, e.g. tools/build.sh -DFSDP_CUDA=ON.
# FSDP_BUILD_TARGETS="fsdp_prepare fsdp_train fsdp_merge" builds only those (the main jobs);
# unset, everything (the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FSDP_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA="${FSDP_CUDA:-AUTO}" "$@" >/dev/null
# shellcheck disable=SC2086  # a space-separated target list
cmake --build "$build_dir" -j "$(nproc)" ${FSDP_BUILD_TARGETS:+--target $FSDP_BUILD_TARGETS}
