#!/usr/bin/env bash
# Peak RSS against prompt length (issue: activation memory must not grow with
# N): prefills N = 1024 and N = 8192 on a model and checks that the growth of
# peak RSS stays within the growth of the request's cache pages + 32 MiB.
# usage: bench/rss_growth.sh [MODEL_DIR]   (default: a fresh tiny model)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/dsv4}
MODEL=${1:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "$MODEL" ]; then
  MODEL=$tmp/tiny
  "$BIN" gen-model --preset tiny --seed 0 --out "$MODEL" >/dev/null
fi
vocab=$(grep -o '"vocab_size": *[0-9]*' "$MODEL/config.json" | grep -o '[0-9]*$')
run() {  # N -> "cache_bytes peak_rss_bytes seconds"
  awk -v n="$1" -v v="$vocab" 'BEGIN { srand(1); printf "[0"; for (i = 1; i < n; i++) printf ",%d", 3 + int(rand() * (v - 3)); print "]" }' >"$tmp/p$1.json"
  "$BIN" prefill --model "$MODEL" --tokens "$tmp/p$1.json" --json |
    grep -o '"cache_bytes":[0-9]*\|"peak_rss_bytes":[0-9]*\|"seconds":[0-9.e-]*' | cut -d: -f2 | paste -sd' '
}
read -r c1 r1 s1 <<<"$(run 1024)"
read -r c8 r8 s8 <<<"$(run 8192)"
awk -v c1="$c1" -v r1="$r1" -v c8="$c8" -v r8="$r8" -v s1="$s1" -v s8="$s8" 'BEGIN {
  mib = 1048576
  printf "N=1024: cache %.2f MiB, peak RSS %.1f MiB, %.2f s\n", c1 / mib, r1 / mib, s1
  printf "N=8192: cache %.2f MiB, peak RSS %.1f MiB, %.2f s\n", c8 / mib, r8 / mib, s8
  growth = r8 - r1; budget = (c8 - c1) + 32 * mib
  printf "RSS growth %.1f MiB, allowed (cache growth + 32 MiB) %.1f MiB: %s\n", growth / mib, budget / mib,
         growth <= budget ? "OK" : "TOO MUCH"
  exit growth <= budget ? 0 : 1
}'
