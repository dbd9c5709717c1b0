#!/bin/bash
# //profile:timeline_svg as a user runs it: a merged trace in, an SVG out
# (one row per rank, a box per span); relative paths from BUILD_WORKING_DIRECTORY;
# errors name the file.
set -u
BIN="${TEST_SRCDIR}/${TEST_WORKSPACE}/profile/timeline_svg"
fail() { echo "FAIL: $*" >&2; exit 1; }
cd "$TEST_TMPDIR"
cat > trace.json <<'JSON'
{"traceEvents":[
{"ph":"M","pid":0,"tid":0,"name":"process_name","args":{"name":"rank 0"}},
{"ph":"M","pid":1,"tid":0,"name":"process_name","args":{"name":"rank 1"}},
{"ph":"M","pid":0,"tid":0,"name":"thread_name","args":{"name":"main"}},
{"ph":"M","pid":0,"tid":1,"name":"thread_name","args":{"name":"comm dp"}},
{"ph":"X","pid":0,"tid":0,"name":"forward-compute","cat":"compute","ts":0,"dur":100},
{"ph":"X","pid":0,"tid":0,"name":"forward layer 0","cat":"compute","ts":10,"dur":40},
{"ph":"X","pid":0,"tid":1,"name":"all_reduce","cat":"comm","ts":50,"dur":80,"args":{"bytes":4096}},
{"ph":"X","pid":1,"tid":0,"name":"forward-compute","cat":"compute","ts":5,"dur":90}
]}
JSON
mkdir -p out
BUILD_WORKING_DIRECTORY="$TEST_TMPDIR" "$BIN" trace.json out/t.svg > log.txt 2>&1 || fail "run: $(cat log.txt)"
grep -q "4 spans of 2 processes" log.txt || fail "summary: $(cat log.txt)"
[ "$(grep -c '<g class="row"' out/t.svg)" = 2 ] || fail "expected 2 rows (ranks)"
[ "$(grep -c 'class="box"' out/t.svg)" = 4 ] || fail "expected 4 boxes"
grep -q 'data-name="all_reduce"' out/t.svg || fail "no all_reduce box"
grep -q '&quot;bytes&quot;:4096' out/t.svg || fail "the tooltip lacks the args"
echo '{"nope": 1}' > bad.json
err=$("$BIN" "$TEST_TMPDIR/bad.json" out/x.svg 2>&1) && fail "accepted a non-trace"
echo "$err" | grep -q "bad.json" || fail "error does not name the file: $err"
"$BIN" 2>/dev/null; [ $? = 2 ] || fail "usage exit code"
echo PASS
