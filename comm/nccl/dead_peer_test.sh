#!/bin/bash
# Two nccl ranks (GPUs 0 and 1) started by hand (the launcher would stop the
# survivor as soon as one dies, by design): rank 1 SIGKILLs itself after a
# barrier; rank 0 must fail within the 5 s timeout + slack and then refuse
# work. Skipped (exit 0, "SKIPPED" in the log) with fewer than 2 GPUs.
set -u
BIN="$1"
export TMPDIR="${TEST_TMPDIR:-$(mktemp -d)}"
PORT=$(( 20000 + RANDOM % 20000 ))
# Ranks started by hand prove one secret to rank 0's store (the launcher
# would make one for them).
export LOOM_RENDEZVOUS_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT \
    timeout -k 5 120 "$BIN" --backend=nccl --mode=dead_peer --comm_timeout_s=5 \
    > "$TMPDIR/rank$r.log" 2>&1 &
  pids+=($!)
done
wait ${pids[0]}
rc=$?
wait ${pids[1]}
cat "$TMPDIR"/rank*.log
if grep -q "^SKIPPED" "$TMPDIR/rank0.log"; then exit 0; fi
grep -q "rank 0/2 .*DEAD_PEER_OK" "$TMPDIR/rank0.log" || { echo "FAIL: rank 0"; exit 1; }
[ $rc = 0 ] || { echo "FAIL: the survivor exited $rc"; exit 1; }
echo PASS
