#!/usr/bin/env bash
# //train:gpt as a scheduler and the restart agent see it:
#  1. --exit-signal-handler: SIGTERM mid-run -> the step finishes, a complete
#     checkpoint is saved, one line is logged, exit 0, no sample;
#  2. a restart (LOOM_RESTART_COUNT=1, no --load) resumes from it;
#  3. LOOM_FAULT kind=exit and kind=save fire in the real binary, and a restart
#     after a save killed half-way never reads the half-written checkpoint;
#  4. bad exit flags and a malformed LOOM_FAULT fail before any work (exit 2).
set -uo pipefail
gpt="$TEST_SRCDIR/$TEST_WORKSPACE/train/gpt"
preprocess="$TEST_SRCDIR/$TEST_WORKSPACE/train/preprocess_data"
cd "$TEST_TMPDIR"
fail() { echo "FAIL: $*"; for f in out.txt err.txt; do [ -f "$f" ] && { echo "--- $f"; tail -30 "$f"; }; done; exit 1; }
unset LOOM_RESTART_COUNT LOOM_FAULT LOOM_HEARTBEAT_FILE

awk 'BEGIN { for (i = 0; i < 300; i++) printf "the quick brown fox %d jumps over the lazy dog %d times\n%%\n", i, i * 7 }' > corpus.txt
"$preprocess" --input=corpus.txt --output-prefix=corpus --tokenizer-type=ByteLevelTokenizer \
  --document-separator=% > /dev/null 2>&1 || fail "preprocess_data"

tiny=(--distributed-backend=local --nproc-per-node=2 --data-path=corpus --data-cache-dir=cache
      --num-layers=2 --hidden-size=32 --num-attention-heads=4 --seq-length=16
      --micro-batch-size=2 --global-batch-size=4 --log-interval=1 --eval-interval=0
      --eval-iters=0 --peak-flops=1e9 --sample-tokens=8)

# Waits for "iteration <n>/" in out.txt while process $1 lives.
wait_for_iteration() {
  for _ in $(seq 1200); do
    grep -qE " iteration +$2/" out.txt && return 0
    kill -0 "$1" 2> /dev/null || return 1
    sleep 0.05
  done
  return 1
}

# 1. SIGTERM mid-run.
ckpt="$TEST_TMPDIR/ckpt"
"$gpt" "${tiny[@]}" --train-iters=100000 --exit-signal-handler --save="$ckpt" > out.txt 2> err.txt &
pid=$!
wait_for_iteration $pid 3 || { kill -9 $pid; fail "never reached iteration 3"; }
kill -TERM $pid
wait $pid
rc=$?
[ $rc = 0 ] || fail "exit status $rc after SIGTERM, expected 0"
line=$(grep -E "^exit signal handler: SIGTERM received at iteration [0-9]+; saved checkpoint, exiting$" out.txt) ||
  fail "no exit line"
n=$(echo "$line" | sed -E 's/.*iteration ([0-9]+);.*/\1/')
[ "$n" -ge 3 ] || fail "stopped at iteration $n, before the signal"
grep -qE " iteration +$((n + 1))/" out.txt && fail "a step after iteration $n ran"
grep -q -- "--- sample" out.txt && fail "a sample was generated after the exit"
iter=$(printf "iter_%07d" "$n")
[ "$(cat "$ckpt/latest")" = "$iter" ] || fail "latest is '$(cat "$ckpt/latest")', expected $iter"
for f in manifest.pb manifest.txt shard_00000_of_00002.bin shard_00001_of_00002.bin; do
  [ -s "$ckpt/$iter/$f" ] || fail "$ckpt/$iter/$f missing"
