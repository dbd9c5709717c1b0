#!/bin/bash
# The flight recorder on real processes: rank 1 of 3 stops issuing
# collectives on purpose; ranks 0 and 2 time out (2 s) and dump; rank 1 gets
# SIGUSR1 and dumps too (its run goes on: it then exits on its own); the
# analyzer must name rank 1.
#   stall_test.sh ucx STALL_MAIN FLIGHT
#   stall_test.sh mpi STALL_MAIN FLIGHT MPIRUN
set -u
MODE="$1"; BIN="$2"; FLIGHT="$3"; MPIRUN="${4:-}"
export TMPDIR="${TEST_TMPDIR:-$(mktemp -d)}"
DIR="$TMPDIR/flight"
PIDFILE="$TMPDIR/stopped.pid"
rm -rf "$DIR" "$PIDFILE"
ARGS=(--comm_timeout_s=2 --flight_recorder_dir="$DIR" --stop_rank=1 --stop_after=3
      --pid_file="$PIDFILE")
fail() { echo "FAIL: $*"; cat "$TMPDIR"/*.log 2>/dev/null; exit 1; }

if [ "$MODE" = ucx ]; then
  # Started by hand: the launcher would stop the others when one exits.
  # Ranks started by hand share the TCP store's secret through the environment.
  LOOM_RENDEZVOUS_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
  export LOOM_RENDEZVOUS_SECRET
  PORT=$(( 20000 + RANDOM % 20000 ))
  for r in 0 1 2; do
    RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT \
      timeout -k 5 90 "$BIN" --backend=ucx "${ARGS[@]}" > "$TMPDIR/rank$r.log" 2>&1 &
    pids[$r]=$!
  done
  wait_done() { wait ${pids[0]} && wait ${pids[2]}; }
elif [ "$MODE" = mpi ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # --enable-recovery: a rank that exits (without MPI_Finalize) does not stop the others.
  timeout -k 10 90 "$MPIRUN" -np 3 --oversubscribe --enable-recovery \
    --mca plm_rsh_agent false --mca btl self,vader --mca pml ob1 \
    --mca btl_vader_single_copy_mechanism none --mca btl_vader_backing_directory "$TMPDIR" \
    "$BIN" --backend=mpi "${ARGS[@]}" > "$TMPDIR/mpirun.log" 2>&1 &
  MPIRUN_PID=$!
  wait_done() {
    for _ in $(seq 1 600); do
      [ "$(grep -c "TIMED_OUT" "$TMPDIR/mpirun.log")" -ge 2 ] && return 0
      kill -0 $MPIRUN_PID 2>/dev/null || return 1
      sleep 0.1
    done
    return 1
  }
else
  fail "unknown mode $MODE"
fi

# The survivors time out and exit after their dumps are written.
wait_done || fail "ranks 0 and 2 did not both time out"
grep -h "TIMED_OUT" "$TMPDIR"/*.log
for _ in $(seq 1 100); do [ -s "$PIDFILE" ] && break; sleep 0.1; done
[ -s "$PIDFILE" ] || fail "rank 1 never stopped"
kill -USR1 "$(cat "$PIDFILE")" || fail "cannot signal rank 1"
if [ "$MODE" = ucx ]; then wait ${pids[1]} || fail "rank 1 exited non-zero"; else wait $MPIRUN_PID; fi
grep -q "\[rank 1\] STOPPED_RANK_DUMPED" "$TMPDIR"/*.log || fail "rank 1 did not dump on SIGUSR1"
ls -l "$DIR"
out=$("$FLIGHT" "$DIR"); rc=$?
echo "$out"
[ $rc = 1 ] || fail "the analyzer exited $rc, expected 1 (a culprit)"
echo "$out" | grep -q "group 'world' (world ranks 0,1,2): all_reduce #[0-9]* (f32, 1024 B): issued by ranks 0, 2; never issued by rank 1 (its last op: all_reduce #[0-9]*, completed" \
  || fail "the analyzer did not name rank 1"
echo "$out" | grep -q "^culprit: world rank 1$" || fail "culprit is not rank 1 alone"
echo "$out" | grep -q "dumped because: SIGUSR1" || fail "rank 1's dump is not the SIGUSR1 one"
echo PASS
