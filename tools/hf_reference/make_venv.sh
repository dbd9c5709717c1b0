#!/usr/bin/env bash
# Creates (once) the Python virtual environment that makes Loom's Hugging Face
# reference data: torch, transformers, safetensors, numpy from PyPI.
#
#   tools/hf_reference/make_venv.sh                 # create or reuse
#   tools/hf_reference/make_venv.sh --upgrade       # move to the newest releases
#   tools/hf_reference/make_venv.sh 'transformers==4.46.3'   # pin something
#
# The folder is $LOOM_HF_VENV (default ~/.cache/loom/hf-venv). torch from PyPI
# is several GB (it brings CUDA libraries even though only the CPU is used):
# create the environment once and reuse it. Nothing here is needed by
# `bazel test //...`; it only regenerates checkpoint/hf/testdata.
set -euo pipefail

VENV="${LOOM_HF_VENV:-$HOME/.cache/loom/hf-venv}"
case "${1:-}" in -h|--help) sed -n '2,12p' "$0"; exit 0 ;; esac
source "$(dirname "${BASH_SOURCE[0]}")/../reference_venv.sh"
ensure_reference_venv "$VENV" "torch transformers safetensors numpy" \
  "torch transformers safetensors numpy" "$@"

"$VENV/bin/python" - <<'PY'
import numpy, safetensors, torch, transformers
print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
      f"safetensors {safetensors.__version__}, numpy {numpy.__version__}")
PY
echo "make_venv.sh: use $VENV/bin/python tools/hf_reference/make_reference.py"
