#!/usr/bin/env bash
# tools/gpu_bundle.sh: build fsdp_train with CUDA and pack ONE folder that runs it, its tools,
# the ctest `gpu` tests and tools/bench_gpu.sh on a machine that has the NVIDIA driver, the
# CUDA libraries and python3 but no MPI, HDF5, OpenBLAS, Boost or GoogleTest (the lent GPU
# machine: docs/gpu.md).
#
# Usage: tools/gpu_bundle.sh [--no-build] [--no-check]      (from anywhere; run it here)
# Then, on the GPU machine, from the repo root with the bundle carried: tools/gpu_check.sh
#
# The bundle (default <repo>/gpu_bundle, git-ignored):
#   bin/           fsdp_train, fsdp_prepare, fsdp_merge, every `gpu` test binary, and Open MPI's
#                  mpirun/mpiexec/orterun, orted, ompi_info; all stripped
#   payload.tar.xz the shared libraries, xz-compressed (OpenBLAS alone is 35 MiB unpacked):
#     lib/           every library the executables need that is not glibc, libstdc++/libgcc_s
#                    or CUDA: Open MPI, PMIx, hwloc, libevent, HDF5 + libsz/libaec + libcurl's
#                    chain, OpenBLAS + libgfortran/libquadmath, libgomp, Boost.program_options,
#                    toml++, libz, libudev, ...
#     lib/openmpi/   Open MPI's MCA components (those needing UCX/libfabric/verbs/PSM/Slurm
#                    left out);  lib/pmix/: PMIx's;  lib/hwloc/: empty (no hwloc plugins)
#     lib/fallback/  this machine's libstdc++.so.6 and libgcc_s.so.1, put on the path only when
#                    the GPU machine's own lack the GLIBCXX version the binaries need
#     share/openmpi, share/pmix: help files;  etc/: Open MPI's mca-params.conf and hostfile,
#                    PMIx's pmix-mca-params.conf
#   tools/         tools/profile_summary.py, when the tree has it (gpu_check.sh's profile step)
#   env.sh         `source gpu_bundle/env.sh`: unpacks the payload once (to
#                  $FSDP_BUNDLE_ROOT, default /tmp/fsdp_gpu_bundle-<payload id>, never inside
#                  the bundle, so the carried folder keeps its size), then Open MPI's and PMIx's
#                  relocation (OPAL_* and PMIX_*: each directory they compiled in, so neither
#                  loads the GPU machine's own components), PATH, LD_LIBRARY_PATH
#                  (bundle + the CUDA libraries it finds there), OMPI_ALLOW_RUN_AS_ROOT*
#   gpu_tests.txt  the `gpu` tests as ctest registered them (name, ranks, timeout, skip code,
#                  ENVIRONMENT, working dir, command with @BUNDLE@ / @REPO@ placeholders)
#   cuda_libs.txt  the CUDA sonames the executables need and the bundle does not carry
#   bin_map.txt    bundled executable -> its path relative to the build directory
#   manifest.txt   commit, build settings, the original build/source paths, versions, sizes
#
# Not bundled, on purpose: glibc (the binaries need at most manifest.txt's need_glibc; the GPU
# image is newer than Debian 12), libstdc++/libgcc_s (the system's unless too old, then
# lib/fallback), the CUDA libraries (cudart, cublas, cublasLt, nccl: hundreds of MiB, taken
# from the GPU machine's toolkit or PyTorch's nvidia-* packages) and the driver (libcuda).
#
# Environment (optional):
#   FSDP_BUILD_DIR        build directory (default <repo>/build-gpu; Release, FSDP_CUDA=ON)
#   GPU_BUNDLE_DIR        output folder, inside the repo and git-ignored (default <repo>/gpu_bundle)
#   GPU_BUNDLE_LIMIT_MIB  size limit (default 64, the run tool's limit for tree + carry)
#   GPU_BUNDLE_CUDA_ARCHS CUDA architectures built (default "90": H100/H200, the lent machines;
#                         "80 90" adds A100's sm_80)
#   GPU_BUNDLE_FATBIN_COMPRESS  nvcc --compress-mode of the fatbinaries (default size; none,
#                         default, speed, balance)
#   GPU_BUNDLE_NO_BENCH_KERNELS  set: leave bench_kernels out
#   GPU_BUNDLE_BUILD_ALL  set: build every target (default: only the bundled executables)
#   GPU_BUNDLE_WARN_MIB   warn above this size (default 56: room left for a carried AB_BASE)
#   GPU_BUNDLE_CMAKE_ARGS extra configure arguments (word-split, after the above)
# The LAST line printed is the bundle's path relative to the repo root (for `carry`).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${FSDP_BUILD_DIR:-$REPO/build-gpu}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$PWD/$BUILD_DIR" ;; esac
OUTDIR="${GPU_BUNDLE_DIR:-$REPO/gpu_bundle}"
case "$OUTDIR" in /*) ;; *) OUTDIR="$PWD/$OUTDIR" ;; esac
LIMIT_MIB="${GPU_BUNDLE_LIMIT_MIB:-64}"
WARN_MIB="${GPU_BUNDLE_WARN_MIB:-56}"
DO_BUILD=1 DO_CHECK=1
for a in "$@"; do
  case "$a" in
    --no-build) DO_BUILD=0 ;;
    --no-check) DO_CHECK=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bundle.sh: unknown argument '$a' (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "gpu_bundle.sh: ERROR: $*" >&2; exit 1; }
trap 'echo "gpu_bundle.sh: ERROR: line $LINENO failed: $BASH_COMMAND" >&2' ERR
say() { echo "gpu_bundle.sh: $*" >&2; }
REL="$(realpath -m --relative-to="$REPO" "$OUTDIR")"
case "$REL" in ..*|/*|.) die "GPU_BUNDLE_DIR ($OUTDIR) must be a folder inside the repo ($REPO)" ;; esac
git -C "$REPO" check-ignore -q "$REL/" ||
  die "$REL/ is not git-ignored: it would travel as part of the working tree (add it to .gitignore)"
for t in cmake ctest ldd readelf strip python3 ompi_info xz tar sha256sum; do
  command -v "$t" >/dev/null || die "'$t' not found (tools/install_deps.sh installs the build deps)"
done

# ---- 1. build ---------------------------------------------------------------------------------
# Size (issue 32 item 4): the GPU code dominates the binaries. The default builds sm_90 only (the
# lent machines are H100/H200; PTX compute_90 comes with it, for newer GPUs by JIT) and
# compresses each fatbinary with nvcc --compress-mode=size (the SASS images shrink ~8x; the
# CUDA 13 driver that the binaries need anyway decompresses them at module load). At 1ab5425
# the former default (sm_80 + sm_90, uncompressed) made 92.1 MiB.
CUDA_ARCHS="${GPU_BUNDLE_CUDA_ARCHS:-90}"
FATBIN_COMPRESS="${GPU_BUNDLE_FATBIN_COMPRESS:-size}"
case "$FATBIN_COMPRESS" in size|balance|speed|default|none) ;;
  *) die "GPU_BUNDLE_FATBIN_COMPRESS=$FATBIN_COMPRESS: one of size, balance, speed, default, none" ;; esac
CFG_ARGS=(-DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS// /;}"
          "-DCMAKE_CUDA_FLAGS=--compress-mode=$FATBIN_COMPRESS")
if [[ "$DO_BUILD" == 1 ]]; then
  say "configuring $BUILD_DIR (Release, FSDP_CUDA=ON, CUDA architectures '$CUDA_ARCHS', --compress-mode=$FATBIN_COMPRESS${GPU_BUNDLE_CMAKE_ARGS:+, $GPU_BUNDLE_CMAKE_ARGS})"
  LOG="$(mktemp /tmp/gpu_bundle_build.XXXXXX.log)"
  # shellcheck disable=SC2086
  cmake -S "$REPO" -B "$BUILD_DIR" "${CFG_ARGS[@]}" ${GPU_BUNDLE_CMAKE_ARGS:-} >"$LOG" 2>&1 ||
    { tail -30 "$LOG" >&2; die "cmake configure failed (FSDP_CUDA=ON needs nvcc: /usr/local/cuda/bin on PATH or CUDACXX; log $LOG)"; }
  # Only what the bundle carries: fsdp_train, fsdp_prepare, fsdp_merge, bench_kernels and the
  # `gpu` tests' executables (GPU_BUNDLE_BUILD_ALL=1: every target, the CPU tests included).
  TARGETS=()
  if [[ -z "${GPU_BUNDLE_BUILD_ALL:-}" ]]; then
    TARGETS=(fsdp_train fsdp_prepare fsdp_merge bench_host_optimizer)
    [[ -n "${GPU_BUNDLE_NO_BENCH_KERNELS:-}" ]] || TARGETS+=(bench_kernels)
    while IFS= read -r t; do [[ -n "$t" ]] && TARGETS+=("$t"); done < <(
      ctest --test-dir "$BUILD_DIR" -L gpu --show-only=json-v1 2>/dev/null | python3 -c '
import json, os, sys
build, names = os.path.realpath(sys.argv[1]), set()
for t in json.load(sys.stdin).get("tests", []):
    for a in (t.get("command") or [])[:8]:  # mpiexec -n N <executable> ...
        if os.path.isabs(a) and os.path.dirname(os.path.realpath(a)).startswith(build):
            names.add(os.path.basename(a))
            break
print("\n".join(sorted(names)))' "$BUILD_DIR")
  fi
  say "building in $BUILD_DIR (${TARGETS[*]:-all targets, tests included})"
  BUILD_ARGS=(--build "$BUILD_DIR" -j"$(nproc)")
  [[ ${#TARGETS[@]} == 0 ]] || BUILD_ARGS+=(--target "${TARGETS[@]}")
  cmake "${BUILD_ARGS[@]}" >"$LOG" 2>&1 ||
    { tail -40 "$LOG" >&2; die "build failed (full log: $LOG)"; }
  rm -f "$LOG"
fi
[[ -f "$BUILD_DIR/CMakeCache.txt" ]] || die "$BUILD_DIR is not configured (run without --no-build)"
cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD_DIR/CMakeCache.txt" | head -1; }
[[ "$(cache FSDP_CUDA)" == ON ]] || die "$BUILD_DIR was configured with FSDP_CUDA=$(cache FSDP_CUDA), not ON"
[[ "$(cache CMAKE_BUILD_TYPE)" == Release ]] || die "$BUILD_DIR is a $(cache CMAKE_BUILD_TYPE) build, not Release"
SOURCE_DIR="$(cache CMAKE_HOME_DIRECTORY)"
MPIEXEC="$(cache MPIEXEC_EXECUTABLE)"
for b in fsdp_train fsdp_prepare fsdp_merge; do [[ -x "$BUILD_DIR/$b" ]] || die "$BUILD_DIR/$b not built"; done

# ---- 2. fresh layout: $B = the carried folder, $P = the payload's staging tree -----------------
rm -rf "$OUTDIR"
mkdir -p "$OUTDIR/bin"
B="$OUTDIR"
P="$(mktemp -d /tmp/gpu_bundle_payload.XXXXXX)"
trap 'rm -rf "$P"' EXIT
mkdir -p "$P"/{lib/openmpi,lib/pmix,lib/hwloc,lib/fallback,share,etc}

# ---- 3. the gpu tests, as ctest registered them -------------------------------------------------
JSON="$(mktemp /tmp/gpu_bundle_ctest.XXXXXX.json)"
ctest --test-dir "$BUILD_DIR" -L gpu --show-only=json-v1 >"$JSON" 2>/dev/null ||
  die "ctest --show-only=json-v1 failed in $BUILD_DIR"
# Writes gpu_tests.txt and prints, one a line, the build-tree executables the tests run.
TEST_FILES="$(python3 - "$JSON" "$BUILD_DIR" "$SOURCE_DIR" "$MPIEXEC" "$B/gpu_tests.txt" <<'PY'
import json, os, shlex, sys
js, build, source, mpiexec, out = sys.argv[1:]
tests = json.load(open(js)).get("tests", [])
files, lines = [], []
def under(p, d):
    return os.path.commonpath([os.path.abspath(p), d]) == d
for t in tests:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    if "gpu" not in props.get("LABELS", []):
        continue
    cmd = t.get("command") or []
    if not cmd:
        sys.exit(f"gpu test {t['name']} has no command (target not built?)")
    args, np = [], 1
    for i, a in enumerate(cmd):
        if i == 0 and (a == mpiexec or os.path.basename(a) in ("mpiexec", "mpirun", "orterun")):
            args.append("@BUNDLE@/bin/mpirun")
        elif os.path.isabs(a) and under(a, build):
            if not os.path.isfile(a):
                sys.exit(f"gpu test {t['name']}: {a} does not exist (build it first)")
            if os.access(a, os.X_OK):
                files.append(a)
                args.append("@BUNDLE@/bin/" + os.path.basename(a))
            else:
                sys.exit(f"gpu test {t['name']}: argument {a} is a non-executable build file; "
                         "teach tools/gpu_bundle.sh to carry it")
        elif os.path.isabs(a) and under(a, source):
            args.append("@REPO@/" + os.path.relpath(a, source))
        else:
            args.append(a)
        if i > 0 and cmd[i - 1] in ("-n", "-np", "--np", "-c"):
            np = int(a)
    env = ";".join(props.get("ENVIRONMENT", []))
    wd = props.get("WORKING_DIRECTORY", "")
    lines.append("\t".join([t["name"], str(np), str(int(float(props.get("TIMEOUT", 900)))),
                            str(props.get("SKIP_RETURN_CODE", "")), env, wd,
                            " ".join(shlex.quote(x) for x in args)]))
with open(out, "w") as f:
    f.write("# name\tranks\ttimeout_s\tskip_rc\tenv(;)\tctest_working_dir\tcommand "
            "(@BUNDLE@ = this folder, @REPO@ = the repo root); written by tools/gpu_bundle.sh\n")
    f.writelines(l + "\n" for l in lines)
print("\n".join(sorted(set(files))))
PY
)" || die "could not read the gpu tests from ctest"
rm -f "$JSON"
NTESTS="$(grep -vc '^#' "$B/gpu_tests.txt" || true)"
[[ "$NTESTS" -gt 0 ]] || say "WARNING: ctest lists no test labelled gpu in $BUILD_DIR (none registered yet?)"

# ---- 4. executables ---------------------------------------------------------------------------
: >"$B/bin_map.txt"
add_exe() {  # $1 = file in the build tree
  local name; name="$(basename "$1")"
  [[ ! -e "$B/bin/$name" ]] || die "two bundled executables named $name"
  cp -L "$1" "$B/bin/$name"
  strip "$B/bin/$name"
  printf '%s\t%s\n' "$name" "$(realpath --relative-to="$BUILD_DIR" "$1")" >>"$B/bin_map.txt"
}
for b in fsdp_train fsdp_prepare fsdp_merge; do add_exe "$BUILD_DIR/$b"; done
# The CUDA kernels' bandwidth bench (tools/bench_kernels.cpp; PyTorch's side is
# tools/bench_kernels_torch.py), when built: `gpu_bundle/bin/bench_kernels` on the GPU.
# GPU_BUNDLE_NO_BENCH_KERNELS=1 leaves it out (2 MiB at the default sm_90 with compressed
# fatbins; it was 9 MiB at sm_80 + sm_90 uncompressed).
if [[ -x "$BUILD_DIR/bench_kernels" && -z "${GPU_BUNDLE_NO_BENCH_KERNELS:-}" ]]; then
  add_exe "$BUILD_DIR/bench_kernels"
fi
# The host optimizer's bandwidth bench (tools/bench_host_optimizer.cpp, CPU only; docs/
# benchmarks.md "Host optimizer"): `gpu_bundle/bin/bench_host_optimizer` on the GPU machine.
if [[ -x "$BUILD_DIR/bench_host_optimizer" ]]; then add_exe "$BUILD_DIR/bench_host_optimizer"; fi
while IFS= read -r f; do [[ -n "$f" ]] && add_exe "$f"; done <<<"$TEST_FILES"

# Tools the GPU machine runs beside the binaries, when the tree has them: tools/gpu_check.sh
# uses the tree's copy, else the bundle's (the profiler's summary is written in parallel).
if [[ -f "$REPO/tools/profile_summary.py" ]]; then
  mkdir -p "$B/tools"
  cp "$REPO/tools/profile_summary.py" "$B/tools/"
fi

# ---- 5. Open MPI: launcher, components, help files, config ---------------------------------------
ompi_path() { ompi_info --parsable --path "$1" | sed -n "s/^path:$1://p" | head -1; }
OMPI_BINDIR="$(ompi_path bindir)"
OMPI_PKGLIBDIR="$(ompi_path pkglibdir)"
OMPI_PKGDATADIR="$(ompi_path pkgdatadir)"
OMPI_SYSCONFDIR="$(ompi_path sysconfdir)"
OMPI_VERSION="$(ompi_info --parsable | sed -n 's/^ompi:version:full://p' | head -1)"
[[ "$OMPI_VERSION" == 4.* ]] ||
  die "Open MPI $OMPI_VERSION: env.sh's relocation (OPAL_PREFIX, OPAL_PKGLIBDIR, ...) is written for Open MPI 4.x"
[[ -d "$OMPI_PKGLIBDIR" ]] || die "Open MPI component dir '$OMPI_PKGLIBDIR' not found"
ORTERUN="$(readlink -f "$(command -v mpirun)")"
[[ "$(basename "$ORTERUN")" == orterun ]] || die "mpirun is $ORTERUN, expected Open MPI's orterun"
for n in mpirun mpiexec orterun; do cp "$ORTERUN" "$B/bin/$n"; done
cp "$OMPI_BINDIR/orted" "$B/bin/orted"
cp "$(readlink -f "$(command -v ompi_info)")" "$B/bin/ompi_info"
strip "$B/bin/mpirun" "$B/bin/mpiexec" "$B/bin/orterun" "$B/bin/orted" "$B/bin/ompi_info"
# Components whose libraries are network stacks or resource managers this single-node kit
# never uses are left out, so their (large) dependencies are not needed.
SKIP_LIBS='libucp|libucs|libuct|libucm|libfabric|libibverbs|librdmacm|libpsm|libpmi\.|libpmi2\.|libslurm'
NSKIP=0
for f in "$OMPI_PKGLIBDIR"/mca_*.so; do
  # ldd's output first, then grep: `ldd | grep -q` under pipefail fails when grep's early exit
  # gives ldd a SIGPIPE, and the component was kept (with libfabric, verbs, PSM: 12 more
  # libraries, seen under load).
  deps="$(ldd "$f" 2>/dev/null || true)"
  if grep -q -E "not found|$SKIP_LIBS" <<<"$deps"; then NSKIP=$((NSKIP + 1)); continue; fi
  cp "$f" "$P/lib/openmpi/"
done
cp -r "$OMPI_PKGDATADIR" "$P/share/openmpi"
{
  echo "# Open MPI MCA parameters of the fsdp_train GPU bundle (tools/gpu_bundle.sh), after"
  echo "# $OMPI_SYSCONFDIR/openmpi-mca-params.conf. Components needing UCX, libfabric, verbs"
  echo "# or PSM are not bundled: one node, shared memory (vader) and TCP."
  echo "btl_base_warn_component_unused = 0"
  echo "btl = self,vader,tcp"
  echo "pml = ob1"
  echo "mtl = ^ofi,psm,psm2"
  echo "osc = ^ucx,pt2pt"
  echo "# No CMA/XPMEM single copy: process_vm_readv is refused in some sandboxes (gVisor)."
  echo "btl_vader_single_copy_mechanism = none"
} >"$P/etc/openmpi-mca-params.conf"
{
  echo "# PMIx MCA parameters of the fsdp_train GPU bundle (tools/gpu_bundle.sh). env.sh points"
  echo "# PMIX_SYSCONFDIR here so that the GPU machine's own pmix-mca-params.conf (which names its"
  echo "# component path) is not read; the component path is PMIX_PKGLIBDIR, set by env.sh."
} >"$P/etc/pmix-mca-params.conf"
if [[ -f "$OMPI_SYSCONFDIR/openmpi-default-hostfile" ]]; then
  cp "$OMPI_SYSCONFDIR/openmpi-default-hostfile" "$P/etc/"
else
  echo "# empty default hostfile" >"$P/etc/openmpi-default-hostfile"
fi
# PMIx (external on Debian: mca_pmix_ext3x.so -> libpmix.so.2): its components and help files.
PMIX_LIB="$(ldd "$OMPI_PKGLIBDIR"/mca_pmix_ext*.so 2>/dev/null | awk '$1 ~ /^libpmix\.so/ { print $3; exit }')"
PMIX_ROOT=""
if [[ -n "$PMIX_LIB" ]]; then
  PMIX_ROOT="$(dirname "$(readlink -f "$PMIX_LIB")")"
  if [[ -d "$PMIX_ROOT/pmix" ]]; then cp "$PMIX_ROOT"/pmix/*.so "$P/lib/pmix/" 2>/dev/null || true; fi
  if [[ -d "$PMIX_ROOT/../share/pmix" ]]; then cp -r "$PMIX_ROOT/../share/pmix" "$P/share/pmix"; fi
fi
mkdir -p "$P/share/pmix"

# ---- 6. shared libraries: everything the ELF files need except glibc, libstdc++/libgcc_s, CUDA ----
SYSTEM_RE='^(ld-linux.*|linux-vdso.*|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libBrokenLocale|libnss_.*|libthread_db|libstdc\+\+|libgcc_s)\.so'
CUDA_RE='^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn.*|libnvrtc.*|libnvJitLink|libcufft.*|libcurand|libcusolver.*|libcusparse.*|libnvidia-.*|libnvToolsExt|libnvtx.*|libcupti)\.so'
: >"$B/cuda_libs.txt"
declare -A SEEN=()
collect() {  # $1 = ELF file; copies what it needs (ldd: the whole closure) into the payload's lib/
  local name arrow path rest
  while read -r name arrow path rest; do
    [[ "$arrow" == "=>" ]] || continue
    [[ "$name" =~ $SYSTEM_RE ]] && continue
    if [[ "$name" =~ $CUDA_RE ]]; then
      grep -qx "$name" "$B/cuda_libs.txt" || echo "$name" >>"$B/cuda_libs.txt"
      continue
    fi
    [[ "$path" != "not" ]] || die "$(basename "$1") needs $name, which this machine cannot find"
    [[ -n "${SEEN[$name]:-}" ]] && continue
    SEEN[$name]="$path"
    cp -L "$path" "$P/lib/$name"
    chmod u+w "$P/lib/$name"
    strip --strip-unneeded "$P/lib/$name" 2>/dev/null || true
  done < <(ldd "$1")
}
for f in "$B"/bin/* "$P"/lib/openmpi/*.so "$P"/lib/pmix/*.so; do collect "$f"; done
for f in "$P"/lib/openmpi/*.so "$P"/lib/pmix/*.so; do chmod u+w "$f"; strip --strip-unneeded "$f"; done
for n in libstdc++.so.6 libgcc_s.so.1; do
  p="$(ldd "$B/bin/fsdp_train" | awk -v n="$n" '$1 == n { print $3 }')"
  if [[ -n "$p" ]]; then cp -L "$p" "$P/lib/fallback/$n"; strip --strip-unneeded "$P/lib/fallback/$n"; fi
done
sort -o "$B/cuda_libs.txt" "$B/cuda_libs.txt"
grep -q '^libnccl' "$B/cuda_libs.txt" || say "WARNING: fsdp_train does not link NCCL (is src/cuda built?)"

# Newest symbol versions needed from the libraries that are NOT bundled.
maxver() { find "$B/bin" "$P/lib" -path "$P/lib/fallback" -prune -o -type f -print0 | xargs -0 readelf -V -W 2>/dev/null |
  grep -o "Name: $1_[0-9.]*" | sed "s/Name: $1_//" | sort -V | tail -1; }
NEED_GLIBC="$(maxver GLIBC)"
NEED_GLIBCXX="$(maxver GLIBCXX)"
NEED_CXXABI="$(maxver CXXABI)"

# ---- 7. the payload ---------------------------------------------------------------------------
PAYLOAD_BYTES="$(du -sb "$P" | cut -f1)"
# shellcheck disable=SC2010  # library file names are plain sonames
say "compressing the payload ($((PAYLOAD_BYTES / 1048576)) MiB: $(ls "$P/lib" | grep -c '\.so') libraries, $(ls "$P/lib/openmpi" | wc -l) MCA components)"
tar -C "$P" --sort=name --owner=0 --group=0 --numeric-owner -cf - lib share etc | xz -T0 -6 >"$B/payload.tar.xz"
PAYLOAD_ID="$(sha256sum "$B/payload.tar.xz" | cut -c1-16)"

# ---- 8. env.sh -------------------------------------------------------------------------------
cat >"$B/env.sh" <<'ENVSH'
# gpu_bundle/env.sh: environment of the fsdp_train GPU bundle (written by tools/gpu_bundle.sh).
# `source gpu_bundle/env.sh` (bash), then mpirun, fsdp_train, fsdp_prepare, fsdp_merge and the
# gpu test binaries run from the bundle. It changes PATH and LD_LIBRARY_PATH: run python3,
# nvidia-smi and other system programs with the saved FSDP_SAVED_PATH /
# FSDP_SAVED_LD_LIBRARY_PATH (tools/gpu_check.sh and tools/bench_gpu.sh source this file only
# in a subshell), since the bundle's libz/libssl/... are Debian 12's, not the GPU machine's.
#
# The libraries (payload.tar.xz) are unpacked once into $FSDP_BUNDLE_ROOT (default
# ${TMPDIR:-/tmp}/fsdp_gpu_bundle-<payload id>), with xz if there is one, else python3.
#
# CUDA libraries: each soname of cuda_libs.txt is looked up, in this order, in
# $FSDP_CUDA_LIB_DIRS (colon-separated, if set), $CUDA_HOME, $CUDA_PATH and /usr/local/cuda
# (lib64, lib, targets/x86_64-linux/lib), the nvidia-* Python packages of python3
# (site-packages/nvidia/*/lib, e.g. nvidia/cu13/lib, nvidia/nccl/lib), then the ldconfig
# cache; the first directory holding it goes on LD_LIBRARY_PATH. FSDP_CUDA_LIB_REPORT lists
# the files chosen, FSDP_CUDA_LIB_MISSING the sonames found nowhere; FSDP_LIBSTDCXX says
# whose libstdc++ is used.
FSDP_BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export FSDP_BUNDLE
if [[ -z "${FSDP_BUNDLE_ENV:-}" ]]; then  # sourced twice: keep the first saved values
  export FSDP_SAVED_PATH="$PATH" FSDP_SAVED_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
