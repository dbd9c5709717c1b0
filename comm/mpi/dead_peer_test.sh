#!/bin/bash
# mpirun -np 3 with --enable-recovery (so mpirun does not kill the job when a
# rank dies): rank 2 SIGKILLs itself after a barrier; ranks 0 and 1 must
# report DeadlineExceeded within the 2 s timeout + slack.
set -u
MPIRUN="$1"; BIN="$2"
export TMPDIR="${TEST_TMPDIR:-$(mktemp -d)}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(timeout -k 10 120 "$MPIRUN" -np 3 --oversubscribe --enable-recovery \
  --mca plm_rsh_agent false --mca btl self,vader --mca pml ob1 \
  --mca btl_vader_single_copy_mechanism none --mca btl_vader_backing_directory "$TMPDIR" \
  "$BIN" --backend=mpi --mode=dead_peer --comm_timeout_s=2 2>&1)
echo "$out"
for r in 0 1; do
  echo "$out" | grep -q "rank $r/3\] DEAD_PEER_OK" || { echo "FAIL: rank $r"; exit 1; }
done
echo PASS
