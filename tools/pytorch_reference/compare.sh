#!/usr/bin/env bash
# Loom's training step against the same model in PyTorch, in one run and in
# turns (Loom, PyTorch, Loom, ...), so that both see the same machine phase:
#
#   tools/pytorch_reference/compare.sh [--rounds=3] [--compile] [--upgrade] [BENCH FLAGS...]
#
# BENCH FLAGS (--num-layers=12 --seq-length=64 --micro-batch-size=4 ...) go to
# both sides; default: //train:bench's GPT-2-small shape, B4 T64. --compile
# also times torch.compile. Prints each round and the median tokens/s ratio.
# PyTorch comes from PyPI into $LOOM_PYTORCH_VENV (default
# ~/.cache/loom/pytorch-venv); nothing here is needed by `bazel test //...`.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${LOOM_PYTORCH_VENV:-$HOME/.cache/loom/pytorch-venv}"
ROUNDS=3
COMPILE=0
VENV_ARGS=()
FLAGS=()
for a in "$@"; do
  case "$a" in
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    --rounds=*) ROUNDS="${a#--rounds=}" ;;
    --compile) COMPILE=1 ;;
    --upgrade) VENV_ARGS+=(--upgrade) ;;
    --*=*) FLAGS+=("$a") ;;
    *) echo "compare.sh: '$a' is not --rounds=N, --compile, --upgrade or a --flag=value of //train:bench" >&2
       exit 2 ;;
  esac
done
source "$ROOT/tools/reference_venv.sh"
ensure_reference_venv "$VENV" "torch" "torch" ${VENV_ARGS[@]+"${VENV_ARGS[@]}"} >&2

cd "$ROOT"
bazel build -c opt //train:bench >&2
BENCH="$(bazel info -c opt bazel-bin 2>/dev/null)/train/bench"
PY_FLAGS=()
for f in ${FLAGS[@]+"${FLAGS[@]}"}; do PY_FLAGS+=("${f%%=*}" "${f#*=}"); done

tokens() { sed -n 's/^| tokens\/s | \([0-9.]*\) |$/\1/p'; }
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores;" \
     "flags: ${FLAGS[*]:-GPT-2-small B4 T64}"
printf '# %-6s %-14s %-16s %s\n' round "loom tokens/s" "pytorch tokens/s" "loom / pytorch"
ratios=()
for r in $(seq "$ROUNDS"); do
  loom="$("$BENCH" ${FLAGS[@]+"${FLAGS[@]}"} | tokens)"
  torch="$("$VENV/bin/python" "$HERE/gpt_bench.py" ${PY_FLAGS[@]+"${PY_FLAGS[@]}"} | tokens)"
  line="$(printf '%-8s %-14s %-16s' "$r" "$loom" "$torch")"
  ratio="$(python3 -c "print(f'{$loom / $torch:.2f}')")"
  ratios+=("$ratio")
  if [ "$COMPILE" = 1 ]; then
    compiled="$("$VENV/bin/python" "$HERE/gpt_bench.py" --compile ${PY_FLAGS[@]+"${PY_FLAGS[@]}"} | tokens)"
    echo "$line ${ratio}x (torch.compile: $compiled tokens/s, $(python3 -c "print(f'{$loom / $compiled:.2f}')")x)"
  else
    echo "$line ${ratio}x"
  fi
done
echo "median loom / pytorch: $(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')x"
