#!/usr/bin/env bash
# Runs every command line of the README's usage block, verbatim, and fails
# when one exits non-zero or names a placeholder (DIR, IN.npy, ...) instead
# of a real path.
#
#   tests/readme_usage_test.sh BUILD_DIR SOURCE_DIR [FILE]
#
# FILE (default SOURCE_DIR/README.md) holds the block: the lines between
# `<!-- usage:begin -->` and `<!-- usage:end -->` if the file has those
# markers, else the first indented code block after the `## Using it`
# heading. Each line is one command, indented four spaces; a trailing
# `# comment` is a comment. The lines run in order, each under bash, from a
# fresh directory that holds
#   build     -> BUILD_DIR
#   examples  -> SOURCE_DIR/examples
#   models/default  made as scripts/run.sh makes it (the tiny preset with
#                   the real vocabulary and SOURCE_DIR/.cache's tokenizer.json)
#   models/tiny     made by the block's own gen-model line, or here if the
#                   block uses it without making it
# Lines that start with `mpirun` run only where mpirun is installed, with
# --oversubscribe --bind-to none (two cores run four ranks) and the
# variables Open MPI needs under root.
set -uo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR [FILE]" >&2
  exit 2
fi
BUILD_DIR=$(cd "$1" && pwd) || exit 2
SOURCE_DIR=$(cd "$2" && pwd) || exit 2
FILE=${3:-$SOURCE_DIR/README.md}
LINE_TIMEOUT=${README_USAGE_LINE_TIMEOUT:-300}
DSV4=$BUILD_DIR/dsv4
[ -x "$DSV4" ] || { echo "FAIL: $DSV4 is not built" >&2; exit 1; }
[ -f "$FILE" ] || { echo "FAIL: no $FILE" >&2; exit 1; }

# --- the block -------------------------------------------------------------
extract_block() {
  if grep -q '<!-- usage:begin -->' "$1"; then
    awk '/<!-- usage:end -->/ { exit } on && /^    [^ ]/ { sub(/^    /, ""); print } /<!-- usage:begin -->/ { on = 1 }' "$1"
  else
    # From "## Using it" to the first blank line after the first indented line.
    awk '/^## / { if (on) exit; if ($0 ~ /^## Using it[[:space:]]*$/) on = 1; next }
         on && /^    [^ ]/ { sub(/^    /, ""); print; started = 1; next }
         on && started { exit }' "$1"
  fi
}
mapfile -t LINES < <(extract_block "$FILE")
if [ ${#LINES[@]} -eq 0 ]; then
  echo "FAIL: no usage block in $FILE (a '## Using it' heading followed by lines indented four spaces)" >&2
  exit 1
fi

# --- placeholders ----------------------------------------------------------
# A word in capitals (DIR, FILE, IN.npy, OUT.npy, ...) outside quotes and
# comments is a placeholder unless it is a variable assignment (NAME=...).
placeholders() {
  local s=$1
  s=$(printf '%s' "$s" | sed -E "s/\"[^\"]*\"//g; s/'[^']*'//g; s/(^|[[:space:]])#.*$//")
  printf '%s\n' "$s" | grep -oE '(^|[^A-Za-z0-9_=.-])[A-Z][A-Z0-9_]+([^A-Za-z0-9_=]|$)' |
    grep -oE '[A-Z][A-Z0-9_]+' | sort -u | tr '\n' ' '
}
status=0
for line in "${LINES[@]}"; do
  p=$(placeholders "$line")
  if [ -n "$p" ]; then
    echo "FAIL: placeholder ($p) in a usage line; use a real path (models/tiny, models/default, examples/...):"
    echo "    $line"
    status=1
  fi
done
[ $status -eq 0 ] || exit 1

# --- the working directory -------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-readme.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ln -s "$BUILD_DIR" "$WORK/build"
ln -s "$SOURCE_DIR/examples" "$WORK/examples"
mkdir -p "$WORK/models"
cd "$WORK" || exit 1
block=$(printf '%s\n' "${LINES[@]}")

if grep -q 'models/default' <<<"$block"; then
  # As scripts/run.sh makes it.
  if ! out=$("$DSV4" gen-model --preset tiny --vocab 129280 --seed 0 --out models/default 2>&1); then
    echo "FAIL: could not make models/default:"; echo "$out"; exit 1
  fi
  TOKENIZER=$SOURCE_DIR/.cache/tokenizer/deepseek-v4/tokenizer.json
  if [ -f "$TOKENIZER" ]; then
    cp "$TOKENIZER" models/default/tokenizer.json
  else
    echo "note: no $TOKENIZER (scripts/setup.sh builds it); lines that need models/default's tokenizer will fail"
  fi
fi
if grep -q 'models/tiny' <<<"$block" && ! grep -q -- '--out models/tiny' <<<"$block"; then
  "$DSV4" gen-model --preset tiny --seed 0 --out models/tiny >/dev/null 2>&1 || { echo "FAIL: could not make models/tiny"; exit 1; }
fi

# --- the lines -------------------------------------------------------------
have_mpirun=0
command -v mpirun >/dev/null 2>&1 && have_mpirun=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
# shellcheck disable=SC2016
# (Under ASan, Open MPI's own allocations would count as leaks.)
MPIRUN_FN='mpirun() { ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" command mpirun --oversubscribe --bind-to none "$@"; }'
ran=0 skipped=0
for line in "${LINES[@]}"; do
  if [[ $line == mpirun* ]] && [ $have_mpirun -eq 0 ]; then
    echo "skip (no mpirun): $line"
    skipped=$((skipped + 1))
    continue
  fi
  start=$SECONDS
  out=$(timeout "$LINE_TIMEOUT" bash -c "$MPIRUN_FN"$'\n'"$line" 2>&1 </dev/null)
  rc=$?
  ran=$((ran + 1))
  if [ $rc -ne 0 ]; then
    echo "FAIL (exit $rc$([ $rc -eq 124 ] && echo ", over ${LINE_TIMEOUT} s")): $line"
    printf '%s\n' "$out" | tail -n 40 | sed 's/^/    | /'
    status=1
  else
    echo "ok ($((SECONDS - start)) s): $line"
  fi
done
echo "$ran lines run, $skipped skipped, $( [ $status -eq 0 ] && echo all passed || echo some FAILED )"
exit $status