fi
export FSDP_BUNDLE_ENV=1

# ---- the payload -------------------------------------------------------------------------------
_fsdp_id="$(sed -n 's/^payload_id=//p' "$FSDP_BUNDLE/manifest.txt")"
export FSDP_BUNDLE_ROOT="${FSDP_BUNDLE_ROOT:-${TMPDIR:-/tmp}/fsdp_gpu_bundle-$_fsdp_id}"
if [[ "$(cat "$FSDP_BUNDLE_ROOT/.payload_id" 2>/dev/null)" != "$_fsdp_id" ]]; then
  _fsdp_tmp="$FSDP_BUNDLE_ROOT.tmp.$$"
  rm -rf "$_fsdp_tmp" && mkdir -p "$_fsdp_tmp" || echo "gpu_bundle/env.sh: ERROR: cannot create $_fsdp_tmp" >&2
  if ! { command -v xz >/dev/null && xz -dc "$FSDP_BUNDLE/payload.tar.xz" | tar -C "$_fsdp_tmp" -xf -; } 2>/dev/null; then
    rm -rf "$_fsdp_tmp" && mkdir -p "$_fsdp_tmp"
    PATH="$FSDP_SAVED_PATH" LD_LIBRARY_PATH="$FSDP_SAVED_LD_LIBRARY_PATH" python3 -c \
      'import sys, tarfile; t = tarfile.open(sys.argv[1], "r:xz"); t.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' \
      "$FSDP_BUNDLE/payload.tar.xz" "$_fsdp_tmp"
  fi
  if [[ $? == 0 && -d "$_fsdp_tmp/lib" ]]; then
    echo "$_fsdp_id" >"$_fsdp_tmp/.payload_id"
    rm -rf "$FSDP_BUNDLE_ROOT"
    mv "$_fsdp_tmp" "$FSDP_BUNDLE_ROOT" 2>/dev/null || rm -rf "$_fsdp_tmp"
  else
    echo "gpu_bundle/env.sh: ERROR: could not unpack $FSDP_BUNDLE/payload.tar.xz into $FSDP_BUNDLE_ROOT" >&2
    rm -rf "$_fsdp_tmp"
  fi
