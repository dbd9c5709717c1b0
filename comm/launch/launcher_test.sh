#!/bin/bash
# The --nproc-per-node launcher: real processes, a TCP store rendezvous,
# failure propagation (exit status, signal), signal forwarding, no orphans.
set -u
CHILD="$1"
fail() { echo "FAIL: $*"; exit 1; }

# 1. Three ranks rendezvous through the TCP store served by rank 0.
out=$(timeout 60 "$CHILD" --nproc-per-node=3 --behavior=store 2>&1) || fail "store run: $out"
echo "$out"
[ "$(echo "$out" | grep -c rendezvoused)" = 3 ] || fail "expected 3 ranks to rendezvous: $out"
echo "$out" | grep -q "torchrun env" || fail "ranks should find RANK/WORLD_SIZE: $out"

# 2. A rank exiting non-zero: the launcher names it and stops the others fast.
start=$(date +%s)
out=$(timeout 60 "$CHILD" --nproc-per-node=3 --behavior=fail 2>&1) && fail "fail run exited 0"
echo "$out"
echo "$out" | grep -q "rank 1 (pid [0-9]*) exited with status 3" || fail "no rank/status: $out"
[ $(( $(date +%s) - start )) -lt 20 ] || fail "the others were not stopped promptly"

# 3. A rank killed by a signal.
out=$(timeout 60 "$CHILD" --nproc-per-node=3 --behavior=sigkill 2>&1) && fail "sigkill run exited 0"
echo "$out"
echo "$out" | grep -q "rank 2 (pid [0-9]*) was killed by signal 9" || fail "no signal: $out"

# 4. SIGTERM to the launcher is forwarded; no rank outlives it.
piddir="$TEST_TMPDIR/pids"; mkdir -p "$piddir"
"$CHILD" --nproc-per-node=2 --behavior=sleep --pid_dir="$piddir" > "$TEST_TMPDIR/sleep.log" 2>&1 &
launcher=$!
for i in $(seq 100); do [ "$(ls "$piddir" | wc -l)" = 2 ] && break; sleep 0.1; done
[ "$(ls "$piddir" | wc -l)" = 2 ] || fail "ranks did not start"
kill -TERM $launcher
wait $launcher && fail "launcher exited 0 after SIGTERM"
cat "$TEST_TMPDIR/sleep.log"
grep -q "received signal 15" "$TEST_TMPDIR/sleep.log" || fail "signal not reported"
sleep 0.5
for p in $(ls "$piddir"); do kill -0 "$p" 2>/dev/null && fail "rank pid $p outlived the launcher"; done

# 5. SIGKILL to the launcher: PR_SET_PDEATHSIG takes the ranks down too.
rm -f "$piddir"/*
"$CHILD" --nproc-per-node=2 --behavior=sleep --pid_dir="$piddir" > /dev/null 2>&1 &
launcher=$!
for i in $(seq 100); do [ "$(ls "$piddir" | wc -l)" = 2 ] && break; sleep 0.1; done
kill -KILL $launcher
wait $launcher 2>/dev/null
sleep 0.5
for p in $(ls "$piddir"); do kill -0 "$p" 2>/dev/null && fail "orphan rank pid $p"; done
echo PASS
