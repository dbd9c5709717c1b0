#!/usr/bin/env bash
# bazel run //tests:restart_bench -- [--nproc-per-node=N] [gpt flags...]
#
# Restart time under the agent: a rank is SIGKILLed (LOOM_FAULT) at iteration
# 15 of the default model (2 ranks, UCX, a checkpoint every 10 iterations);
# every output line is stamped as it arrives, and the time from the fault to
# the first training step after the restart is split into its parts:
#   detect+stop   the fault -> the agent's "restart 1/1" line (others stopped)
#   start+load    -> "resuming from" (processes, rendezvous, model, checkpoint)
#   first step    -> the first "iteration" line after it
# Repeated --rounds times (default 3); prints each round and the median.
set -euo pipefail
GPT=bazel-bin/train/gpt
ROUNDS=3
ARGS=()
for a in "$@"; do
  case "$a" in
    --gpt=*) GPT="${a#--gpt=}" ;;
    --rounds=*) ROUNDS="${a#--rounds=}" ;;
    *) ARGS+=("$a") ;;
  esac
done
GPT="$(readlink -f "$GPT")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "# restart bench: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
echo "# round  detect+stop(s)  start+load(s)  first-step(s)  total(s)"
totals=()
for r in $(seq "$ROUNDS"); do
  rm -rf "$WORK/ckpt"
  # Line-buffered (the ranks inherit stdbuf's setting): each line stamped as written.
  LOOM_FAULT=rank=1,iteration=15,kind=sigkill stdbuf -oL -eL "$GPT" --distributed-backend=ucx --nproc-per-node=2 \
    --train-iters=20 --save-interval=10 --save="$WORK/ckpt" --log-interval=1 --eval-interval=0 \
    --sample-tokens=0 --max-restarts=1 --data-cache-dir="$WORK/cache" "${ARGS[@]}" 2>&1 |
    while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done > "$WORK/log"
  t_fault=$(grep -m1 "LOOM_FAULT fires" "$WORK/log" | cut -d' ' -f1)
  t_restart=$(grep -m1 "restart 1/1" "$WORK/log" | cut -d' ' -f1)
  t_resume=$(grep -m1 "resuming from" "$WORK/log" | cut -d' ' -f1)
  t_step=$(sed -n '/resuming from/,$p' "$WORK/log" | grep -m1 " iteration  *[0-9]*/" | cut -d' ' -f1)
  if [ -z "$t_fault" ] || [ -z "$t_restart" ] || [ -z "$t_resume" ] || [ -z "$t_step" ]; then
    echo "round $r: the run did not restart as expected:"; tail -20 "$WORK/log"; exit 1
  fi
  total=$(echo "$t_step - $t_fault" | bc)
  totals+=("$total")
  printf '%7d  %14.3f  %13.3f  %13.3f  %8.3f\n' "$r" "$(echo "$t_restart - $t_fault" | bc)" \
    "$(echo "$t_resume - $t_restart" | bc)" "$(echo "$t_step - $t_resume" | bc)" "$total"
done
printf 'median total: %s s\n' "$(printf '%s\n' "${totals[@]}" | sort -g | sed -n "$(( (ROUNDS + 1) / 2 ))p")"
