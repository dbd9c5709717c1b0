#!/usr/bin/env bash
# //train:gpt on two "hosts": two network namespaces with their own host names
# joined by a veth pair (tests/two_hosts_lib.sh), UCX held to TCP
# (UCX_TLS=tcp,self: the namespaces share memory, so a shared-memory transport
# would bypass the wire). Every run trains the same small job as a 2-rank
# reference started on this machine (gpt --nproc-per-node=2) and must end
# with a final checkpoint bit-identical to the reference's.
#   1. one rank per host, explicit (--rank/--world-size/--master-addr): ONE
#      world over the wire (MBs through the veth both ways, only rank 0 logs);
#   2. one agent per host (--nnodes=2 --node-rank=R --nproc-per-node=1), the
#      torchrun-style way to go multi-node;
#   3. a rank on host B dies (LOOM_FAULT sigkill, and kill -9 by hand): every
#      agent stops its ranks and restarts all of them from the newest
#      checkpoint, both logging "restart 1/M: rank 1 ... on node 1 (<host B>) ...";
#   4. the link is cut for good: both agents exit non-zero within the timeout,
#      naming the unreachable peer, and neither trains on alone;
#   5. the link is cut and comes back: for 2 s, the job rides it out and ends
#      bit-identical; for longer than the timeout, both sides either restart
#      and end bit-identical or both fail, naming each other, never one alone.
# Skips (exit 0, saying why) without root or network namespaces.
#   two_hosts_test.sh GPT PREPROCESS
set -euo pipefail
GPT="$(readlink -f "$1")"; PREPROCESS="$(readlink -f "$2")"
source "$(dirname "$0")/two_hosts_lib.sh"  # beside this script (also in Bazel's runfiles)
source "$(dirname "$0")/checkpoint_lib.sh"  # final, same
source "$(dirname "$0")/corpus_lib.sh"  # tiny_corpus
if reason=$(th_skip_reason); then echo "SKIPPED: two_hosts_test: $reason"; exit 0; fi

