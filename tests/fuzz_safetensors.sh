#!/usr/bin/env bash
# Fuzzes the safetensors reader with libFuzzer + ASan + UBSan (ctest `fuzz_safetensors`).
#   tests/fuzz_safetensors.sh SOURCE_DIR WORK_DIR [SECONDS]
# Compiles tests/fuzz_safetensors.cpp with src/checkpoint/safetensors.cpp using clang++
# ($FSDP_FUZZ_CXX, default /usr/bin/clang++; the main build may use GCC), only when a source
# is newer than the binary; writes a seed corpus (the binary's FSDP_FUZZ_MAKE_SEEDS mode) plus
# tests/fuzz/regressions/ (inputs that once found a bug), then fuzzes for SECONDS (default 30)
# with tests/fuzz/safetensors.dict. The corpus grows in WORK_DIR/corpus across runs. Exit 0: no finding. Otherwise libFuzzer's report is printed and
# the reproducer is WORK_DIR/crash-* (rerun: WORK_DIR/fuzz_safetensors WORK_DIR/crash-...).
# Installs nothing: without clang++ or its libFuzzer runtime it fails, naming the packages.
set -euo pipefail
src=${1:?usage: fuzz_safetensors.sh SOURCE_DIR WORK_DIR [SECONDS]}
work=${2:?usage: fuzz_safetensors.sh SOURCE_DIR WORK_DIR [SECONDS]}
secs=${3:-30}
cxx=${FSDP_FUZZ_CXX:-/usr/bin/clang++}
die() { echo "fuzz_safetensors: $*" >&2; exit 1; }

command -v "$cxx" > /dev/null ||
  die "$cxx not found: install Debian packages clang and libclang-rt-14-dev (tools/install_deps.sh)"
mkdir -p "$work"
bin="$work/fuzz_safetensors"
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
     "$cxx" -fsanitize=fuzzer,address -x c++ - -o "$work/probe" 2> "$work/probe.log"; then
  cat "$work/probe.log" >&2
  die "$cxx cannot link -fsanitize=fuzzer,address: the libFuzzer/ASan runtime is missing (Debian: libclang-rt-14-dev for clang 14; tools/install_deps.sh)"
fi

# The Writer publishes through fsdp::AtomicFile (its descriptors owned by fsdp::UniqueFd,
# file_lock.cpp); names are escaped by fsdp::printable.
sources=("$src/tests/fuzz_safetensors.cpp" "$src/src/checkpoint/safetensors.cpp"
         "$src/src/core/atomic_file.cpp" "$src/src/core/file_lock.cpp" "$src/src/core/printable.cpp")
deps=("${sources[@]}" "$src/include/fsdp/checkpoint/safetensors.hpp" "$src/include/fsdp/core/error.hpp"
      "$src/include/fsdp/core/atomic_file.hpp" "$src/include/fsdp/core/file_lock.hpp"
      "$src/include/fsdp/core/dtype.hpp" "$0")
rebuild=0
[[ -x "$bin" ]] || rebuild=1
for d in "${deps[@]}"; do [[ "$d" -nt "$bin" ]] && rebuild=1; done
if ((rebuild)); then
  echo "fuzz_safetensors: compiling with $cxx"
  "$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$src/include" "${sources[@]}" -o "$bin.tmp"
  mv "$bin.tmp" "$bin"
fi

rm -rf "$work/seeds"
FSDP_FUZZ_MAKE_SEEDS="$work/seeds" "$bin"
cp "$src"/tests/fuzz/regressions/* "$work/seeds/"  # inputs that once found a bug
mkdir -p "$work/corpus"
rm -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
if ! "$bin" -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
     -dict="$src/tests/fuzz/safetensors.dict" -artifact_prefix="$work/" \
     -print_final_stats=1 "$work/corpus" "$work/seeds"; then
  die "FAILED: a finding above; reproducer: $(ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null | head -1)"
fi
echo "fuzz_safetensors: no finding in ${secs}s"