fi
_fsdp_r="$FSDP_BUNDLE_ROOT"

# ---- Open MPI 4 relocation: every directory it compiled in (/usr/...) moved to the bundle --------
export OPAL_PREFIX="$_fsdp_r" OPAL_EXEC_PREFIX="$_fsdp_r" OPAL_BINDIR="$FSDP_BUNDLE/bin"
export OPAL_LIBDIR="$_fsdp_r/lib" OPAL_PKGLIBDIR="$_fsdp_r/lib/openmpi"
export OPAL_DATAROOTDIR="$_fsdp_r/share" OPAL_DATADIR="$_fsdp_r/share"
export OPAL_PKGDATADIR="$_fsdp_r/share/openmpi" OPAL_SYSCONFDIR="$_fsdp_r/etc"
# Open MPI's own components only: its search path is pkglibdir (above) plus
# ~/.openmpi/components; name the bundle's alone.
export OMPI_MCA_mca_base_component_path="$_fsdp_r/lib/openmpi"
# ---- PMIx 4.2 (Debian's libpmix2, external to Open MPI) relocated the same way ----------------
# PMIx always searches its compiled-in pkglibdir (/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix,
# the very path of Ubuntu's PMIx 5 components) besides PMIX_MCA_mca_base_component_path, and
# reads <sysconfdir>/pmix-mca-params.conf, where Debian and Ubuntu set that path again. Its
# `env` pinstalldirs component takes every directory from PMIX_<DIR> variables instead
# (src/mca/pinstalldirs/env): without them the bundled 4.2 library dlopened the GPU machine's
# PMIx 5 components ("undefined symbol: pmix_output_info", then no compression: a 12-line
# warning on every mpirun; issue 19).
export PMIX_PREFIX="$_fsdp_r" PMIX_EXEC_PREFIX="$_fsdp_r" PMIX_BINDIR="$FSDP_BUNDLE/bin"
export PMIX_LIBDIR="$_fsdp_r/lib" PMIX_PKGLIBDIR="$_fsdp_r/lib/pmix"
export PMIX_DATAROOTDIR="$_fsdp_r/share" PMIX_DATADIR="$_fsdp_r/share"
export PMIX_PKGDATADIR="$_fsdp_r/share/pmix" PMIX_SYSCONFDIR="$_fsdp_r/etc"
export PMIX_MCA_mca_base_component_path="$_fsdp_r/lib/pmix"
export HWLOC_PLUGINS_PATH="$_fsdp_r/lib/hwloc"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_orte_tmpdir_base="${OMPI_MCA_orte_tmpdir_base:-${TMPDIR:-/tmp}}"

