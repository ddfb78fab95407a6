#!/usr/bin/env bash
# Sets up, builds, generates the embedded default model once (cached in
# models/default) and prefills the default prompt on it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
MODEL=models/default
if [ ! -f "$MODEL/config.json" ]; then
  build/dsv4 gen-model --preset tiny --seed 0 --out "$MODEL.tmp"
  rm -rf "$MODEL" && mv "$MODEL.tmp" "$MODEL"
fi
PROMPT=${1:-"The quick brown fox jumps over the lazy dog."}
build/dsv4 prefill --model "$MODEL" --prompt "$PROMPT"
