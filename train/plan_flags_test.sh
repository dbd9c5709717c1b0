#!/usr/bin/env bash
# //train:plan as a user runs it: layout flags typed with the model flags are
# constraints (every listed layout keeps them, the header names them); one no
# layout can have exits 2 naming it, with nothing listed.
set -uo pipefail
plan="$TEST_SRCDIR/$TEST_WORKSPACE/train/plan"
hw="$TEST_SRCDIR/$TEST_WORKSPACE/plan/testdata/cpu.textproto"
cd "$TEST_TMPDIR"
fail() { echo "FAIL: $*"; for f in out.txt err.txt; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
model=(--gpus=4 --hardware="$hw" --global-batch-size=8 --num-layers=4 --hidden-size=64
       --num-attention-heads=4 --seq-length=32 --top=0)

"$plan" "${model[@]}" > out.txt 2> err.txt || fail "free search exited $?"
grep -q "^[0-9]* *TP 1 " out.txt || fail "the free search lists no TP 1 layout"

"$plan" "${model[@]}" --tensor-model-parallel-size=2 --nouse-distributed-optimizer \
  > out.txt 2> err.txt || fail "constrained search exited $?"
grep -q "with --tensor-model-parallel-size=2 --nouse-distributed-optimizer" out.txt ||
  fail "the header does not name the typed flags"
rows=$(grep -c "^[0-9][0-9]*  *TP " out.txt)  # table rows: "N    TP t PP p ..."
[ "$rows" -gt 0 ] || fail "no layout listed"
[ "$(grep -c "^[0-9][0-9]*  *TP 2 PP " out.txt)" = "$rows" ] || fail "a row without TP 2"
! grep "^[0-9][0-9]*  *TP " out.txt | grep -q "dist-opt" || fail "a ZeRO-1 row with --nouse-distributed-optimizer"

rc=0; "$plan" "${model[@]}" --tensor-model-parallel-size=3 > out.txt 2> err.txt || rc=$?
[ "$rc" = 2 ] || fail "an impossible constraint exited $rc, expected 2"
grep -q "no layout with --tensor-model-parallel-size=3 is valid on 4 ranks" err.txt ||
  fail "the error does not name the typed flag"
[ ! -s out.txt ] || fail "a table was printed for an impossible constraint"
# --calibrate on a GPU measures against a datasheet file: without one, exit 2 naming the flag.
rc=0; "$plan" --calibrate --device=cuda > out.txt 2> err.txt || rc=$?
[ "$rc" = 2 ] || fail "--calibrate --device=cuda without --hardware exited $rc, expected 2"
grep -q "needs --hardware=FILE" err.txt || fail "the error does not name --hardware"

echo PASS
