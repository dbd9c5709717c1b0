#!/bin/bash
# Runs a binary under mpirun with the settings that make concurrent sandboxed
# runs safe (see docs/toolchain.md):  run_mpirun.sh NP MPIRUN BINARY [ARGS...]
set -u
NP="$1"; MPIRUN="$2"; BIN="$3"; shift 3
export TMPDIR="${TEST_TMPDIR:-$(mktemp -d)}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec timeout -k 10 280 "$MPIRUN" -np "$NP" --oversubscribe \
  --mca plm_rsh_agent false \
  --mca btl self,vader --mca pml ob1 \
  --mca btl_vader_single_copy_mechanism none \
  --mca btl_vader_backing_directory "$TMPDIR" \
  --mca mpi_yield_when_idle 1 \
  "$BIN" "$@"