_fsdp_ldconfig() { { /sbin/ldconfig -p || /usr/sbin/ldconfig -p || ldconfig -p; } 2>/dev/null; }
# Candidate directories for the CUDA libraries, in order of preference.
_fsdp_cands=()
if [[ -n "${FSDP_CUDA_LIB_DIRS:-}" ]]; then IFS=: read -r -a _fsdp_cands <<<"$FSDP_CUDA_LIB_DIRS"; fi
for _fsdp_d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
  [[ -n "$_fsdp_d" ]] && _fsdp_cands+=("$_fsdp_d/lib64" "$_fsdp_d/lib" "$_fsdp_d/targets/x86_64-linux/lib")
done
while IFS= read -r _fsdp_d; do [[ -n "$_fsdp_d" ]] && _fsdp_cands+=("$_fsdp_d"); done < <(
  PATH="$FSDP_SAVED_PATH" LD_LIBRARY_PATH="$FSDP_SAVED_LD_LIBRARY_PATH" python3 -c '
import glob, os
try:
    import nvidia  # the namespace package of the nvidia-* wheels that PyTorch depends on
    roots = list(nvidia.__path__)
except Exception:
    import site
    roots = [os.path.join(p, "nvidia") for p in site.getsitepackages()]
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "*", "lib"))):
        print(d)
