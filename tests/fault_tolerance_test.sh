#!/usr/bin/env bash
# Faults injected into a TP 2 x PP 2 x DP 2 job (8 ranks) run by the agent
# with --max-restarts: the job restarts from the newest complete checkpoint and
# its final checkpoint is byte-identical to an uninterrupted run of the same
# flags (the CPU path is deterministic). UCX (8 processes) and local (8 rank
# threads in one supervised process).
#   fault_tolerance_test.sh GPT PREPROCESS
set -euo pipefail
GPT="$(readlink -f "$1")"; PREPROCESS="$(readlink -f "$2")"
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/corpus_lib.sh"
cd "$TEST_TMPDIR"
export OMP_NUM_THREADS=1  # 2 cores, 8 ranks

tiny_corpus "$PREPROCESS" corpus

COMMON=(--data-path=corpus --data-cache-dir="$TEST_TMPDIR/cache" --num-layers=4 --hidden-size=32
        --num-attention-heads=4 --seq-length=16 --micro-batch-size=1 --global-batch-size=4
        --tensor-model-parallel-size=2 --pipeline-model-parallel-size=2 --nproc-per-node=8
        --train-iters=12 --save-interval=4 --log-interval=1 --eval-interval=0 --sample-tokens=0
        --peak-flops=1e9 --hidden-dropout=0.1 --comm-timeout-s=20)

fail() { echo "FAILED: $*"; exit 1; }
source "$HERE/checkpoint_lib.sh"  # final, same

run() {  # run NAME BACKEND [ARGS...]: the job's checkpoints in NAME/, its log in NAME.log
  local name="$1" backend="$2"; shift 2
  local start=$(date +%s.%N) rc=0
  timeout -k 5 240 "$GPT" --distributed-backend="$backend" "${COMMON[@]}" --save="$name" "$@" \
    > "$name.log" 2>&1 || rc=$?
  echo "$name: exit $rc in $(echo "$(date +%s.%N) - $start" | bc) s"
  [ "$rc" = 0 ] || { tail -30 "$name.log"; fail "$name exited $rc"; }
}

same_model() {  # same_model A B: B's final checkpoint (iteration 12) is byte-identical to A's
  [ "$(cat "$1/latest")" = "iter_0000012" ] || fail "$1 ended at $(cat "$1/latest")"
  same "$1" "$2"
}

restarted() {  # restarted NAME PATTERN [from-scratch]: one restart, logged with PATTERN as its cause
  grep "restart 1/" "$1.log" || fail "$1: no restart logged"
  grep -q "restart 1/[0-9]*: $2" "$1.log" || fail "$1: restart cause is not '$2'"
  grep -q "restart 2/" "$1.log" && fail "$1: restarted twice"
  if [ "${3:-resume}" = resume ]; then
    grep -q "resuming from" "$1.log" || fail "$1: the restart did not resume from --save"
  fi
  true
}

# --- UCX: 8 processes ---------------------------------------------------------
run ucx_base ucx
# A rank killed mid-run: restart from iteration 4's checkpoint.
LOOM_FAULT=rank=5,iteration=6,kind=sigkill run ucx_sigkill ucx --max-restarts=2
restarted ucx_sigkill "rank 5 (pid [0-9]*) was killed by signal 9"
same_model ucx_base ucx_sigkill
# A rank that exits before the first checkpoint: restart from scratch.
LOOM_FAULT=rank=1,iteration=2,kind=exit run ucx_exit ucx --max-restarts=1
restarted ucx_exit "rank 1 (pid [0-9]*) exited with status 3" from-scratch
same_model ucx_base ucx_exit
# A rank that hangs (no heartbeat, no collective): found by the heartbeat
# before the collective timeout, named, restarted.
LOOM_FAULT=rank=3,iteration=7,kind=hang run ucx_hang ucx --max-restarts=1 --heartbeat-timeout-s=6
restarted ucx_hang "rank 3 (pid [0-9]*) is hung"
same_model ucx_base ucx_hang
# A rank killed in the middle of writing iteration 8's checkpoint: the
# half-written checkpoint is never loaded; the restart resumes from 4.
LOOM_FAULT=rank=6,iteration=8,kind=save run ucx_save ucx --max-restarts=1
restarted ucx_save "rank 6 (pid [0-9]*) was killed by signal 9"
grep -q "resuming from .* iteration 4" ucx_save.log || fail "ucx_save did not resume from iteration 4"
same_model ucx_base ucx_save
# A collective that fails on one rank: every rank's step fails, the job restarts.
LOOM_FAULT=rank=2,iteration=5,kind=collective run ucx_collective ucx --max-restarts=1
restarted ucx_collective "rank [0-9] (pid [0-9]*)"
same_model ucx_base ucx_collective

# --- local: 8 ranks as threads of one supervised process ----------------------
run local_base local
LOOM_FAULT=rank=4,iteration=6,kind=sigkill run local_sigkill local --max-restarts=1
restarted local_sigkill "the ranks' process (pid [0-9]*, 8 ranks as threads) was killed by signal 9"
same_model local_base local_sigkill
if diff -r "local_base/iter_0000012" "ucx_base/iter_0000012" > /dev/null; then
  echo "local and ucx final checkpoints are byte-identical too"
fi

# --- preemption: SIGTERM to the agent with --exit-signal-handler --------------
# Every rank finishes its step, saves and exits 0; the agent forwards the
# signal, waits for the save and exits 0. Also the default corpus with a new
# --data-cache-dir: rank 0 tokenizes it, rank 1 reads what rank 0 made.
"$GPT" --distributed-backend=ucx --nproc-per-node=2 --num-layers=2 --hidden-size=32 \
  --num-attention-heads=4 --seq-length=16 --micro-batch-size=2 --global-batch-size=4 \
  --train-iters=100000 --log-interval=1 --eval-interval=0 --sample-tokens=0 \
  --data-cache-dir="$TEST_TMPDIR/new cache" --save=term --exit-signal-handler > term.log 2>&1 &
agent=$!
for i in $(seq 600); do grep -q "iteration  *5/" term.log && break; sleep 0.1; done
grep -q "iteration  *5/" term.log || { cat term.log; fail "the preempted job did not train"; }
kill -TERM $agent
rc=0; wait $agent || rc=$?
grep -v "^ iteration" term.log
[ "$rc" = 0 ] || fail "SIGTERM with --exit-signal-handler: exit $rc, expected 0"
grep -q "exit signal handler: SIGTERM received at iteration" term.log || fail "no exit line"
last=$(grep -o "iteration  *[0-9]*/" term.log | tail -1 | grep -o "[0-9]*")
[ "$(cat term/latest)" = "$(printf 'iter_%07d' "$last")" ] \
  || fail "saved $(cat term/latest), but the last step logged was $last"
echo "preempted at iteration $last: saved, exit 0"
echo PASS
