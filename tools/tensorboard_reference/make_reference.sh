#!/usr/bin/env bash
# Regenerates train/tensorboard/testdata/reference.tfevents (an event file
# written by TensorBoard's own Python writer, which //train/tensorboard:
# events_test parses and reproduces byte for byte) with `tensorboard` from PyPI.
#
#   tools/tensorboard_reference/make_reference.sh            # create or reuse the venv
#   tools/tensorboard_reference/make_reference.sh --upgrade  # newest release first
#
# The virtual environment is $LOOM_TENSORBOARD_VENV (default
# ~/.cache/loom/tensorboard-venv). Nothing here is needed by `bazel test //...`.
set -euo pipefail

VENV="${LOOM_TENSORBOARD_VENV:-$HOME/.cache/loom/tensorboard-venv}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in -h|--help) sed -n '2,10p' "$0"; exit 0 ;; esac
source "$HERE/../reference_venv.sh"
ensure_reference_venv "$VENV" "tensorboard" "tensorboard" "$@"

"$VENV/bin/python" "$HERE/make_reference.py"
