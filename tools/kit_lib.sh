# shellcheck shell=bash
# tools/kit_lib.sh: shell functions the GPU kit's scripts share (gpu_check.sh, gpu_kernel_ab.sh,
# bench_gpu.sh source it).

# kill_tagged VAR TAG: kill -9 every process whose environment holds VAR=TAG, but this shell
# and its subshell, and print how many. What a timed-out run leaves behind: Open MPI puts each
# rank in its own process group, which `timeout` does not reach, and mpirun passes the
# launching environment on, so every process of a run carries the tag. By pid, from /proc.
kill_tagged() {
  local f p n=0
  while IFS= read -r f; do
    p="${f#/proc/}" p="${p%%/*}"
    [[ "$p" == "$$" || "$p" == "$BASHPID" ]] && continue
    kill -9 "$p" 2>/dev/null && n=$((n + 1))
  done < <(grep -lzx -- "$1=$2" /proc/[0-9]*/environ 2>/dev/null)
  echo "$n"
}

# plain LOG: the log without colour codes and without the \r that ends each line: mpirun hands
# the ranks a pty, so gtest colours even into a file (GTEST_COLOR=no is set too; issue 19).
plain() { sed -e 's/\x1b\[[0-9;]*[A-Za-z]//g' -e 's/\r$//' "$1"; }
