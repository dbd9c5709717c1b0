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
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in -h|--help) sed -n '2,12p' "$0"; exit 0 ;; esac
source "$HERE/../reference_venv.sh"
ensure_reference_venv "$VENV" "tokenizers sentencepiece" "tokenizers sentencepiece" "$@"

"$VENV/bin/python" "$HERE/make_reference.py"