T="${TEST_TMPDIR:-$(mktemp -d)}"
cd "$T"
start=$SECONDS
elapsed() { echo "[$((SECONDS - start)) s] $*"; }
fail() {
  echo "FAILED: $*"
  local f
  for f in "$T"/*.a.log "$T"/*.b.log; do [ -f "$f" ] && { echo "--- $f"; tail -25 "$f"; }; done
  exit 1
}
trap th_cleanup EXIT
trap 'exit 143' TERM INT  # Bazel's timeout: still clean up (EXIT)
th_setup

export OMP_NUM_THREADS=1
export UCX_TLS=tcp,self                  # the wire only, never shared memory
export LOOM_RENDEZVOUS_SECRET; LOOM_RENDEZVOUS_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')

tiny_corpus "$PREPROCESS" "$T/corpus"

ITERS=200
JOB=(--distributed-backend=ucx --data-path="$T/corpus" --data-cache-dir="$T/cache" --num-layers=2
     --hidden-size=64 --num-attention-heads=4 --seq-length=32 --micro-batch-size=2
     --global-batch-size=4 --eval-interval=100000 --sample-tokens=0 --log-interval=1
     --save-interval=20)
# Two hosts: held to TCP also through --network (its UCX_TLS default would
# add sm; the UCX_TLS set above wins). Timeouts short enough for a test.
TIMEOUT_S=10
HOSTS=(--network=ethernet --comm-timeout-s=$TIMEOUT_S)
AGENT=(--nnodes=2 --nproc-per-node=1 --master-addr="$TH_ADDR_A" --heartbeat-timeout-s=$TIMEOUT_S)

steps() { grep -c "^ *iteration " "$1" 2>/dev/null || true; }
port() { echo $((20000 + RANDOM % 20000)); }  # inside our namespaces: nobody else listens there

# both NAME LIMIT_S [ARGS...]: host A and host B run gpt ARGS (each adds its own
# --node-rank / --rank through A_ARGS / B_ARGS), logs NAME.a.log / NAME.b.log;
# sets RC_A, RC_B.
both() {
  local name="$1" limit="$2"; shift 2
  th_start A "$T/$name.a.log" "$GPT" "${A_ARGS[@]}" "$@"
  th_start B "$T/$name.b.log" env ${B_ENV[@]+"${B_ENV[@]}"} "$GPT" "${B_ARGS[@]}" "$@"
  th_wait "$TH_PID_A" "$limit"; RC_A=$TH_RC
  th_wait "$TH_PID_B" 30; RC_B=$TH_RC
}
B_ENV=()

# The reference: both ranks on this machine, started by gpt itself.
timeout -k 5 120 "$GPT" --nproc-per-node=2 "${JOB[@]}" --train-iters=$ITERS --save="$T/ref" \
  > ref.log 2>&1 || { tail -20 ref.log; fail "reference run"; }
elapsed "reference (gpt --nproc-per-node=2 on this machine): $(basename "$(final "$T/ref")")"

# 1. Explicit ranks, one per host: one world, over the wire.
[ "$(th_exec A hostname)" = "$TH_HOST_A" ] && [ "$(th_exec B hostname)" = "$TH_HOST_B" ] &&
  [ "$(hostname)" != "$TH_HOST_A" ] || fail "the hosts do not have host names of their own"
tx_a=$(th_tx_bytes A); tx_b=$(th_tx_bytes B)
P=$(port)
A_ARGS=(--rank=0 --world-size=2 --master-addr="$TH_ADDR_A" --master-port=$P)
B_ARGS=(--rank=1 --world-size=2 --master-addr="$TH_ADDR_A" --master-port=$P)
both explicit 120 "${JOB[@]}" "${HOSTS[@]}" --train-iters=$ITERS --save="$T/explicit"
[ "$RC_A" = 0 ] && [ "$RC_B" = 0 ] || fail "explicit: host A exited $RC_A, host B $RC_B"
sent_a=$(($(th_tx_bytes A) - tx_a)); sent_b=$(($(th_tx_bytes B) - tx_b))
echo "  over the veth: host A sent $sent_a bytes, host B $sent_b"
[ "$sent_a" -gt 1000000 ] && [ "$sent_b" -gt 1000000 ] || fail "explicit: the ranks did not talk over the wire"
grep -q "2 ranks = TP 1 x PP 1 x DP 2" explicit.a.log || fail "explicit: not one world of 2 ranks"
[ "$(steps explicit.b.log)" = 0 ] || fail "explicit: host B logged steps (a world of its own?)"
same "$T/ref" "$T/explicit"
elapsed "1. explicit ranks, one per host: ok"

# 2. One agent per host.
P=$(port)
A_ARGS=(--node-rank=0 "${AGENT[@]}" --master-port=$P --max-restarts=2)
B_ARGS=(--node-rank=1 "${AGENT[@]}" --master-port=$P --max-restarts=2)
both agents 120 "${JOB[@]}" "${HOSTS[@]}" --train-iters=$ITERS --save="$T/agents"
[ "$RC_A" = 0 ] && [ "$RC_B" = 0 ] || fail "agents: host A exited $RC_A, host B $RC_B"
grep -q "2 ranks = TP 1 x PP 1 x DP 2" agents.a.log || fail "agents: not one world of 2 ranks"
[ "$(steps agents.b.log)" = 0 ] || fail "agents: host B logged steps (a world of its own?)"
grep -q "restart " agents.a.log agents.b.log && fail "agents: restarted without a failure"
same "$T/ref" "$T/agents"
elapsed "2. one agent per host: ok"

# 3a. Rank 1 (host B) killed by the fault injector at step 50 (first attempt only).
P=$(port)
A_ARGS=(--node-rank=0 "${AGENT[@]}" --master-port=$P --max-restarts=2)
B_ARGS=(--node-rank=1 "${AGENT[@]}" --master-port=$P --max-restarts=2)
B_ENV=(LOOM_FAULT=rank=1,iteration=50,kind=sigkill)
both fault 180 "${JOB[@]}" "${HOSTS[@]}" --train-iters=$ITERS --save="$T/fault"
B_ENV=()
[ "$RC_A" = 0 ] && [ "$RC_B" = 0 ] || fail "fault: host A exited $RC_A, host B $RC_B"
grep -h "restart 1/2" fault.a.log fault.b.log || fail "fault: no 'restart 1/2' logged"
# Both agents say it, naming the rank, its node and that node's host name.
for h in a b; do
  grep -q "restart 1/2: .*rank 1 .*on node 1 ($TH_HOST_B)" fault.$h.log ||
    fail "fault: host ${h^^}'s agent does not name rank 1 on node 1 ($TH_HOST_B)"
done
grep -q "restart 2/2" fault.a.log fault.b.log && fail "fault: restarted twice"
same "$T/ref" "$T/fault"
elapsed "3a. rank 1 on host B killed (LOOM_FAULT) at step 50: restarted, bit-identical"

# 3b. The same by hand: kill -9 of host B's rank process while it trains.
P=$(port)
A_ARGS=(--node-rank=0 "${AGENT[@]}" --master-port=$P --max-restarts=2)
B_ARGS=(--node-rank=1 "${AGENT[@]}" --master-port=$P --max-restarts=2)
th_start A "$T/kill.a.log" "$GPT" "${A_ARGS[@]}" "${JOB[@]}" "${HOSTS[@]}" --train-iters=$ITERS \
  --save="$T/kill"
th_start B "$T/kill.b.log" "$GPT" "${B_ARGS[@]}" "${JOB[@]}" "${HOSTS[@]}" --train-iters=$ITERS \
  --save="$T/kill"
for _ in $(seq 1 600); do [ "$(steps kill.a.log)" -ge 30 ] && break; sleep 0.05; done
[ "$(steps kill.a.log)" -ge 30 ] || fail "kill: no progress"
victim=$(pgrep -P "$TH_PID_B" | head -n1)   # the rank host B's agent started
[ -n "$victim" ] || fail "kill: no rank process on host B"
th_pids B | grep -qx "$victim" || fail "kill: rank $victim is not on host B"
at=$(steps kill.a.log)
kill -KILL "$victim"
echo "  killed rank process $victim on host B at about step $at"
th_wait "$TH_PID_A" 180; RC_A=$TH_RC; th_wait "$TH_PID_B" 30; RC_B=$TH_RC
[ "$RC_A" = 0 ] && [ "$RC_B" = 0 ] || fail "kill: host A exited $RC_A, host B $RC_B"
grep -h "restart 1/2" kill.a.log kill.b.log || fail "kill: no 'restart 1/2' logged"
for h in a b; do
  grep -q "restart 1/2: .*rank 1 .*on node 1 ($TH_HOST_B) was killed by signal 9" kill.$h.log ||
    fail "kill: host ${h^^}'s agent does not name rank 1 on node 1 ($TH_HOST_B), signal 9"
done
same "$T/ref" "$T/kill"
elapsed "3b. rank process on host B killed -9 at step ~$at: restarted, bit-identical"

# 4. The link cut for good, mid-training: both agents give up within the
# timeout (restarts cannot meet either), each naming the other side, and
# neither trains on alone.
P=$(port)
A_ARGS=(--node-rank=0 "${AGENT[@]}" --master-port=$P --max-restarts=1)
B_ARGS=(--node-rank=1 "${AGENT[@]}" --master-port=$P --max-restarts=1)
th_start A "$T/cut.a.log" "$GPT" "${A_ARGS[@]}" "${JOB[@]}" "${HOSTS[@]}" --train-iters=1000000 \
  --save="$T/cut"
th_start B "$T/cut.b.log" "$GPT" "${B_ARGS[@]}" "${JOB[@]}" "${HOSTS[@]}" --train-iters=1000000 \
  --save="$T/cut"
for _ in $(seq 1 600); do [ "$(steps cut.a.log)" -ge 30 ] && break; sleep 0.05; done
[ "$(steps cut.a.log)" -ge 30 ] || fail "cut: no progress"
th_cut
cut_at=$SECONDS
at=$(steps cut.a.log)
echo "  link cut at step ~$at"
# The collective's (or the heartbeat's) timeout, then the agents' own wait for
# each other's report (measured: 25 s in all with 10 s timeouts), with room.
LIMIT=$((45 * TIMEOUT_S / 10))
th_wait "$TH_PID_A" "$LIMIT"; RC_A=$TH_RC
th_wait "$TH_PID_B" $((LIMIT - (SECONDS - cut_at) > 1 ? LIMIT - (SECONDS - cut_at) : 1)); RC_B=$TH_RC
took=$((SECONDS - cut_at))
echo "  host A exited $RC_A, host B $RC_B, $took s after the cut"
tail -5 cut.a.log; tail -5 cut.b.log
[ "$RC_A" != 124 ] && [ "$RC_B" != 124 ] || fail "cut: still running ${LIMIT} s after the cut (hang)"
[ "$RC_A" != 0 ] && [ "$RC_B" != 0 ] || fail "cut: an agent exited 0 without its peer"
after=$(steps cut.a.log)
[ "$after" -le $((at + 1)) ] || fail "cut: host A trained on alone (step $at at the cut, $after at exit)"
[ "$(steps cut.b.log)" = 0 ] || fail "cut: host B trained alone"
# Each names the other side: its host name or its address.
grep -qF -e "$TH_HOST_B" -e "$TH_ADDR_B" cut.a.log || fail "cut: host A does not name host B"
grep -qF -e "$TH_HOST_A" -e "$TH_ADDR_A" cut.b.log || fail "cut: host B does not name host A"
th_restore
elapsed "4. link cut: both agents failed in $took s (limit $LIMIT s), naming the peer, none trained alone"

# 5. The link cut, then back.
flap() {  # flap NAME CUT_S: a finite job, the link cut at step ~30 for CUT_S seconds
  local name="$1" cut_s="$2"
  P=$(port)
  A_ARGS=(--node-rank=0 "${AGENT[@]}" --master-port=$P --max-restarts=3)
  B_ARGS=(--node-rank=1 "${AGENT[@]}" --master-port=$P --max-restarts=3)
  th_start A "$T/$name.a.log" "$GPT" "${A_ARGS[@]}" "${JOB[@]}" "${HOSTS[@]}" \
    --train-iters=$ITERS --save="$T/$name"
  th_start B "$T/$name.b.log" "$GPT" "${B_ARGS[@]}" "${JOB[@]}" "${HOSTS[@]}" \
    --train-iters=$ITERS --save="$T/$name"
  for _ in $(seq 1 600); do [ "$(steps "$name.a.log")" -ge 30 ] && break; sleep 0.05; done
  [ "$(steps "$name.a.log")" -ge 30 ] || fail "$name: no progress"
  th_cut
  CUT_AT=$(steps "$name.a.log")
  echo "  link cut at step ~$CUT_AT for $cut_s s"
  sleep "$cut_s"
  th_restore || fail "$name: the link did not come back"
  th_wait "$TH_PID_A" 120; RC_A=$TH_RC; th_wait "$TH_PID_B" 30; RC_B=$TH_RC
  echo "  host A exited $RC_A, host B $RC_B"
  [ "$RC_A" != 124 ] && [ "$RC_B" != 124 ] || fail "$name: still running 120 s after the link came back"
}
# 5a. Shorter than the timeout: TCP resends, the job rides it out.
flap blip 2
[ "$RC_A" = 0 ] && [ "$RC_B" = 0 ] || fail "blip: host A exited $RC_A, host B $RC_B"
grep -h "restart " blip.a.log blip.b.log || echo "  (no restart: the job rode the cut out)"
same "$T/ref" "$T/blip"
elapsed "5a. link cut for 2 s: finished, bit-identical"
# 5b. Longer than the timeout: the collectives time out on both sides; then
# the agents either restart the job once the link is back (and it finishes
# bit-identical) or both give up in time, naming each other. Never one alone.
flap flap $((TIMEOUT_S + 3))
[ "$(steps flap.b.log)" = 0 ] || fail "flap: host B trained alone"
if [ "$RC_A" = 0 ] && [ "$RC_B" = 0 ]; then
  grep -h "restart " flap.a.log flap.b.log || true
  same "$T/ref" "$T/flap"
  elapsed "5b. link cut for $((TIMEOUT_S + 3)) s: the job restarted and finished bit-identical"
elif [ "$RC_A" != 0 ] && [ "$RC_B" != 0 ]; then
  tail -3 flap.a.log; tail -3 flap.b.log
  grep -qF -e "$TH_HOST_B" -e "$TH_ADDR_B" flap.a.log || fail "flap: host A does not name host B"
  grep -qF -e "$TH_HOST_A" -e "$TH_ADDR_A" flap.b.log || fail "flap: host B does not name host A"
  grep -q "iteration *$ITERS/" flap.a.log && fail "flap: host A finished alone"
  elapsed "5b. link cut for $((TIMEOUT_S + 3)) s: both agents gave up, naming each other"
else
  fail "flap: one side finished, the other failed: host A exited $RC_A, host B $RC_B"
fi

echo "two_hosts_test: ok in $((SECONDS - start)) s"
