#!/usr/bin/env bash
# tests/check_layering.sh SOURCE_DIR: the layering rules that can be checked by reading the
# includes (docs/architecture.md "Layers"): core/ includes neither MPI nor HDF5 (those are
# comm/'s and h5/'s); config/ includes no model header; fsdp/ and optim/ see only the
# device runtime, never the model kernels (fsdp/backend/kernels.hpp, backend.hpp). Prints each offending line; exit 1 if
# any.
set -uo pipefail
root=$1
# forbid LAYER PATTERN WHY: no file of src/LAYER or include/fsdp/LAYER has an #include
# matching PATTERN (extended regex of what follows "#include").
forbid() {
  local bad
  bad=$(grep -nE "#include[[:space:]]*$2" "$root/src/$1"/*.cpp "$root/include/fsdp/$1"/*.hpp 2>/dev/null)
  if [[ -n $bad ]]; then
    echo "$1/ must not include $3:"
    echo "$bad"
    exit 1
  fi
}
forbid core '[<"](mpi|hdf5|H5[A-Za-z]*)\.h[>"]' "MPI or HDF5 headers"
# config/ knows no model (issue 21): it declares ModelSchema, model/ implements it.
forbid config '"fsdp/model/' "a model header (it declares ModelSchema; model/ implements it)"
# The engine and the optimizers run on a DeviceRuntime (issue 21): the --dry-run plan drives
# them on the CountingRuntime, which has no kernels.
for layer in fsdp optim; do
  forbid $layer '"fsdp/backend/(kernels|backend)\.hpp"' "the model kernels (they run on fsdp/backend/device_runtime.hpp)"
done
# The rules are only as good as their patterns: each must catch what it forbids.
[[ -n ${CHECK_LAYERING_INNER:-} ]] && exit 0
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
mkdir -p "$probe/src/core" "$probe/include/fsdp/core" "$probe/src/config" "$probe/include/fsdp/config"
printf '#include <mpi.h>\n' >"$probe/src/core/x.cpp"
if CHECK_LAYERING_INNER=1 bash "$0" "$probe" >/dev/null 2>&1; then
  echo "check_layering.sh did not catch a core file including <mpi.h>"
  exit 1
fi
rm "$probe/src/core/x.cpp"
printf '#include "fsdp/model/model.hpp"\n' >"$probe/src/config/x.cpp"
if CHECK_LAYERING_INNER=1 bash "$0" "$probe" >/dev/null 2>&1; then
  echo "check_layering.sh did not catch a config file including a model header"
  exit 1
fi
rm "$probe/src/config/x.cpp"
mkdir -p "$probe/src/optim" "$probe/include/fsdp/optim"
printf '#include "fsdp/backend/kernels.hpp"\n' >"$probe/include/fsdp/optim/x.hpp"
if CHECK_LAYERING_INNER=1 bash "$0" "$probe" >/dev/null 2>&1; then
  echo "check_layering.sh did not catch an optim header including the model kernels"
  exit 1
fi
echo "ok: core/ includes neither MPI nor HDF5; config/ includes no model header; fsdp/ and optim/ include no model kernels"
