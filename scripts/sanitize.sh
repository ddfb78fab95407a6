#!/usr/bin/env bash
# Builds and runs the test suite under sanitizers (CMakePresets.json):
#
#   bash scripts/sanitize.sh [asan|tsan|all]     (default: asan)
#
# asan: everything (library, dsv4, tests) built with g++ -fsanitize=address,undefined
#       -fno-sanitize-recover=all into build-asan/, the whole suite run by
#       ctest --preset asan: any ASan/UBSan/LSan report fails its test. The
#       one test left out is Prompts/TileSizes.BitwiseIdenticalToWholePrompt/8192
#       (~12 minutes under ASan on 2 cores; the 1..1000-token sweeps, the
#       8192-token CacheBytes run and the Release suite cover the same code).
#       The serve tests (tests/serve, ctest -L serve) run against the ASan
#       server with their load and fuzz phases cut to a tenth.
# tsan: build-tsan/ with -fsanitize=thread; ctest --preset tsan runs the
#       threaded tests (thread counts, linear/attention/MoE/compressor/indexer
#       kernels, tiling sweeps up to 300 tokens, the cache pool, the SIGBUS and
#       NaN CLI paths, and the server under tests/serve's curl and load
#       tests, scaled down), TSAN_OPTIONS=halt_on_error=1.
# Prints ctest's summary line per suite; exits non-zero when a suite fails.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-asan}
case "$what" in
  asan) suites=(asan) ;;
  tsan) suites=(tsan) ;;
  all) suites=(asan tsan) ;;
  *) echo "usage: scripts/sanitize.sh [asan|tsan|all]" >&2; exit 2 ;;
esac

# The packages, the tokenizer the tests need, and the Release build.
bash scripts/setup.sh

status=0
for s in "${suites[@]}"; do
  start=$(date +%s)
  cmake --preset "$s" >/dev/null
  cmake --build --preset "$s" >/dev/null
  built=$(date +%s)
  echo "sanitize: $s built in $((built - start)) s"
  if ctest --preset "$s" -j "$(nproc)"; then
    echo "sanitize: $s passed ($(( $(date +%s) - built )) s of tests)"
  else
    echo "sanitize: $s FAILED ($(( $(date +%s) - built )) s of tests)"
    status=1
  fi
done
exit $status