' 2>/dev/null || true)
FSDP_CUDA_LIB_REPORT="" FSDP_CUDA_LIB_MISSING="" _fsdp_cuda_path=""
while IFS= read -r _fsdp_so; do
  [[ -z "$_fsdp_so" ]] && continue
  _fsdp_hit=""
  for _fsdp_d in "${_fsdp_cands[@]}"; do
    if [[ -e "$_fsdp_d/$_fsdp_so" ]]; then _fsdp_hit="$_fsdp_d"; break; fi
  done
  if [[ -n "$_fsdp_hit" ]]; then
    case ":$_fsdp_cuda_path:" in *":$_fsdp_hit:"*) ;; *) _fsdp_cuda_path="${_fsdp_cuda_path:+$_fsdp_cuda_path:}$_fsdp_hit" ;; esac
    FSDP_CUDA_LIB_REPORT+="$_fsdp_so -> $(readlink -f "$_fsdp_hit/$_fsdp_so")"$'\n'
  else
    _fsdp_sys="$(_fsdp_ldconfig | awk -v n="$_fsdp_so" '$1 == n { print $NF; exit }')"
    if [[ -n "$_fsdp_sys" ]]; then
      FSDP_CUDA_LIB_REPORT+="$_fsdp_so -> $(readlink -f "$_fsdp_sys") (ldconfig)"$'\n'
    else
      FSDP_CUDA_LIB_MISSING+="$_fsdp_so "
    fi
  fi
