#!/bin/bash
# Three ucx ranks started by hand (the launcher would stop the survivors as
# soon as one dies, by design): rank 2 SIGKILLs itself after a barrier;
# ranks 0 and 1 must report DeadlineExceeded within the 2 s timeout + slack.
set -u
BIN="$1"
export TMPDIR="${TEST_TMPDIR:-$(mktemp -d)}"
PORT=$(( 20000 + RANDOM % 20000 ))
# Ranks started by hand prove one secret to rank 0's store (the launcher
# would make one for them).
export LOOM_RENDEZVOUS_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
# The survivors _exit with the world broken (nothing is torn down, by
# design), so a store handler thread whose client just hung up may not be
# joined yet: ThreadSanitizer would call that a leak. Everything else of
# TSan stays on.
export TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS:}report_thread_leaks=0"
pids=()
for r in 0 1 2; do
  RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT \
    timeout -k 5 60 "$BIN" --backend=ucx --mode=dead_peer --comm_timeout_s=2 \
    > "$TMPDIR/rank$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for r in 0 1; do wait ${pids[$r]} || rc=1; done
wait ${pids[2]}
cat "$TMPDIR"/rank*.log
for r in 0 1; do
  grep -q "rank $r/3\] DEAD_PEER_OK" "$TMPDIR/rank$r.log" || { echo "FAIL: rank $r"; exit 1; }
done
[ $rc = 0 ] || { echo "FAIL: a survivor exited non-zero"; exit 1; }
echo PASS
