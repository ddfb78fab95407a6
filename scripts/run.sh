#!/usr/bin/env bash
# Sets up, builds, generates the embedded default model once (cached in
# models/default: the tiny preset with DeepSeek-V4's real vocabulary of
# 129,280 tokens and its tokenizer.json), then runs the default prompt (or $1)
# as one V4 chat turn: the prefill's next token and top-5, then 16 generated
# tokens as text. The weights are random, so the text is too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
MODEL=models/default
TOKENIZER=.cache/tokenizer/deepseek-v4/tokenizer.json
# A default model from before the real vocabulary (vocab 1024) is replaced.
if [ ! -f "$MODEL/config.json" ] || ! grep -q '"vocab_size": 129280' "$MODEL/config.json"; then
  rm -rf "$MODEL.tmp"
  build/dsv4 gen-model --preset tiny --vocab 129280 --seed 0 --out "$MODEL.tmp"
  rm -rf "$MODEL" && mv "$MODEL.tmp" "$MODEL"
fi
CHAT=()
if [ -f "$TOKENIZER" ]; then
  [ "$MODEL/tokenizer.json" -nt "$TOKENIZER" ] || cp "$TOKENIZER" "$MODEL/tokenizer.json"
  CHAT=(--chat)
else
  echo "run: WARNING: no tokenizer (see the set-up's warning); the prompt's bytes are its token ids" >&2
fi
PROMPT=${1:-"The quick brown fox jumps over the lazy dog."}
build/dsv4 prefill --model "$MODEL" "${CHAT[@]}" --prompt "$PROMPT"
build/dsv4 generate --model "$MODEL" "${CHAT[@]}" --prompt "$PROMPT" --max-new-tokens 16
