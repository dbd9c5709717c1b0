#!/bin/bash
# One case of failure_test_main under mpirun:  run_failure_case.sh NP MPIRUN BINARY CASE
# The case breaks the MPI world on purpose and its ranks exit without
# MPI_Finalize, so mpirun's own exit status means nothing here
# (--enable-recovery: it does not kill the other ranks when one exits): every
# rank must print "<CASE> OK".
set -u
NP="$1"; MPIRUN="$2"; BIN="$3"; CASE="$4"
export TMPDIR="${TEST_TMPDIR:-$(mktemp -d)}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(timeout -k 10 120 "$MPIRUN" -np "$NP" --oversubscribe --enable-recovery \
  --mca plm_rsh_agent false --mca btl self,vader --mca pml ob1 \
  --mca btl_vader_single_copy_mechanism none --mca btl_vader_backing_directory "$TMPDIR" \
  "$BIN" "$CASE" 2>&1)
echo "$out"
for ((r = 0; r < NP; ++r)); do
  echo "$out" | grep -q "\[mpi rank $r/$NP\] $CASE OK" || { echo "FAIL: rank $r"; exit 1; }
done
echo PASS