done <"$FSDP_BUNDLE/cuda_libs.txt"
# The driver (libcuda.so.1) normally comes from ldconfig; else the usual container mounts.
_fsdp_drv=""
if ! grep -q 'libcuda\.so\.1 ' <<<"$(_fsdp_ldconfig)"; then  # (not a pipe: grep -q's SIGPIPE under pipefail)
  for _fsdp_d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib64 /usr/lib/x86_64-linux-gnu; do
    if [[ -e "$_fsdp_d/libcuda.so.1" ]]; then _fsdp_drv="$_fsdp_d"; break; fi
  done
fi
export FSDP_CUDA_LIB_REPORT FSDP_CUDA_LIB_MISSING

# libstdc++/libgcc_s: the system's, unless it lacks the newest GLIBCXX version the binaries need.
_fsdp_fallback=""
_fsdp_need="$(sed -n 's/^need_glibcxx=//p' "$FSDP_BUNDLE/manifest.txt")"
_fsdp_sys="$(_fsdp_ldconfig | awk '$1 == "libstdc++.so.6" && /x86-64/ { print $NF; exit }')"
if [[ -n "$_fsdp_sys" ]] && { [[ -z "$_fsdp_need" ]] || grep -aq "GLIBCXX_$_fsdp_need" "$(readlink -f "$_fsdp_sys")"; }; then
  FSDP_LIBSTDCXX="system $(readlink -f "$_fsdp_sys") (has GLIBCXX_$_fsdp_need)"
else
  _fsdp_fallback="$_fsdp_r/lib/fallback"
  FSDP_LIBSTDCXX="bundled lib/fallback (system ${_fsdp_sys:-libstdc++.so.6: none in ldconfig} lacks GLIBCXX_$_fsdp_need)"
fi
export FSDP_LIBSTDCXX

export PATH="$FSDP_BUNDLE/bin:$FSDP_SAVED_PATH"
LD_LIBRARY_PATH="$_fsdp_r/lib${_fsdp_fallback:+:$_fsdp_fallback}${_fsdp_cuda_path:+:$_fsdp_cuda_path}${_fsdp_drv:+:$_fsdp_drv}"
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH${FSDP_SAVED_LD_LIBRARY_PATH:+:$FSDP_SAVED_LD_LIBRARY_PATH}"
unset _fsdp_id _fsdp_tmp _fsdp_r _fsdp_so _fsdp_hit _fsdp_d _fsdp_sys _fsdp_drv _fsdp_cuda_path _fsdp_fallback _fsdp_need _fsdp_cands
unset -f _fsdp_ldconfig
if [[ -n "$FSDP_CUDA_LIB_MISSING" ]]; then
  echo "gpu_bundle/env.sh: WARNING: CUDA libraries not found: $FSDP_CUDA_LIB_MISSING(set FSDP_CUDA_LIB_DIRS)" >&2
fi
ENVSH

# ---- 9. manifest --------------------------------------------------------------------------------
# GPU code in fsdp_train: machine code (sm_XX) and PTX (compute_XX), by cuobjdump when the
# toolkit has it, else from the CUDA compile flags of the build.
CUOBJDUMP="$(dirname "$(cache CMAKE_CUDA_COMPILER)")/cuobjdump"
ARCHS=""
if [[ -x "$CUOBJDUMP" ]]; then
  ARCHS="$( { "$CUOBJDUMP" --list-elf "$B/bin/fsdp_train"; "$CUOBJDUMP" --list-ptx "$B/bin/fsdp_train"; } 2>/dev/null |
    grep -o -E '(sm|compute)_[0-9]+[a-z]?' | sort -u | tr '\n' ' ' | sed 's/ $//' || true)"
fi
if [[ -z "$ARCHS" ]]; then
  ARCHS="$(cat "$BUILD_DIR"/CMakeFiles/fsdp_lib_cuda.dir/flags.make 2>/dev/null |
    grep -o -E -- '(--generate-code|-gencode)[= ][^ ]*' | sed 's/.*code=//' | tr -d '[]' | tr ',' '\n' |
    sort -u | tr '\n' ' ' | sed 's/ $//' || true)"
fi
ARCHS="${ARCHS:-unknown}"
COMMIT="$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)"
DIRTY="$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
NVCC="$(cache CMAKE_CUDA_COMPILER)"
{
  echo "# fsdp_train GPU bundle (tools/gpu_bundle.sh); key=value"
  echo "created=$(date -u +%Y-%m-%dT%H:%MZ)"
  echo "commit=$COMMIT"
  echo "modified_tracked_files=$DIRTY"
  echo "build_dir=$BUILD_DIR"
  echo "source_dir=$SOURCE_DIR"
  echo "build_type=$(cache CMAKE_BUILD_TYPE)"
  echo "cuda_architectures=$ARCHS"
  echo "cuda_flags=$(cache CMAKE_CUDA_FLAGS)"
  echo "nvcc=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "cxx=$("$(cache CMAKE_CXX_COMPILER)" -dumpfullversion 2>/dev/null)"
  echo "openmpi=$OMPI_VERSION"
  echo "build_os=$(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "build_glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')"
  echo "need_glibc=$NEED_GLIBC"
  echo "need_glibcxx=$NEED_GLIBCXX"
  echo "need_cxxabi=$NEED_CXXABI"
  echo "cuda_libs=$(tr '\n' ' ' <"$B/cuda_libs.txt" | sed 's/ $//')"
  echo "gpu_tests=$(grep -v '^#' "$B/gpu_tests.txt" | cut -f1 | tr '\n' ' ' | sed 's/ $//')"
  # shellcheck disable=SC2010
  echo "libraries=$(ls "$P/lib" | grep '\.so' | tr '\n' ' ' | sed 's/ $//')"
  echo "mca_components=$(ls "$P/lib/openmpi" | wc -l) (left out: $NSKIP needing UCX/libfabric/verbs/PSM/Slurm)"
  echo "payload_id=$PAYLOAD_ID"
  echo "payload_unpacked_bytes=$PAYLOAD_BYTES"
} >"$B/manifest.txt"

