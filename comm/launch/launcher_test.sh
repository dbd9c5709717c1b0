#!/bin/bash
# The --nproc-per-node launcher: real processes, a TCP store rendezvous,
# failure propagation (exit status, signal), signal forwarding, no orphans;
# and the launch decision (plan.h) for each launcher convention: ranks started
# by someone else join that world and never start ranks of their own.
set -u
CHILD="$1"
fail() { echo "FAIL: $*"; exit 1; }
# Ranks that someone else starts (cases 6, 7) prove the job's secret to the
# store; the agent hands its own ranks this one too (it takes the user's).
export LOOM_RENDEZVOUS_SECRET=launcher-test-secret

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
# Waits until N ranks wrote their pid to $piddir.
wait_for_ranks() {
  for i in $(seq 100); do [ "$(ls "$piddir" | wc -l)" = "$1" ] && return 0; sleep 0.1; done
  fail "ranks did not start"
}
no_rank_left() {
  for p in $(ls "$piddir"); do kill -0 "$p" 2>/dev/null && fail "rank pid $p outlived the launcher"; done
}
"$CHILD" --nproc-per-node=2 --behavior=sleep --pid_dir="$piddir" > "$TEST_TMPDIR/sleep.log" 2>&1 &
launcher=$!
wait_for_ranks 2
kill -TERM $launcher
wait $launcher && fail "launcher exited 0 after SIGTERM"
cat "$TEST_TMPDIR/sleep.log"
grep -q "received signal 15" "$TEST_TMPDIR/sleep.log" || fail "signal not reported"
sleep 0.5
no_rank_left

