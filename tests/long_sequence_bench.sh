#!/usr/bin/env bash
# bazel run //tests:long_sequence_bench -- [--seq-length=16384] [--iters=3] [gpt flags...]
#
# One long sequence (default 16k tokens) trained with context parallelism 1
# and 4 (ranks as threads: the per-rank ledgers of core/memory_stats count
# each rank apart), with and without full recomputation. Prints, per
# layout, the peak bytes per rank by category (--memory-report of the
# largest rank), the step time and the loss of every step: the CP = 4 curve
# is the CP = 1 one, in a quarter of the activation memory.
set -euo pipefail
GPT=bazel-bin/train/gpt
SEQ=16384
ITERS=3
ARGS=()
for a in "$@"; do
  case "$a" in
    --gpt=*) GPT="${a#--gpt=}" ;;
    --seq-length=*) SEQ="${a#--seq-length=}" ;;
    --iters=*) ITERS="${a#--iters=}" ;;
    *) ARGS+=("$a") ;;
  esac
done
GPT="$(readlink -f "$GPT")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
MODEL=(--seq-length="$SEQ" --max-position-embeddings="$SEQ" --num-layers=4 --hidden-size=256
       --num-attention-heads=8 --micro-batch-size=1 --global-batch-size=1)
echo "# long sequence bench: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
echo "# ${SEQ} tokens, 4 layers, hidden 256, 8 heads (7.4M parameters), ${ITERS} steps, f32"
printf '# %-26s %-11s %-11s %-11s %-9s %s\n' layout "peak/rank" activations "params+opt" "s/step" losses
row() {  # row NAME CP [FLAGS...]
  local name="$1" cp="$2"; shift 2
  # Threads per rank: the 2 cores shared by the CP ranks.
  OMP_NUM_THREADS=$(( $(nproc) / cp > 0 ? $(nproc) / cp : 1 )) "$GPT" \
    --distributed-backend=local --nproc-per-node="$cp" --context-parallel-size="$cp" \
    "${MODEL[@]}" --train-iters="$ITERS" --log-interval=1 --eval-interval=0 --sample-tokens=0 \
    --memory-report --peak-flops=1e11 --data-cache-dir="$WORK/cache" "$@" "${ARGS[@]}" \
    > "$WORK/$name.log" 2>&1 || { echo "FAILED: $name"; tail -20 "$WORK/$name.log"; exit 1; }
  local mem peak act params opt step losses
  mem=$(grep -E "memory \(largest over|memory \(rank 0:" "$WORK/$name.log" | tail -1)
  peak=$(echo "$mem" | sed -n 's/.*total \([0-9.]* [KMG]iB\).*/\1/p')
  act=$(echo "$mem" | sed -n 's/.*activations \([0-9.]* [KMG]iB\).*/\1/p')
  params=$(echo "$mem" | sed -n 's/.*parameters \([0-9.]* [KMG]iB\).*/\1/p')
  opt=$(echo "$mem" | sed -n 's/.*optimizer \([0-9.]* [KMG]iB\).*/\1/p')
  # Seconds per step: the elapsed time between the first and the last step.
  step=$(grep " iteration " "$WORK/$name.log" | sed -n 's/.*elapsed \([0-9.]*\)s.*/\1/p' |
         awk -v n="$ITERS" 'NR == 1 { a = $1 } { b = $1 } END { if (n > 1) printf "%.1f", (b - a) / (n - 1) }')
  losses=$(grep " iteration " "$WORK/$name.log" | sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p' | xargs)
  printf '  %-26s %-11s %-11s %-11s %-9s %s\n' "$name" "$peak" "$act" "$params+$opt" "$step" "$losses"
}
row "CP 1" 1
row "CP 1, full recompute" 1 --recompute-granularity=full --recompute-method=uniform --recompute-num-layers=1
row "CP 4" 4
row "CP 4, full recompute" 4 --recompute-granularity=full --recompute-method=uniform --recompute-num-layers=1