# ---- 10. size -----------------------------------------------------------------------------------
BYTES="$(du -sb "$B" | cut -f1)"
MIB="$(awk -v b="$BYTES" 'BEGIN { printf "%.1f", b / 1048576 }')"
# (A file deleted but not yet staged is still in `git ls-files`: du skips it, and its error must
# not stop the script, hence `|| true`.)
TREE="$(cd "$REPO" && { git ls-files -z; git ls-files -z --others --exclude-standard; } |
  xargs -0 du -cb 2>/dev/null | awk '$2 == "total" { t += $1 } END { print t + 0 }' || true)"
{
  echo "size_bytes=$BYTES"
  echo "size_files=$(find "$B" -type f -printf '%s %P\n' | sort -rn | awk '{ printf "%s%s:%s", (NR > 1 ? " " : ""), $2, $1 }')"
} >>"$B/manifest.txt"
say "bundle: $MIB MiB in $(find "$B" -type f | wc -l) files (payload unpacks to $((PAYLOAD_BYTES / 1048576)) MiB); largest:"
find "$B" -type f -printf '%s %P\n' | sort -rn | head -6 | awk '{ printf "  %7.2f MiB  %s\n", $1 / 1048576, $2 }' >&2
if (( BYTES > LIMIT_MIB * 1048576 )); then
  die "bundle is $MIB MiB, over the ${LIMIT_MIB} MiB limit (GPU_BUNDLE_LIMIT_MIB); docs/gpu.md \"Workflow\" lists what makes it smaller"
fi
if (( BYTES > WARN_MIB * 1048576 )); then
  say "WARNING: bundle is $MIB MiB, over ${WARN_MIB} MiB (GPU_BUNDLE_WARN_MIB): little room left for a carried gpu_base/ (the default, sm_90 with compressed fatbins, is far below)"
fi
if (( BYTES + TREE > 64 * 1048576 )); then
  die "bundle ($MIB MiB) + working tree ($((TREE / 1048576)) MiB) exceed the run tool's 64 MiB"
fi

# ---- 11. self-check: from a clean environment, then with the system's copies hidden ------------
if [[ "$DO_CHECK" == 1 ]]; then
  CHECK="$(mktemp -d /tmp/gpu_bundle_check.XXXXXX)"
  trap 'rm -rf "$P"' EXIT
  { printf 'SYSTEM_RE=%q\nCUDA_RE=%q\n' "$SYSTEM_RE" "$CUDA_RE"; cat <<'CHK'
set -uo pipefail
B="$1" WORK="$2"
fail() { echo "CHECK FAILED: $*" >&2; exit 1; }
source "$B/env.sh"
R="$FSDP_BUNDLE_ROOT"
[[ -d "$R/lib/openmpi" ]] || fail "payload not unpacked into $R"
echo "  payload unpacked into $R; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
printf '%s' "$FSDP_CUDA_LIB_REPORT" | sed 's/^/  cuda: /'
echo "  libstdc++: $FSDP_LIBSTDCXX"
[[ -z "$FSDP_CUDA_LIB_MISSING" ]] || fail "CUDA libraries not found: $FSDP_CUDA_LIB_MISSING"
# Every library an ELF file of the bundle loads resolves inside the bundle, or is glibc /
# libstdc++ / libgcc_s, or a CUDA library.
bad=0
for f in "$B"/bin/* "$R"/lib/*.so* "$R"/lib/openmpi/*.so "$R"/lib/pmix/*.so; do
  while read -r name _ path _; do
    case "$path" in "$R"/*) continue ;; esac
    if [[ "$name" =~ $SYSTEM_RE || "$name" =~ $CUDA_RE ]] && [[ "$path" != not ]]; then continue; fi
    echo "  $(basename "$f"): $name => $path" >&2; bad=1
  done < <(ldd "$f" 2>/dev/null | grep '=>')
done
[[ "$bad" == 0 ]] || fail "libraries resolved outside the bundle (above)"
echo "  ldd: every non-system, non-CUDA library of bin/ and the payload resolves inside the bundle"
[[ "$(command -v mpirun)" == "$B/bin/mpirun" ]] || fail "mpirun is $(command -v mpirun), not the bundle's"
# Nothing of the machine's own Open MPI / PMIx may be loaded: no component load errors (the
# isolated check below plants broken components where the system keeps its own).
quiet() {  # $1 = what ran, $2 = its output
  if grep -q -E 'undefined symbol|mca_base_component_repository_open|unable to open|unable to find a usable|fsdp_foreign' <<<"$2"; then
    fail "$1 loaded a component that is not the bundle's: $2"
  fi
}
out="$(mpirun -np 2 --oversubscribe hostname 2>&1 </dev/null)" || fail "mpirun -np 2 hostname: $out"
quiet "mpirun -np 2 hostname" "$out"
[[ "$(grep -c . <<<"$out")" == 2 ]] || fail "mpirun -np 2 hostname printed: $out"
echo "  mpirun -np 2 --oversubscribe hostname: ok"
v="$("$B/bin/fsdp_train" --version 2>&1 </dev/null)" || fail "fsdp_train --version: $v"
echo "  gpu_bundle/bin/fsdp_train --version (singleton): $v"
v="$(mpirun -np 2 --oversubscribe fsdp_train --version 2>&1 </dev/null)" || fail "mpirun -np 2 fsdp_train --version: $v"
quiet "mpirun -np 2 fsdp_train --version" "$v"
echo "  mpirun -np 2 fsdp_train --version: ok"
for t in fsdp_prepare fsdp_merge; do "$t" --help >/dev/null 2>&1 </dev/null || fail "$t --help"; done
echo "  fsdp_prepare --help, fsdp_merge --help: ok"
# Two ranks, CPU device: OpenBLAS, OpenMP, MPI collectives, HDF5 checkpoint, all from the bundle.
cat >"$WORK/tiny.toml" <<EOF
[model]
n_layer = 2
n_head = 2
n_embd = 32
n_positions = 32
vocab_size = 64
[data]
source = "synthetic"
seq_len = 32
[train]
global_batch_size = 4
max_steps = 2
log_every = 1
num_threads = 1
device = "cpu"
run_dir = "$WORK/run"
[optim]
warmup_steps = 1
[checkpoint]
every = 0
[eval]
every = 0
max_windows = 1
EOF
log="$(mpirun -np 2 --oversubscribe --bind-to none fsdp_train "$WORK/tiny.toml" 2>&1 </dev/null)" ||
  fail "2-rank CPU training run: $log"
quiet "2-rank CPU training run" "$log"
ls "$WORK/run/checkpoints"/step_*/*.h5 >/dev/null 2>&1 || fail "no HDF5 checkpoint written: $log"
fsdp_merge "$(ls -d "$WORK/run/checkpoints"/step_* | tail -1)" "$WORK/hf" >/dev/null 2>&1 </dev/null ||
  fail "fsdp_merge of the checkpoint"
[[ -s "$WORK/hf/model.safetensors" ]] || fail "fsdp_merge wrote no model.safetensors"
echo "  mpirun -np 2 fsdp_train (CPU, 2 steps, HDF5 checkpoint) + fsdp_merge: ok"
# The gpu tests start (MPI_Init, cudaGetDeviceCount): exit 77 without a GPU, 0 with one.
while IFS=$'\037' read -r name np _ _ env _ cmd; do
  [[ "$name" == \#* || -z "$name" ]] && continue
  eval "args=($cmd)"
  args=("${args[@]//@BUNDLE@/$B}")
  envs=(); [[ -n "$env" ]] && IFS=';' read -r -a envs <<<"$env"
  (cd "$WORK" && env "${envs[@]}" timeout 300 "${args[@]}" </dev/null >"$WORK/$name.log" 2>&1); rc=$?
  case "$rc" in
    77) echo "  $name: starts, MPI up at $np rank(s), exit 77 (no CUDA device here)" ;;
    0) echo "  $name: passed" ;;
    *) tail -20 "$WORK/$name.log" >&2; fail "$name exited $rc" ;;
  esac
