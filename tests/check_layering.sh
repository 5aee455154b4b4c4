#!/usr/bin/env bash
# tests/check_layering.sh SOURCE_DIR: the layering of docs/architecture.md "Layers", checked
# against the build's own declaration of it.
#
# The layers and their links are read from SOURCE_DIR/CMakeLists.txt: each
# `fsdp_layer(NAME deps...)` and `add_library(fsdp_lib_NAME ...)` declares a layer (the code
# of src/NAME/ and include/fsdp/NAME/), and each `fsdp::OTHER` among its deps or in a
# `target_link_libraries(fsdp_lib_NAME ...)` line declares the link NAME -> OTHER (`${VAR}`
# expands a `set(VAR ...)` of the file, as `${FSDP_CUDA_LAYER}`). Then:
#  1. every `#include "fsdp/OTHER/..."` in a file under src/NAME/ or include/fsdp/NAME/ with
#     OTHER != NAME is a declared link NAME -> OTHER. Direct links only: a layer names every
#     layer whose headers it includes, not one it reaches through another's links, so each
#     link says what its layer uses and dropping a link elsewhere cannot break it silently;
#  2. every declared link is used by at least one such include (a link nothing needs is a
#     dependency nobody can see);
#  3. the links form no cycle (the layer graph is a DAG: no back edge between layers);
#  4. every folder of src/ and include/fsdp/ is a declared layer (none escapes the check);
# and three rules finer than a layer: core/ includes neither MPI nor HDF5 (those are comm/'s
# and h5/'s), and fsdp/ and optim/ see only the device runtime of backend/, never the model
# kernels (fsdp/backend/kernels.hpp, backend.hpp).
# Prints every violation as FILE:LINE: what, and exits 1 if there is any.
set -uo pipefail
root=${1:?usage: check_layering.sh SOURCE_DIR}
cmake_file=$root/CMakeLists.txt
[[ -f $cmake_file ]] || { echo "check_layering.sh: no $cmake_file"; exit 1; }

# ---- the declared layers and links, from CMakeLists.txt ----
# awk reads CMake's commands (comments dropped, quoted strings kept whole, multi-line calls
# joined) and prints "layer NAME" and "link NAME OTHER LINE" records.
records=$(awk '
  function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
  function deps(name, list, from,   n, t, i, j, m, v) {
    n = split(list, t, /[ \t]+/)
    for (i = from; i <= n; i++) {
      if (t[i] ~ /^\$\{[A-Za-z0-9_]+\}$/) {  # ${VAR}: the values of set(VAR ...)
        m = split(vars[substr(t[i], 3, length(t[i]) - 3)], v, /[ \t]+/)
        for (j = 1; j <= m; j++) if (v[j] ~ /^fsdp::[a-z0-9_]+$/) print "link", name, substr(v[j], 7), start
      } else if (t[i] ~ /^fsdp::[a-z0-9_]+$/) {
        print "link", name, substr(t[i], 7), start
      }
    }
  }
  function emit(cmd, args,   n, t, rest) {
    args = trim(args)
    n = split(args, t, /[ \t]+/)
    if (cmd == "set" && n >= 2) { rest = args; sub(/^[^ \t]+[ \t]+/, "", rest); vars[t[1]] = rest }
    else if (cmd == "fsdp_layer" && t[1] ~ /^[a-z0-9_]+$/) { print "layer", t[1], start; deps(t[1], args, 2) }
    else if (cmd == "add_library" && t[1] ~ /^fsdp_lib_[a-z0-9_]+$/) print "layer", substr(t[1], 10), start
    else if (cmd == "target_link_libraries" && t[1] ~ /^fsdp_lib_[a-z0-9_]+$/) deps(substr(t[1], 10), args, 2)
  }
  {
    line = $0
    for (i = 1; i <= length(line); i++) {
      c = substr(line, i, 1)
      if (inq) {
        if (c == "\\") { i++; continue }
        if (c == "\"") inq = 0
        continue  # a quoted argument is never a link
      }
      if (c == "#") break
      if (c == "\"") { inq = 1; continue }
      if (depth == 0) {
        if (c ~ /[A-Za-z0-9_]/) { word = word c; continue }
        if (c == "(") { cmd = tolower(word); depth = 1; args = ""; start = NR }
        word = ""
        continue
      }
      if (c == "(") depth++
      else if (c == ")" && --depth == 0) { emit(cmd, args); word = ""; continue }
      args = args c
    }
    if (depth > 0) args = args " "
    else word = ""
  }' "$cmake_file")

declare -A is_layer=() declared=() declared_at=() used=()
while read -r kind a b c; do
  case $kind in
    layer) is_layer[$a]=1 ;;
    link) declared["$a $b"]=1; declared_at["$a $b"]=$c ;;
  esac
done <<<"$records"
layers=$(printf '%s\n' "${!is_layer[@]}" | sort)
if [[ -z $layers ]]; then
  echo "check_layering.sh: no fsdp_layer(...) in $cmake_file"
  exit 1
