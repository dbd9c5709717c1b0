#!/usr/bin/env bash
# Issue #17 at the level of a real job: a 2-rank UCX training run (one node,
# so rank 0 serves the job's TCP store on --master-port) trains to the end
# while //comm:store_intruder hammers that port from 127.0.0.1..3 with
# garbage, a wrong secret, a replayed recorded handshake, silent and oversize
# connections. None gets in; rank 0 logs the refusals once per address and
# never the secret.
#   store_intruder_test.sh GPT INTRUDER
set -euo pipefail
GPT="$(readlink -f "$1")"; INTRUDER="$(readlink -f "$2")"
cd "$TEST_TMPDIR"
export OMP_NUM_THREADS=1  # 2 ranks and the intruder on 2 cores

SECRET="intruder-test-$RANDOM$RANDOM-not-to-be-logged"
fail() { echo "FAILED: $*"; echo "--- job stdout (tail)"; tail -5 job.out || true
         echo "--- job stderr"; cat job.err || true; echo "--- intruder"; cat intruder.out || true
         exit 1; }

# A port nobody listens on.
for _ in 1 2 3 4 5 6 7 8 9 10; do
  PORT=$((20000 + RANDOM % 20000))
  command -v ss > /dev/null || break
  ss -Htan "( sport = :$PORT )" | grep -q . || break
done

ITERS=40000  # ~20 s on two idle cores
start=$(date +%s)
LOOM_RENDEZVOUS_SECRET="$SECRET" timeout -k 5 150 "$GPT" --distributed-backend=ucx \
  --nproc-per-node=2 --master-port="$PORT" --num-layers=2 --hidden-size=32 \
  --num-attention-heads=4 --seq-length=16 --micro-batch-size=2 --global-batch-size=4 \
  --train-iters=$ITERS --log-interval=5000 --eval-interval=0 --sample-tokens=0 \
  --data-cache-dir="$TEST_TMPDIR/cache" > job.out 2> job.err &
JOB=$!
trap 'kill "$JOB" "${INTRUDER_PID:-}" 2> /dev/null || true' EXIT
# The intruder waits for the store to come up and stops once it is gone (the
# job ended); --seconds only bounds it.
"$INTRUDER" --host=127.0.0.1 --port="$PORT" --seconds=120 --secret="$SECRET" --sources=3 \
  > intruder.out 2>&1 &
INTRUDER_PID=$!

# Rank 0's store listens on 127.0.0.1:PORT only (never every interface).
if command -v ss > /dev/null; then
  listening=""
  for _ in $(seq 1 200); do
    listening=$(ss -Hltnp "( sport = :$PORT )" || true)
    [ -n "$listening" ] && break
    kill -0 "$JOB" 2> /dev/null || break
    sleep 0.1
  done
  echo "listening: $listening"
  [ -n "$listening" ] || fail "nothing listens on port $PORT"
  echo "$listening" | grep -q "127.0.0.1:$PORT " || fail "the store does not bind 127.0.0.1:$PORT"
  # The launcher starts its ranks through /proc/self/exe: the listener is a
  # process of the gpt binary (rank 0), not the agent.
  pid=$(echo "$listening" | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1)
  if [ -n "$pid" ]; then
    [ "$(readlink -f "/proc/$pid/exe")" = "$GPT" ] || fail "port $PORT is served by pid $pid, not gpt"
    [ "$pid" != "$JOB" ] || fail "port $PORT is served by the agent, not by rank 0"
  fi
fi

job_rc=0; wait "$JOB" || job_rc=$?
job_s=$(( $(date +%s) - start ))
intruder_rc=0; wait "$INTRUDER_PID" || intruder_rc=$?
echo "job: exit $job_rc after ${job_s}s; intruder: exit $intruder_rc after $(( $(date +%s) - start ))s"
cat intruder.out
tail -2 job.out

# The job trained to the end.
[ "$job_rc" = 0 ] || fail "the job exited $job_rc"
grep -q "iteration *$ITERS/ *$ITERS " job.out || fail "no last iteration ($ITERS) in the job's log"

# Nothing got in, and every kind of attempt was made (and refused).
[ "$intruder_rc" = 0 ] || fail "the intruder exited $intruder_rc"
summary=$(grep -E '^intruder: [0-9]+ attempts, 0 got in' intruder.out) || fail "no intruder summary"
for kind in garbage "wrong secret" replay silent oversize; do
  n=$(echo "$summary" | sed -n "s/.*[(,] *$kind \([0-9]*\)[,)].*/\1/p")
  [ -n "$n" ] && [ "$n" -gt 0 ] || fail "no '$kind' attempt was made: $summary"
done
grep -q "GOT IN\|NOT CLOSED" intruder.out && fail "an intruder got in"

# Rank 0 logged the refusals: once for each of the intruder's addresses, never
# twice for one; the secret appears nowhere.
refusals=$(grep 'TCP store (rank 0, 127.0.0.1:'"$PORT"') refused a connection from' job.err || true)
echo "$refusals"
for ip in 127.0.0.1 127.0.0.2 127.0.0.3; do
  n=$(echo "$refusals" | grep -c "refused a connection from $ip: " || true)
  [ "$n" = 1 ] || fail "$n refusal lines for $ip (want exactly 1)"
done
dups=$(grep -o 'refused a connection from [0-9.]*' job.err | sort | uniq -d)
[ -z "$dups" ] || fail "refusals logged more than once: $dups"
if grep -qF -- "$SECRET" job.err job.out; then fail "the secret was logged"; fi
echo "PASSED in $(( $(date +%s) - start ))s"
