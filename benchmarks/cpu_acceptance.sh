#!/usr/bin/env bash
# Issue 56's CPU checks on this machine, in one go, for the note: from a fresh clone of this checkout's HEAD, the
# install, the tests of `make test` and `make run` timed one after the other, then batch-1 decoding's share of the copy
# bandwidth and soft/standard (`fullband bench --sections limits,decode --rounds 3 --threads 2`). About 15 minutes on
# 2 cores. Run it on quiet cores (pause anything else): the timings are the point.
#
#   bash benchmarks/cpu_acceptance.sh [CLONE_DIR]      # default /tmp/fullband-acceptance (removed first)
#
# Prints a block to paste, with the CPU's name and whether it has avx512_bf16 (AVX-512 or AVX2-only).
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dir=${1:-/tmp/fullband-acceptance}
rm -rf "$dir"
git clone -q "$repo" "$dir"
cd "$dir"
log=$dir/acceptance.log
minutes() { awk -v s="$1" 'BEGIN { printf "%.1f min (%d s)", s / 60, s }'; }
timed() {  # timed NAME COMMAND...: run it (output to the log), keep its time in the variable NAME
  local name=$1 start=$SECONDS
  shift
  "$@" >>"$log" 2>&1 || { echo "$* failed: see $log" >&2; exit 1; }
  printf -v "$name" '%s' "$(minutes $((SECONDS - start)))"
}
timed install make setup
timed tests make test
timed main make run
bench=$(.venv/bin/fullband bench --sections limits,decode --rounds 3 --threads 2 2>>"$log")
tests_line=$(grep -E '^[0-9]+ passed' "$log" | tail -1)
cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
kind=$(grep -q -w avx512_bf16 /proc/cpuinfo && echo "AVX-512 with avx512_bf16" || echo "no avx512_bf16")
grep -q -w avx512f /proc/cpuinfo || kind="AVX2 only"
cat <<EOF
CPU: $cpu ($kind), $(nproc) cores; commit $(git rev-parse --short HEAD); $(date -u +%Y-%m-%d)
install (make setup): $install
make test after it: $tests: $tests_line
make run after it: $main
$bench
EOF