# 4b. A rank that dies while the others honour a preemption's SIGTERM (a long
#     --signal_grace_s): the launcher stops the rest at once, not after the grace.
rm -f "$piddir"/*
start=$(date +%s)
"$CHILD" --nproc-per-node=3 --behavior=preempt --signal_grace_s=600 --pid_dir="$piddir" \
  > "$TEST_TMPDIR/preempt.log" 2>&1 &
launcher=$!
wait_for_ranks 3
kill -TERM $launcher
wait $launcher && fail "launcher exited 0 although a rank failed after SIGTERM"
cat "$TEST_TMPDIR/preempt.log"
grep -q "rank 1 (pid [0-9]*) exited with status 3 after the signal; stopping the others" \
  "$TEST_TMPDIR/preempt.log" || fail "the failed rank was not reported"
[ $(( $(date +%s) - start )) -lt 30 ] || fail "the others waited for the signal's grace"
no_rank_left

# 5. SIGKILL to the launcher: PR_SET_PDEATHSIG takes the ranks down too.
rm -f "$piddir"/*
"$CHILD" --nproc-per-node=2 --behavior=sleep --pid_dir="$piddir" > /dev/null 2>&1 &
launcher=$!
wait_for_ranks 2
kill -KILL $launcher
wait $launcher 2>/dev/null
sleep 0.5
for p in $(ls "$piddir"); do kill -0 "$p" 2>/dev/null && fail "orphan rank pid $p"; done
# 6. Each launcher convention, two processes started here (as torchrun, mpirun
#    or srun would): both join one 2-rank world, neither starts ranks.
port() { echo $(( 20000 + RANDOM % 20000 )); }
two_ranks() {  # two_ranks NAME EXPECTED_SOURCE: runs "rank_cmd 0" and "rank_cmd 1"
  local name="$1" expect="$2" log0="$TEST_TMPDIR/$1.0" log1="$TEST_TMPDIR/$1.1"
  rank_cmd 0 > "$log0" 2>&1 & local p0=$!
  rank_cmd 1 > "$log1" 2>&1 & local p1=$!
  wait $p0 || fail "$name rank 0: $(cat "$log0")"
  wait $p1 || fail "$name rank 1: $(cat "$log1")"
  cat "$log0" "$log1"
  [ "$(cat "$log0" "$log1" | grep -c "of 2 ($expect.*rendezvoused")" = 2 ] \
    || fail "$name: expected 2 ranks of 2 from $expect: $(cat "$log0" "$log1")"
  grep -q "launcher:" "$log0" "$log1" && fail "$name: a rank started ranks of its own"
  true
}
P=$(port)
rank_cmd() { timeout 60 "$CHILD" --rank="$1" --world-size=2 --master-port=$P --comm-timeout-s=20; }
two_ranks flags "flags"
P=$(port)
rank_cmd() { RANK=$1 WORLD_SIZE=2 LOCAL_RANK=$1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
  MASTER_PORT=$P timeout 60 "$CHILD" --comm-timeout-s=20; }
two_ranks torchrun "torchrun env"
grep -q "local 1 of 2" "$TEST_TMPDIR/torchrun.1" || fail "torchrun: LOCAL_WORLD_SIZE not seen"
P=$(port)
rank_cmd() { OMPI_COMM_WORLD_RANK=$1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=$1 \
  OMPI_COMM_WORLD_LOCAL_SIZE=2 MASTER_PORT=$P timeout 60 "$CHILD" --comm-timeout-s=20; }
two_ranks openmpi "OpenMPI env"
P=$(port)
rank_cmd() { SLURM_PROCID=$1 SLURM_NTASKS=2 SLURM_LOCALID=$1 SLURM_STEP_TASKS_PER_NODE=2 \
  SLURM_NODEID=0 MASTER_PORT=$P timeout 60 "$CHILD" --comm-timeout-s=20; }
two_ranks slurm "Slurm env"
grep -q "local 1 of 2" "$TEST_TMPDIR/slurm.1" || fail "slurm: tasks per node not seen"
# None: a single process is the whole world.
out=$(MASTER_PORT=$(port) timeout 60 "$CHILD" --comm-timeout-s=20 2>&1) || fail "single: $out"
echo "$out" | grep -q "rank 0 of 1 (single process" || fail "single: $out"

# 7. The report: RANK/WORLD_SIZE with no master and no --nproc-per-node. It is
#    rank 1 of 2 and waits for rank 0 (here: times out), never starting ranks.
start=$(date +%s)
out=$(RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_PORT=$(port) timeout 60 "$CHILD" \
  --comm-timeout-s=2 2>&1) && fail "rank 1 without rank 0 exited 0: $out"
echo "$out"
echo "$out" | grep -q "launcher:\|rendezvoused" && fail "ranks were started: $out"
[ $(( $(date +%s) - start )) -lt 30 ] || fail "did not time out on --comm-timeout-s"
# ... and an explicit --nproc-per-node > 1 with those variables is an error naming both.
out=$(RANK=1 WORLD_SIZE=2 timeout 60 "$CHILD" --nproc-per-node=2 2>&1)
[ $? = 2 ] || fail "--nproc-per-node=2 under RANK/WORLD_SIZE should exit 2: $out"
echo "$out"
echo "$out" | grep -q -- "--nproc-per-node=2.*RANK=1, WORLD_SIZE=2" || fail "not named: $out"
# Half of the variables: the missing one is named.
out=$(RANK=1 timeout 60 "$CHILD" 2>&1)
[ $? = 2 ] || fail "RANK without WORLD_SIZE should exit 2: $out"
echo "$out" | grep -q "RANK=1 is set but WORLD_SIZE is not" || fail "not named: $out"
# 8. --max-restarts: rank 1 fails on the first start; every rank is stopped and
#    started again (LOOM_RESTART_COUNT=1), and the job ends well.
out=$(timeout 90 "$CHILD" --nproc-per-node=3 --behavior=fail_once --max-restarts=2 2>&1) \
  || fail "fail_once with --max-restarts=2 did not end well: $out"
echo "$out"
echo "$out" | grep -q "restart 1/2: rank 1 (pid [0-9]*) exited with status 3" \
  || fail "restart not logged with its cause: $out"
[ "$(echo "$out" | grep -c rendezvoused)" = 3 ] || fail "3 ranks should finish after the restart"
echo "$out" | grep -q "restart 2/2" && fail "restarted twice: $out"

# 9. A rank that fails every time: after --max-restarts the job fails, naming it.
out=$(timeout 90 "$CHILD" --nproc-per-node=2 --behavior=fail_always --max-restarts=2 2>&1) \
  && fail "fail_always exited 0: $out"
echo "$out"
echo "$out" | grep -q "failed again after 2 restart(s) (--max-restarts=2); last failure: rank 1" \
  || fail "the final failure is not named: $out"

# 10. A rank that never reports progress is declared hung and named.
start=$(date +%s)
out=$(timeout 90 "$CHILD" --nproc-per-node=2 --behavior=hang --heartbeat-timeout-s=2 2>&1) \
  && fail "hang exited 0: $out"
echo "$out"
echo "$out" | grep -q "rank 1 (pid [0-9]*) is hung: no progress for .* last heartbeat: iteration 0, training step" \
  || fail "hung rank not named: $out"
[ $(( $(date +%s) - start )) -lt 30 ] || fail "the hang took too long to find"

# 11. SIGSTOP on a rank that was beating: hung, named, and killed (no orphan).
rm -f "$piddir"/*
"$CHILD" --nproc-per-node=2 --behavior=beat --heartbeat-timeout-s=2 --pid_dir="$piddir" \
  > "$TEST_TMPDIR/stop.log" 2>&1 &
agent=$!
for i in $(seq 100); do [ "$(ls "$piddir" | wc -l)" = 2 ] && break; sleep 0.1; done
[ "$(ls "$piddir" | wc -l)" = 2 ] || fail "beat ranks did not start"
for p in $(ls "$piddir"); do [ "$(cat "$piddir/$p")" = 1 ] && stopped=$p; done
sleep 1
kill -STOP "$stopped"
wait $agent && fail "agent exited 0 after a rank was stopped"
cat "$TEST_TMPDIR/stop.log"
grep -q "rank 1 (pid $stopped) is hung (stopped): .* last heartbeat: iteration [0-9]*, training step" \
  "$TEST_TMPDIR/stop.log" || fail "stopped rank not named"
sleep 0.5
for p in $(ls "$piddir"); do kill -0 "$p" 2>/dev/null && fail "rank pid $p outlived the agent"; done

# 12. Two nodes on this machine: one agent each, 2 ranks each, one world of 4.
P=$(port)
two_nodes() {  # two_nodes ARGS...: both agents, logs in $TEST_TMPDIR/node{0,1}
  local master="--master-addr=127.0.0.1 --master-port=$P"
  [ -n "${MASTER_PORT:-}" ] && master=""  # the caller's MASTER_ADDR/MASTER_PORT say it
  timeout 120 "$CHILD" --nnodes=2 --node-rank=0 $master \
    --nproc-per-node=2 "$@" > "$TEST_TMPDIR/node0" 2>&1 & local a0=$!
  timeout 120 "$CHILD" --nnodes=2 --node-rank=1 $master \
    --nproc-per-node=2 "$@" > "$TEST_TMPDIR/node1" 2>&1 & local a1=$!
  wait $a0; rc0=$?
  wait $a1; rc1=$?
  cat "$TEST_TMPDIR/node0" "$TEST_TMPDIR/node1"
}
two_nodes --behavior=store --comm-timeout-s=30
[ $rc0 = 0 ] && [ $rc1 = 0 ] || fail "two nodes: exit $rc0 / $rc1"
[ "$(cat "$TEST_TMPDIR/node0" "$TEST_TMPDIR/node1" | grep -c "of 4 (torchrun env.*rendezvoused")" = 4 ] \
  || fail "two nodes: expected 4 ranks of one world"
grep -q "rank 3 of 4" "$TEST_TMPDIR/node1" || fail "node 1 should run ranks 2 and 3"
# ... and with node 0's address in torchrun's MASTER_ADDR/MASTER_PORT instead of the
# flags: the agents resolve it as the ranks do (discovery.h's ResolveMaster).
MASTER_ADDR=127.0.0.1 MASTER_PORT=$(port) two_nodes --nproc-per-node=1 --behavior=store \
  --comm-timeout-s=30
[ $rc0 = 0 ] && [ $rc1 = 0 ] || fail "two nodes from MASTER_ADDR/MASTER_PORT: exit $rc0 / $rc1"
[ "$(cat "$TEST_TMPDIR/node0" "$TEST_TMPDIR/node1" | grep -c "of 2 (torchrun env.*rendezvoused")" = 2 ] \
  || fail "two nodes from MASTER_ADDR/MASTER_PORT: expected 2 ranks of one world"

# 13. Rank 3 (node 1) fails once: both agents restart, the job ends well.
P=$(port)
two_nodes --behavior=fail_once --fail_rank=3 --max-restarts=1 --comm-timeout-s=30
[ $rc0 = 0 ] && [ $rc1 = 0 ] || fail "two nodes restart: exit $rc0 / $rc1"
for n in 0 1; do
  grep -q "restart 1/1: rank 3 (pid [0-9]*) on node 1 (.*) exited with status 3" \
    "$TEST_TMPDIR/node$n" || fail "node $n did not log the restart and its cause"
done

# 14. A node that never comes: node 0's agent names it within --comm-timeout-s.
P=$(port)
out=$(timeout 60 "$CHILD" --nnodes=2 --node-rank=0 --master-addr=127.0.0.1 --master-port=$P \
  --nproc-per-node=1 --comm-timeout-s=3 2>&1) && fail "lone node 0 exited 0"
echo "$out"
echo "$out" | grep -q "1 of 2 nodes joined within 3s; missing node(s) 1" || fail "not named: $out"

# 15. Across nodes the secret is the user's: none is an error before anything starts.
out=$(env -u LOOM_RENDEZVOUS_SECRET timeout 60 "$CHILD" --nnodes=2 --node-rank=1 \
  --master-addr=127.0.0.1 2>&1)
[ $? = 2 ] || fail "--nnodes=2 without a secret should exit 2: $out"
echo "$out" | grep -q -- "--rendezvous-secret=S or LOOM_RENDEZVOUS_SECRET" || fail "not named: $out"
out=$(timeout 60 "$CHILD" --nnodes=2 --node-rank=2 --master-addr=127.0.0.1 2>&1)
[ $? = 2 ] || fail "--node-rank=2 of 2 should exit 2: $out"
# ... and so is no node 0 address, or a MASTER_PORT that is not a port.
out=$(env -u MASTER_ADDR timeout 60 "$CHILD" --nnodes=2 --node-rank=1 2>&1)
[ $? = 2 ] || fail "--nnodes=2 without a master address should exit 2: $out"
echo "$out" | grep -q -- "needs --master-addr (or MASTER_ADDR)" || fail "not named: $out"
out=$(MASTER_ADDR=127.0.0.1 MASTER_PORT=x timeout 60 "$CHILD" --nnodes=2 --node-rank=1 2>&1)
[ $? = 2 ] || fail "--nnodes=2 with MASTER_PORT=x should exit 2: $out"
echo "$out" | grep -q "MASTER_PORT='x'" || fail "not named: $out"
echo PASS