fi

errors=0
bad() {
  echo "$1"
  errors=$((errors + 1))
}
rel() { echo "${1#"$root"/}"; }

# 4. every folder of src/ and include/fsdp/ is a layer
for d in "$root"/src/*/ "$root"/include/fsdp/*/; do
  [[ -d $d ]] || continue
  name=$(basename "$d")
  [[ -n ${is_layer[$name]:-} ]] ||
    bad "$(rel "${d%/}"): not a layer: CMakeLists.txt has no fsdp_layer($name ...) (its includes would go unchecked)"
done

# 1. every cross-layer include is a declared link (and 2. collect the links used)
for layer in $layers; do
  dirs=()
  for d in "$root/src/$layer" "$root/include/fsdp/$layer"; do [[ -d $d ]] && dirs+=("$d"); done
  ((${#dirs[@]})) || continue
  while IFS= read -r hit; do
    [[ -z $hit ]] && continue
    file=${hit%%:*} rest=${hit#*:}
    line=${rest%%:*} text=${rest#*:}
    # bash's own matching, no sed/cut per line: forking two processes for each of ~1000
    # includes took 12 of the check's 13 s.
    [[ $text =~ include[[:space:]]*[\<\"]([^\>\"]*) ]] && header=${BASH_REMATCH[1]}
    other=${header#*/} other=${other%%/*}
    [[ $other == "$layer" ]] && continue
    if [[ -z ${is_layer[$other]:-} ]]; then
      bad "$(rel "$file"):$line: includes $header: fsdp/$other/ is no layer of CMakeLists.txt"
    elif [[ -z ${declared["$layer $other"]:-} ]]; then
      bad "$(rel "$file"):$line: $layer -> $other: includes $header, but fsdp_lib_$layer does not link fsdp::$other (CMakeLists.txt)"
    else
      used["$layer $other"]=1
    fi
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]fsdp/[A-Za-z0-9_]+/' "${dirs[@]}" 2>/dev/null | sort -t: -k1,1 -k2,2n)
done

# 2. every declared link is used
for edge in $(printf '%s\n' "${!declared[@]}" | tr ' ' ':' | sort); do
  layer=${edge%:*} other=${edge#*:}
  if [[ -z ${is_layer[$other]:-} ]]; then
    bad "CMakeLists.txt:${declared_at["$layer $other"]}: fsdp_lib_$layer links fsdp::$other, which is no layer"
  elif [[ -z ${used["$layer $other"]:-} ]]; then
    bad "CMakeLists.txt:${declared_at["$layer $other"]}: fsdp_lib_$layer links fsdp::$other, but no file of src/$layer/ or include/fsdp/$layer/ includes fsdp/$other/ (remove the link)"
  fi
done

# 3. no cycle: depth-first search over the declared links
declare -A state=()  # 1: on the current path, 2: done
order=()
visit() {
  local n=$1 path=$2 e m
  state[$n]=1
  for e in "${!declared[@]}"; do
    [[ ${e%% *} == "$n" ]] || continue
    m=${e#* }
    [[ -n ${is_layer[$m]:-} ]] || continue
    if [[ ${state[$m]:-0} == 1 ]]; then
      bad "CMakeLists.txt:${declared_at["$n $m"]}: the layers' links form a cycle: $m -> ${path#*"$m -> "} -> $m"
    elif [[ ${state[$m]:-0} == 0 ]]; then
      visit "$m" "$path -> $m"
    fi
  done
  state[$n]=2
  order+=("$n")
}
for layer in $layers; do
  [[ ${state[$layer]:-0} == 0 ]] && visit "$layer" "$layer"
done

# The rules finer than a layer. forbid LAYER PATTERN WHY: no file under src/LAYER or
# include/fsdp/LAYER has an #include matching PATTERN (extended regex of what follows it).
forbid() {
  local hits
  hits=$(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*$2" "$root/src/$1" "$root/include/fsdp/$1" 2>/dev/null)
  while IFS= read -r hit; do
    [[ -n $hit ]] && bad "$(rel "${hit%%:*}"):$(cut -d: -f2 <<<"$hit"): $1/ must not include $3"
  done <<<"$hits"
}
forbid core '[<"](mpi|hdf5|H5[A-Za-z]*)\.h[>"]' "MPI or HDF5 headers (comm/ and h5/ own them)"
# The engine and the optimizers run on a DeviceRuntime (issue 21): the --dry-run plan drives
# the engine on the CountingRuntime, which has no kernels.
for layer in fsdp optim; do
  forbid $layer '"fsdp/backend/(kernels|backend)\.hpp"' "the model kernels (they run on fsdp/backend/device_runtime.hpp)"
done

if ((errors)); then
  echo "check_layering.sh: $errors violation(s) of the layering declared in CMakeLists.txt (an include"
  echo "across a missing link: declare the link, unless it would close a cycle: then what the"
  echo "include needs belongs in a lower layer)"
  exit 1
fi
nlinks=$(printf '%s\n' "${!declared[@]}" | grep -c .)
[[ -n ${CHECK_LAYERING_INNER:-} ]] && exit 0

# ---- the rules are only as good as the script: each must catch what it forbids ----
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
# A small layered tree: core <- backend <- optim, core <- config <- model (also on backend).
make_probe() {
  rm -rf "$probe"/*
  mkdir -p "$probe"/src/{core,backend,config,model,optim} "$probe"/include/fsdp/{core,backend,config,model,optim}
  cat >"$probe/CMakeLists.txt" <<'EOF'
function(fsdp_layer NAME)
  target_link_libraries(fsdp_lib_${NAME} PUBLIC ${ARGN})
endfunction()
fsdp_layer(core)  # a comment naming fsdp::model is no link
fsdp_layer(backend fsdp::core)
set(PROBE_CONFIG_DEPS fsdp::core)
fsdp_layer(config ${PROBE_CONFIG_DEPS})
message(STATUS "a (quoted) fsdp::optim is no link")
fsdp_layer(model fsdp::backend
           fsdp::config)
fsdp_layer(optim fsdp::backend)
target_link_libraries(fsdp_lib_optim PRIVATE fsdp::config)
EOF
  printf '#include "fsdp/core/error.hpp"\n' >"$probe/src/backend/b.cpp"
  printf '#include "fsdp/core/error.hpp"\n' >"$probe/include/fsdp/config/c.hpp"
  printf '#include "fsdp/backend/device_runtime.hpp"\n#include "fsdp/config/config.hpp"\n' >"$probe/src/model/m.cpp"
  printf '#include "fsdp/backend/device_runtime.hpp"\n' >"$probe/include/fsdp/optim/o.hpp"
  printf '#include "fsdp/config/config.hpp"\n' >"$probe/src/optim/o.cpp"
}
# expect_fail WHAT TEXT: the probe tree must fail, with TEXT in the report.
expect_fail() {
  local out
  if out=$(CHECK_LAYERING_INNER=1 bash "$0" "$probe" 2>&1); then
    echo "check_layering.sh did not catch $1"
    exit 1
  fi
  if ! grep -qF -- "$2" <<<"$out"; then
    echo "check_layering.sh failed on $1 without saying \"$2\":"
    echo "$out"
    exit 1
  fi
}
make_probe
if ! out=$(CHECK_LAYERING_INNER=1 bash "$0" "$probe" 2>&1); then
  echo "check_layering.sh rejects its clean probe tree:"
  echo "$out"
  exit 1
fi
printf '#include <mpi.h>\n' >"$probe/src/core/x.cpp"
expect_fail "a core file including <mpi.h>" "src/core/x.cpp:1: core/ must not include MPI"
make_probe
printf '// config knows no model\n#include "fsdp/model/model.hpp"\n' >"$probe/src/config/x.cpp"
expect_fail "a config file including a model header (no link)" "src/config/x.cpp:2: config -> model"
make_probe
mkdir -p "$probe/src/config/deep"
printf '#  include <fsdp/optim/optimizer.hpp>\n' >"$probe/src/config/deep/y.hpp"
expect_fail "an undeclared include in a subfolder, spelled <...>" "src/config/deep/y.hpp:1: config -> optim"
make_probe
printf '#include "fsdp/model/model.hpp"\n' >"$probe/include/fsdp/backend/x.hpp"
expect_fail "a back edge (backend including model, which links backend)" "include/fsdp/backend/x.hpp:1: backend -> model"
make_probe
printf '#include "fsdp/backend/kernels.hpp"\n' >"$probe/include/fsdp/optim/x.hpp"
expect_fail "an optim header including the model kernels" "include/fsdp/optim/x.hpp:1: optim/ must not include the model kernels"
make_probe
rm "$probe/src/optim/o.cpp"
expect_fail "a declared link no include uses" "fsdp_lib_optim links fsdp::config, but no file"
make_probe
printf 'fsdp_layer(extra fsdp::core)\n' >>"$probe/CMakeLists.txt"
expect_fail "a declared link no include uses (a layer without files)" "fsdp_lib_extra links fsdp::core, but no file"
make_probe
sed -i 's/^fsdp_layer(backend fsdp::core)$/fsdp_layer(backend fsdp::core fsdp::model)/' "$probe/CMakeLists.txt"
printf '#include "fsdp/model/model.hpp"\n' >"$probe/src/backend/x.cpp"
expect_fail "a cycle of declared links" "form a cycle"
make_probe
mkdir -p "$probe/src/stray"
expect_fail "a folder of src/ that is no layer" "src/stray: not a layer"

echo "ok: $(wc -w <<<"$layers") layers, $nlinks links (each used, no cycle; order: ${order[*]}), every cross-layer include a declared link; core/ includes neither MPI nor HDF5; fsdp/ and optim/ include no model kernels"
