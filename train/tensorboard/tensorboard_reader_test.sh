#!/usr/bin/env bash
# TensorBoard's own reader (EventAccumulator) reads an event file Loom wrote.
# Needs the `tensorboard` PyPI package: python3's, or the venv of
# tools/tensorboard_reference (made by make_reference.sh); skipped with the
# reason otherwise (nothing else in the build needs it).
set -euo pipefail

HERE="$TEST_SRCDIR/${TEST_WORKSPACE:-loom}/train/tensorboard"
DIR="$TEST_TMPDIR/run"
"$HERE/write_sample" "$DIR"

# Bazel gives tests their own HOME: look where the user installed it.
REAL_HOME="$(getent passwd "$(id -u)" | cut -d: -f6)"
for py in "${LOOM_TENSORBOARD_VENV:-$REAL_HOME/.cache/loom/tensorboard-venv}/bin/python" python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  rc=0
  PYTHONUSERBASE="$REAL_HOME/.local" "$py" "$HERE/read_with_tensorboard.py" "$DIR" || rc=$?
  [ "$rc" -eq 77 ] && continue
  exit "$rc"
done
echo "SKIPPED: the tensorboard PyPI package is not importable (pip install tensorboard, or"
echo "tools/tensorboard_reference/make_reference.sh); Loom's reader is tested by :events_test."
exit 0
