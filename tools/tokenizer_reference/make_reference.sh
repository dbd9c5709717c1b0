#!/usr/bin/env bash
# Regenerates train/data/testdata/tokenizers/ (reference tokenizers and their
# encodings, compared exactly by //train/data:hf_tokenizer_test and
# //train/data:sentencepiece_tokenizer_test) with Hugging Face `tokenizers`
# and `sentencepiece` from PyPI.
#
#   tools/tokenizer_reference/make_reference.sh            # create or reuse the venv
#   tools/tokenizer_reference/make_reference.sh --upgrade  # newest releases first
#   tools/tokenizer_reference/make_reference.sh 'tokenizers==0.21.0'   # pin something
#
# The virtual environment is $LOOM_TOKENIZER_VENV (default
# ~/.cache/loom/tokenizer-venv). Nothing here is needed by `bazel test //...`.
set -euo pipefail

VENV="${LOOM_TOKENIZER_VENV:-$HOME/.cache/loom/tokenizer-venv}"
PACKAGES=(tokenizers sentencepiece)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

upgrade=()
pins=()
for a in "$@"; do
  case "$a" in
    --upgrade) upgrade=(--upgrade) ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) pins+=("$a") ;;
  esac
done

if [ ! -x "$VENV/bin/python" ]; then
  echo "make_reference.sh: creating $VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
fi

if [ ${#upgrade[@]} -eq 0 ] && [ ${#pins[@]} -eq 0 ] &&
   "$VENV/bin/python" -c 'import tokenizers, sentencepiece' 2>/dev/null; then
  echo "make_reference.sh: $VENV already has ${PACKAGES[*]}"
else
  "$VENV/bin/python" -m pip install --quiet ${upgrade[@]+"${upgrade[@]}"} "${PACKAGES[@]}" \
    ${pins[@]+"${pins[@]}"}
fi

"$VENV/bin/python" "$HERE/make_reference.py"
