#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan) into
# build-fuzz/ and runs each for a fixed number of executions.
#
#   bash scripts/fuzz.sh [RUNS] [TARGET...]
#
# RUNS: executions per target (default 100000; the bar for a release is
# 1000000 or 30 minutes per target, docs/ERRORS.md). TARGETs: any of
#   safetensors_header checkpoint_index config tokens npy tokenizer_json tokenizer_encode
# (default: all). Environment: FUZZ_BUILD_DIR (default build-fuzz),
# FUZZ_MAX_TOTAL_TIME (seconds per target, default none), FUZZ_ARGS (more
# libFuzzer flags, e.g. -max_len=65536).
#
# Seeds are written by build-fuzz/fuzz/fuzz_make_seeds (the project's own
# writers) into build-fuzz/seeds/<target>/; the growing corpus is kept in
# build-fuzz/corpus/<target>/ across runs. A finding leaves its input in
# build-fuzz/artifacts/<target>/ and the script fails: fix the bug, then copy
# the input to fuzz/regressions/<target>/ so that tests/bad_input_test.cc
# (FuzzRegressions.ReplayThroughTheSameEntryPoints) replays it in every test
# run.
#
# tokenizer_encode fuzzes the V4 tokenizer that scripts/setup.sh builds
# (.cache/tokenizer/deepseek-v4/tokenizer.json; $DSV4_FUZZ_TOKENIZER picks
# another), or a small built-in one when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-100000}
shift || true
ALL=(safetensors_header checkpoint_index config tokens npy tokenizer_json tokenizer_encode)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL[@]}")
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}

# clang and its runtime libraries (libFuzzer, ASan, UBSan) from Debian.
CXX_BIN=""
for c in clang++-14 clang++; do
  if command -v "$c" >/dev/null; then CXX_BIN=$c; break; fi
done
packages=(clang-14 libclang-rt-14-dev cmake ninja-build pkg-config nlohmann-json3-dev libpcre2-dev libxxhash-dev libopenmpi-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "fuzz: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  CXX_BIN=clang++-14
fi

CXX=$CXX_BIN cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV4_FUZZ=ON \
  -DDSV4_SANITIZE=address,undefined -DDSV4_TESTS=OFF >/dev/null
ninja -C "$BUILD" >/dev/null
rm -rf "$BUILD/seeds"
"$BUILD/fuzz/fuzz_make_seeds" "$BUILD/seeds"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
summary=()
for t in "${TARGETS[@]}"; do
  bin="$BUILD/fuzz/fuzz_$t"
  if [ ! -x "$bin" ]; then
    echo "fuzz: no target '$t' (have: ${ALL[*]})" >&2
    exit 2
  fi
  mkdir -p "$BUILD/corpus/$t" "$BUILD/artifacts/$t" "$BUILD/seeds/$t"
  log="$BUILD/artifacts/$t.log"
  extra=()
  [ -n "${FUZZ_MAX_TOTAL_TIME:-}" ] && extra+=("-max_total_time=$FUZZ_MAX_TOTAL_TIME")
  echo "fuzz: $t, $RUNS runs (log: $log)"
  start=$(date +%s)
  # shellcheck disable=SC2086
  if "$bin" -runs="$RUNS" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$BUILD/artifacts/$t/" "${extra[@]}" ${FUZZ_ARGS:-} \
       "$BUILD/corpus/$t" "$BUILD/seeds/$t" >"$log" 2>&1; then
    result=ok
  else
    result="FINDING (see $log and $BUILD/artifacts/$t/)"
    status=1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1 || true)
  line=$(printf '%-20s %10s execs %6ss  %s' "$t" "${execs:-?}" "$(( $(date +%s) - start ))" "$result")
  echo "fuzz: $line"
  summary+=("$line")
done

echo "fuzz summary:"
printf '  %s\n' "${summary[@]}"
exit $status
