#!/usr/bin/env bash
# tests/check_layering.sh SOURCE_DIR: the layering rules that can be checked by reading the
# includes (docs/architecture.md "Layers"): core/ includes neither MPI nor HDF5 (those are
# comm/'s and h5/'s); config/ includes no model header. Prints each offending line; exit 1 if
# any.
set -uo pipefail
root=$1
bad=$(grep -nE '#include[[:space:]]*[<"](mpi|hdf5|H5[A-Za-z]*)\.h[>"]' \
        "$root"/src/core/*.cpp "$root"/include/fsdp/core/*.hpp 2>/dev/null)
if [[ -n $bad ]]; then
  echo "core/ must not include MPI or HDF5 headers:"
  echo "$bad"
  exit 1
fi
# config/ knows no model (issue 21): it declares ModelSchema, model/ implements it.
bad=$(grep -nE '#include[[:space:]]*"fsdp/model/' \
        "$root"/src/config/*.cpp "$root"/include/fsdp/config/*.hpp 2>/dev/null)
if [[ -n $bad ]]; then
  echo "config/ must not include a model header (it declares ModelSchema; model/ implements it):"
  echo "$bad"
  exit 1
fi
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
echo "ok: core/ includes neither MPI nor HDF5; config/ includes no model header"