done < <(tr '\t' '\037' <"$B/gpu_tests.txt")
echo "  all checks passed"
CHK
  } >"$CHECK/check.sh"
  CLEAN=(env -i "PATH=/usr/bin:/bin" "HOME=${HOME:-/root}" "TMPDIR=/tmp" "FSDP_BUNDLE_ROOT=$CHECK/root")
  say "self-check (clean environment: env -i PATH=/usr/bin:/bin, source $REL/env.sh)"
  "${CLEAN[@]}" bash "$CHECK/check.sh" "$B" "$CHECK" >&2 || die "self-check failed (logs in $CHECK)"
  # Again with the system's Open MPI, PMIx, hwloc plugins, every bundled library and xz hidden:
  # a private mount namespace (unshare -m) with /dev/null or an empty dir bind-mounted over
  # them (root only; nothing outside the namespace sees the mounts).
  if [[ "$(id -u)" == 0 ]] && command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
    say "self-check with the system copies hidden (unshare -m; bind mounts over the bundled libraries, mpirun/orted/ompi_info, xz, Open MPI/PMIx dirs; the payload unpacked by python3)"
    rm -rf "$CHECK/run" "$CHECK/hf" "$CHECK/root"
    mkdir -p "$CHECK/empty"
    # A shared object that cannot be loaded: it refers to a data symbol nothing defines
    # (resolved at dlopen even with RTLD_LAZY), named as PMIx 5's missing symbol.
    foreign_so() {
      printf 'extern int pmix_output_info;\nint *fsdp_foreign_ref = &pmix_output_info;\n' >"$CHECK/foreign.c"
      cc -shared -fPIC -o "$1" "$CHECK/foreign.c" || die "cc could not build $1"
    }
    HIDE="$CHECK/hide.sh"
    {
      echo 'h() { mount --bind "$1" "$2" || echo "hide.sh: could not hide $2" >&2; }'
      # Not the ones this machine's python3, tar, bash and mount load themselves (libz): the
      # GPU machine has its own, and env.sh runs python3 there.
      keep=" $(for t in python3 tar bash mount; do ldd "$(PATH=/usr/bin:/bin command -v "$t")" 2>/dev/null; done | awk '{ printf "%s ", $1 }')"
      for n in "${!SEEN[@]}"; do
        [[ "$keep" == *" $n "* ]] || echo "h /dev/null '$(readlink -f "${SEEN[$n]}")'"
      done
      for t in mpirun mpiexec orterun orted ompi_info xz; do
        p="$(command -v "$t" || true)"; [[ -n "$p" ]] && echo "h /dev/null '$(readlink -f "$p")'"
      done
      # Where the system keeps Open MPI's and PMIx's components and config, a foreign machine's
      # (the GPU machine has Ubuntu's Open MPI 4.1 and PMIx 5 at the same paths): components
      # that fail to load (an undefined symbol, as PMIx 5's pmix_mca_pcompress_zlib.so under
      # the bundled PMIx 4.2: issue 19) and config files that point at them. Reading any of
      # them shows up as a load error, which `quiet` fails on. Without a C compiler: empty.
      for d in "$(dirname "$OMPI_PKGLIBDIR")" "$OMPI_PKGDATADIR" "$OMPI_SYSCONFDIR" \
               "$PMIX_ROOT" "${PMIX_ROOT:+$PMIX_ROOT/../share}" /usr/lib/x86_64-linux-gnu/hwloc; do
        [[ -n "$d" && -d "$d" ]] || continue
        d="$(readlink -f "$d")" f=""
        if command -v cc >/dev/null; then
          f="$CHECK/foreign$d"
          mkdir -p "$f"
          case "$d" in
            "$(readlink -f "$(dirname "$OMPI_PKGLIBDIR")")")
              mkdir -p "$f/$(basename "$OMPI_PKGLIBDIR")"
              foreign_so "$f/$(basename "$OMPI_PKGLIBDIR")/mca_shmem_fsdp_foreign.so" ;;
            "$(readlink -f "$OMPI_SYSCONFDIR")")
              echo "mca_base_component_path = $OMPI_PKGLIBDIR" >"$f/openmpi-mca-params.conf" ;;
            "$(readlink -f "${PMIX_ROOT:-/nonexistent}")")
              mkdir -p "$f/pmix"
              foreign_so "$f/pmix/pmix_mca_pcompress_zlib.so" ;;
            "$(readlink -f "${PMIX_ROOT:-/nonexistent}/../share")")
              mkdir -p "$f/pmix"
              echo "mca_base_component_path = $PMIX_ROOT/pmix" >"$f/pmix-mca-params.conf" ;;
          esac
        fi
        echo "h '${f:-$CHECK/empty}' '$d'"
      done
      printf '%q ' exec "${CLEAN[@]}" bash "$CHECK/check.sh" "$B" "$CHECK"; echo
    } >"$HIDE"
    unshare -m bash "$HIDE" >&2 || die "isolated self-check failed (logs in $CHECK; mounts: $HIDE)"
  else
    say "(not root or no unshare: isolated self-check skipped)"
  fi
  rm -rf "$CHECK"
fi

say "done: $REL ($MIB MiB). GPU machine: run tool with carry [\"$REL\"], command tools/gpu_check.sh"
echo "$REL"
