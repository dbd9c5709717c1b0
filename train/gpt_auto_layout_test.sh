#!/usr/bin/env bash
# //train:gpt --auto-layout as a user runs it:
#  1. 2 local ranks train with the planner's layout, named in the first log line;
#  2. 2 processes (the launcher passes the choice to its ranks as flags): the
#     same layout, logged once;
#  3. a typed layout flag is a constraint: TP 2 is chosen and trains, marked
#     "(typed)"; an impossible one, and a bad --hardware file, fail before any
#     work (exit 2) naming the flag / the file.
set -uo pipefail
gpt="$TEST_SRCDIR/$TEST_WORKSPACE/train/gpt"
preprocess="$TEST_SRCDIR/$TEST_WORKSPACE/train/preprocess_data"
cd "$TEST_TMPDIR"
fail() { echo "FAIL: $*"; for f in out.txt err.txt; do [ -f "$f" ] && { echo "--- $f"; tail -30 "$f"; }; done; exit 1; }
unset LOOM_RESTART_COUNT LOOM_FAULT LOOM_HEARTBEAT_FILE

awk 'BEGIN { for (i = 0; i < 300; i++) printf "the quick brown fox %d jumps over the lazy dog %d times\n%%\n", i, i * 7 }' > corpus.txt
"$preprocess" --input=corpus.txt --output-prefix=corpus --tokenizer-type=ByteLevelTokenizer \
  --document-separator=% > /dev/null 2>&1 || fail "preprocess_data"

tiny=(--nproc-per-node=2 --data-path=corpus --data-cache-dir=cache
      --num-layers=2 --hidden-size=32 --num-attention-heads=4 --seq-length=16
      --global-batch-size=4 --train-iters=3 --log-interval=1 --eval-interval=0
      --eval-iters=0 --peak-flops=1e9 --sample-tokens=0)

# 1. Threads.
"$gpt" --auto-layout --distributed-backend=local "${tiny[@]}" > out.txt 2> err.txt ||
  fail "--auto-layout with 2 local ranks exited $?"
first=$(head -1 out.txt)
[[ "$first" =~ ^loom:\ --auto-layout\ chose\ TP\ ([0-9]+)\ x\ PP\ ([0-9]+).*\ x\ DP\ ([0-9]+).*micro-batch\ ([0-9]+).*predicted.*s/step.*second\ best:.*hardware\ built-in\ plan/testdata/cpu.textproto\)$ ]] ||
  fail "first line is not the choice: $first"
tp=${BASH_REMATCH[1]} pp=${BASH_REMATCH[2]} dp=${BASH_REMATCH[3]} mbs=${BASH_REMATCH[4]}
[ $((tp * pp * dp)) = 2 ] || fail "TP $tp x PP $pp x DP $dp is not 2 ranks"
grep -qE "^loom: 2 ranks = TP $tp x PP $pp x DP $dp.* of $mbs per step" out.txt ||
  fail "the trainer did not run the chosen layout"
grep -qE " iteration +3/ +3 " out.txt || fail "did not train 3 iterations"

# 2. Processes: the launcher's ranks run the same layout and do not log it again.
"$gpt" --auto-layout --distributed-backend=ucx "${tiny[@]}" > out.txt 2> err.txt ||
  fail "--auto-layout with 2 processes exited $?"
[ "$(head -1 out.txt)" = "$first" ] || fail "processes chose differently: $(head -1 out.txt)"
[ "$(grep -c -- '--auto-layout chose' out.txt)" = 1 ] || fail "the choice was logged more than once"
grep -qE "^loom: 2 ranks = TP $tp x PP $pp x DP $dp" out.txt || fail "the ranks ran another layout"
grep -qE " iteration +3/ +3 " out.txt || fail "processes did not train 3 iterations"

# 3. Constraints: the typed TP is kept; one no layout has is refused before any work.
"$gpt" --auto-layout --distributed-backend=local "${tiny[@]}" --tensor-model-parallel-size=2 \
  > out.txt 2> err.txt || fail "--auto-layout --tensor-model-parallel-size=2 exited $?"
head -1 out.txt | grep -q "^loom: --auto-layout chose TP 2 (typed) x PP 1 x DP 1" ||
  fail "the typed TP was not kept: $(head -1 out.txt)"
grep -qE "^loom: 2 ranks = TP 2 x PP 1 x DP 1" out.txt || fail "the trainer ran another layout"
grep -qE " iteration +3/ +3 " out.txt || fail "TP 2 did not train 3 iterations"

"$gpt" --auto-layout --distributed-backend=local "${tiny[@]}" --tensor-model-parallel-size=3 \
  > out.txt 2> err.txt
rc=$?
[ $rc = 2 ] || fail "impossible constraint: exit $rc, expected 2"
grep -q -- "--auto-layout --tensor-model-parallel-size=3: no layout .* valid on 2 ranks" err.txt ||
  fail "the refusal does not name the typed flag"
grep -q "^loom:" out.txt && fail "work started despite the impossible constraint"

echo 'peak_flops: "fast"' > bad.textproto
"$gpt" --auto-layout --distributed-backend=local "${tiny[@]}" --hardware=bad.textproto \
  > out.txt 2> err.txt
rc=$?
[ $rc = 2 ] || fail "bad --hardware: exit $rc, expected 2"
grep -q -- "--hardware=.*bad.textproto" err.txt || fail "the error does not name the file"
grep -q "^loom:" out.txt && fail "work started despite the bad file"

"$gpt" --auto-layout --distributed-backend=local "${tiny[@]}" --hardware=missing.textproto \
  > out.txt 2> err.txt
[ $? = 2 ] || fail "missing --hardware: expected exit 2"
grep -q -- "--hardware=.*missing.textproto" err.txt || fail "the error does not name the missing file"
echo PASS
