#!/bin/bash
# Runs //pipeline:visualize as a user would: outputs, flag spellings, and error messages.
set -u
BIN="${TEST_SRCDIR}/${TEST_WORKSPACE}/pipeline/visualize"
fail() { echo "FAIL: $*" >&2; exit 1; }

# Text format: one line per stage, then the summary.
out="$("$BIN" --schedule=1f1b --pp=2 --micro-batches=3 --format=text)" || fail "text run failed"
echo "$out" | grep -qx "stage 0: F0.0 F1.0 B0.0 F2.0 B1.0 B2.0" || fail "stage 0 line: $out"
echo "$out" | grep -q "bubble" || fail "no bubble in summary: $out"

# Underscore spellings work too.
"$BIN" --schedule=gpipe --pp=2 --micro_batches=2 --format=text >/dev/null || fail "underscores"

# A relative --out is resolved against BUILD_WORKING_DIRECTORY (set by `bazel run`).
BUILD_WORKING_DIRECTORY="$TEST_TMPDIR" "$BIN" --schedule=interleaved --pp=4 --vpp=2 \
    --micro-batches=8 --out=schedule.svg 2>/dev/null || fail "svg run failed"
grep -q "<svg" "$TEST_TMPDIR/schedule.svg" || fail "no svg written under BUILD_WORKING_DIRECTORY"

# Errors name the flag.
expect_error() {  # expect_error TEXT ARGS...
  local want="$1"; shift
  local err
  if err="$("$BIN" "$@" 2>&1 >/dev/null)"; then fail "expected failure for: $*"; fi
  echo "$err" | grep -qF -- "$want" || fail "error for '$*' lacks '$want': $err"
}
expect_error "--schedule='zb'" --schedule=zb
expect_error "--micro-batches = 6" --schedule=interleaved --pp=4 --vpp=2 --micro-batches=6
expect_error "--pipeline-model-parallel-size (--pp)" --schedule=interleaved --pp=1 --vpp=2
expect_error "--virtual-pipeline-model-parallel-size (--vpp)" --schedule=1f1b --vpp=2
expect_error "--micro-batches = 0" --micro-batches=0
expect_error "--format='png'" --format=png
expect_error "--comm-mode='sync'" --comm-mode=sync
expect_error "pp" --pp=four
expect_error "no_such_flag" --no-such-flag=1
expect_error "--out=" --out=/nonexistent-dir/x.svg
expect_error "--format='json'" --format=json
expect_error "--us-per-unit=0" --format=chrome --us-per-unit=0
expect_error "--virtual-pipeline-model-parallel-size (--vpp) = 2" --schedule=zbv --pp=2
expect_error "--backward-weight-cost" --schedule=zb-h1 --backward-weight-cost=0

# Split backward: I (input grad) and W (weight grad); stage 1 of ZB-H1 defers W0 past I1.
out="$("$BIN" --schedule=zb-h1 --pp=2 --micro-batches=2 --format=text)" || fail "zb-h1 run failed"
echo "$out" | grep -qx "stage 0: F0.0 F1.0 I0.0 W0.0 I1.0 W1.0" || fail "zb-h1 stage 0: $out"
echo "$out" | grep -qx "stage 1: F0.0 I0.0 F1.0 I1.0 W0.0 W1.0" || fail "zb-h1 stage 1: $out"
echo "$out" | grep -qF "(P-1)/(3M) at F=I=W" || fail "zb-h1 formula: $out"
"$BIN" --schedule=zbv --pp=2 --vpp=2 --micro-batches=4 --out="$TEST_TMPDIR/zbv.svg" \
    || fail "zbv svg run failed"
grep -q 'class="bwd-weight"' "$TEST_TMPDIR/zbv.svg" || fail "no weight-grad boxes in zbv.svg"

# --format=chrome: a Chrome trace, one process per stage, M forwards and M
# backwards of "X" events per stage, in microseconds.
"$BIN" --schedule=1f1b --pp=2 --micro-batches=3 --format=chrome --us-per-unit=10 \
    > "$TEST_TMPDIR/plan.json" || fail "chrome run failed"
python3 - "$TEST_TMPDIR/plan.json" <<'PY' || fail "chrome trace: see above"
import json, sys
t = json.load(open(sys.argv[1]))
x = [e for e in t["traceEvents"] if e["ph"] == "X"]
for stage in (0, 1):  # pids 1000 + stage: apart from a run's ranks
    f = [e for e in x if e["pid"] == 1000 + stage and e["name"] == "forward-compute"]
    b = [e for e in x if e["pid"] == 1000 + stage and e["name"] == "backward-compute"]
    assert len(f) == 3 and len(b) == 3, (stage, len(f), len(b))
    assert all(e["dur"] == 10 for e in f) and all(e["dur"] == 20 for e in b), f + b
names = {e["args"]["name"] for e in t["traceEvents"] if e["name"] == "process_name"}
assert len(names) == 2 and all(n.startswith("stage ") and "(plan: " in n for n in names), names
PY
echo PASS