done
grep -q "iteration: $n\$" "$ckpt/$iter/manifest.txt" || fail "manifest does not say iteration $n"
ls -d "$ckpt"/*.tmp 2> /dev/null && fail "a temporary checkpoint folder was left"

# 2. The restart resumes from it (same flags; --exit-interval stops it soon).
LOOM_RESTART_COUNT=1 "$gpt" "${tiny[@]}" --train-iters=100000 --exit-signal-handler \
  --save="$ckpt" --exit-interval=$((n + 2)) > out.txt 2> err.txt
rc=$?
[ $rc = 0 ] || fail "restart: exit status $rc"
grep -q "^restart 1: resuming from $ckpt/$iter iteration $n " out.txt || fail "restart: no resume line"
grep -qE " iteration +$((n + 1))/" out.txt || fail "restart: iteration $((n + 1)) not logged"
grep -qE " iteration +$n/" out.txt && fail "restart: iteration $n ran again"
grep -q "^exit interval: iteration $((n + 2)) is a multiple of --exit-interval=$((n + 2)); saved checkpoint, exiting" out.txt ||
  fail "restart: no exit-interval line"

# 3. LOOM_FAULT in the real binary.
LOOM_FAULT=rank=1,iteration=2,kind=exit "$gpt" "${tiny[@]}" --train-iters=4 > out.txt 2> err.txt
rc=$?
[ $rc = 3 ] || fail "kind=exit: exit status $rc, expected 3"
grep -q "LOOM_FAULT fires: rank=1 iteration=2 kind=exit attempt=0" err.txt || fail "kind=exit: no announcement"
# Fires in attempt 0 only: the restarted job completes.
LOOM_RESTART_COUNT=1 LOOM_FAULT=rank=1,iteration=2,kind=exit "$gpt" "${tiny[@]}" --train-iters=4 \
  > out.txt 2> err.txt || fail "kind=exit fired again in attempt 1"

ckpt2="$TEST_TMPDIR/ckpt2"
LOOM_FAULT=rank=0,iteration=4,kind=save "$gpt" "${tiny[@]}" --train-iters=6 --save-interval=2 \
  --save="$ckpt2" > out.txt 2> err.txt
rc=$?
[ $rc = 137 ] || fail "kind=save: exit status $rc, expected 137 (SIGKILL)"
grep -q "LOOM_FAULT fires: rank=0 iteration=4 kind=save attempt=0 (SIGKILL with .*shard_00000_of_00002.bin half written)" err.txt ||
  fail "kind=save: no announcement"
[ "$(cat "$ckpt2/latest")" = "iter_0000002" ] || fail "kind=save: latest moved past iteration 2"
[ -d "$ckpt2/iter_0000004.tmp" ] || fail "kind=save: no half-written iter_0000004.tmp"
[ -e "$ckpt2/iter_0000004" ] && fail "kind=save: iteration 4 was committed"
LOOM_RESTART_COUNT=1 LOOM_FAULT=rank=0,iteration=4,kind=save "$gpt" "${tiny[@]}" --train-iters=6 \
  --save-interval=2 --save="$ckpt2" > out.txt 2> err.txt || fail "kind=save: the restart failed"
grep -q "^restart 1: resuming from $ckpt2/iter_0000002 iteration 2 " out.txt || fail "kind=save: restart did not resume from 2"
[ "$(cat "$ckpt2/latest")" = "iter_0000006" ] || fail "kind=save: the restart did not finish"
ls -d "$ckpt2"/*.tmp 2> /dev/null && fail "kind=save: the .tmp folder was not cleaned up"

# 4. Bad input: exit 2 before any work, naming the flag or the variable.
"$gpt" "${tiny[@]}" --exit-signal-handler > out.txt 2> err.txt
[ $? = 2 ] || fail "--exit-signal-handler without --save was accepted"
grep -q -- "--exit-signal-handler needs --save" err.txt || fail "no --exit-signal-handler message"
"$gpt" "${tiny[@]}" --exit-interval=-1 > out.txt 2> err.txt
[ $? = 2 ] || fail "--exit-interval=-1 was accepted"
grep -q -- "--exit-interval (-1) must be >= 1" err.txt || fail "no --exit-interval message"
LOOM_FAULT=rank=1,iteration=2 "$gpt" "${tiny[@]}" > out.txt 2> err.txt
[ $? = 2 ] || fail "a malformed LOOM_FAULT was accepted"
grep -q "LOOM_FAULT=rank=1,iteration=2: 'rank=1,iteration=2' lacks kind" err.txt || fail "no LOOM_FAULT message"
echo "exit_signal_test: ok"
