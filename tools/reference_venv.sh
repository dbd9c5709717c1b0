#!/usr/bin/env bash
# Creates (once) or reuses a Python virtual environment for a reference-data
# script, and installs its PyPI packages. Sourced by tools/*_reference/*.sh:
#
#   source tools/reference_venv.sh
#   ensure_reference_venv VENV "import names" "pip packages" [--upgrade] [PIN...]
#
# --upgrade moves to the newest releases; a PIN ('transformers==4.46.3') is
# passed to pip. Nothing here is needed by `bazel test //...`.
ensure_reference_venv() {
  local venv=$1 modules=$2 packages=$3
  shift 3
  local upgrade=() pins=()
  for a in "$@"; do
    case "$a" in
      --upgrade) upgrade=(--upgrade) ;;
      *) pins+=("$a") ;;
    esac
  done
  if [ ! -x "$venv/bin/python" ]; then
    echo "creating the virtual environment $venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
  fi
  local import_line="import ${modules// /, }"
  if [ ${#upgrade[@]} -eq 0 ] && [ ${#pins[@]} -eq 0 ] &&
     "$venv/bin/python" -c "$import_line" 2>/dev/null; then
    echo "$venv already has $packages; nothing to install."
    return 0
  fi
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # shellcheck disable=SC2086  # $packages is a list of names
  "$venv/bin/python" -m pip install ${upgrade[@]+"${upgrade[@]}"} $packages ${pins[@]+"${pins[@]}"}
}
