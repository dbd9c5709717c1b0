# Sourced by tests that need the real PyTorch (torchrun, its TCPStore): finds
# the reference environment `tools/setup.sh --torch` makes.
#
#   source tools/pytorch_reference/find_torch.sh
#   PY=$(find_torch_python) || { echo "SKIPPED: $PY"; exit "$(torch_missing_status)"; }
#
# The environment: LOOM_PYTORCH_VENV (Bazel passes it to tests, see .bazelrc),
# else ~/.cache/loom/pytorch-venv of the user running the test (from the
# password database: Bazel gives tests a HOME of their own).
# LOOM_REQUIRE_TORCH=1 (CI) turns a missing PyTorch from a skip into a
# failure, so CI cannot pass by skipping.

# Prints the environment's python and returns 0, or prints why not and returns 1.
find_torch_python() {
  local home venv
  home=$(getent passwd "$(id -u)" | cut -d: -f6)
  venv="${LOOM_PYTORCH_VENV:-$home/.cache/loom/pytorch-venv}"
  if ! "$venv/bin/python" -c 'import torch.distributed' 2>/dev/null; then
    echo "no PyTorch in $venv (tools/setup.sh --torch makes it; LOOM_PYTORCH_VENV names another)"
    return 1
  fi
  echo "$venv/bin/python"
}

# The exit status for a missing PyTorch: 0 (skip), or 1 under LOOM_REQUIRE_TORCH=1.
torch_missing_status() {
  if [ "${LOOM_REQUIRE_TORCH:-0}" = 1 ]; then
    echo "FAILED: LOOM_REQUIRE_TORCH=1 but PyTorch is missing" >&2
    echo 1
  else
    echo 0
  fi
}
