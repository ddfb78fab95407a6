#!/usr/bin/env bash
# Installs what the client-side tests of `dsv4 serve` (tests/serve/) need,
# only what is missing: Debian's nodejs and npm, Debian's chromium (driven by
# playwright-core in tests/serve/chat_page.test.mjs), and the pinned npm
# packages of tests/serve/package-lock.json (`npm ci`, again whenever the
# lock file is newer than tests/serve/node_modules). Safe to run again.
# Called at the end of scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup_serve_tests: installing $*"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

missing=()
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
[ -x /usr/bin/chromium ] || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  apt_install "${missing[@]}"
fi

dir=tests/serve
stamp=$dir/node_modules/.package-lock.json
if [ ! -f "$stamp" ] || [ "$dir/package-lock.json" -nt "$stamp" ] || [ "$dir/package.json" -nt "$stamp" ]; then
  echo "setup_serve_tests: npm ci in $dir"
  (cd "$dir" && timeout 600 npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
echo "setup_serve_tests: node $(node --version), $(/usr/bin/chromium --version 2>/dev/null | head -1), $dir/node_modules ready"
