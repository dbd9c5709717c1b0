#!/usr/bin/env bash
# Regenerates train/data/testdata/megatron_blend/blends.json: for a few
# (weights, size) blends, the per-dataset sample counts and the dataset index /
# dataset sample index that Megatron-Core's own blending code produces
# (`megatron-core` from PyPI: its compiled helpers_cpp.build_blending_indices and
# blended_megatron_dataset_builder's sizes). //train/data:blend_test compares
# Loom's arrays with them exactly. Also train/data/testdata/megatron_packing/
# masks.json: Megatron-Core's _get_ltor_masks_and_position_ids on a few packed
# samples (make_packing_reference.py), for //train/data:packing_test.
#
#   tools/megatron_reference/make_reference.sh            # create or reuse the venv
#   tools/megatron_reference/make_reference.sh --upgrade  # newest release first
#
# The virtual environment is $LOOM_MEGATRON_VENV (default
# ~/.cache/loom/megatron-core-venv). Megatron-Core needs torch: with
# $LOOM_TORCH_VENV (e.g. ~/.cache/loom/pytorch-venv) naming a venv that has it,
# a new venv sees that one's packages (a .pth file) and torch is not downloaded
# again. Nothing here is needed by `bazel test //...`.
set -euo pipefail

VENV="${LOOM_MEGATRON_VENV:-$HOME/.cache/loom/megatron-core-venv}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in -h|--help) sed -n '2,16p' "$0"; exit 0 ;; esac
if [ -n "${LOOM_TORCH_VENV:-}" ] && [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  torch_site="$("$LOOM_TORCH_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  own_site="$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  echo "$torch_site" > "$own_site/loom_torch_venv.pth"
fi
source "$HERE/../reference_venv.sh"
ensure_reference_venv "$VENV" "megatron.core numpy torch" "megatron-core" "$@"

"$VENV/bin/python" "$HERE/make_reference.py" \
  "$HERE/../../train/data/testdata/megatron_blend/blends.json"
"$VENV/bin/python" "$HERE/make_packing_reference.py" \
  "$HERE/../../train/data/testdata/megatron_packing/masks.json"
