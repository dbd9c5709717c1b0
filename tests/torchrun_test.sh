#!/usr/bin/env bash
# //train:gpt under the real torchrun (PyTorch's, from the reference
# environment `tools/setup.sh --torch` makes; tools/pytorch_reference/find_torch.sh).
# torchrun's agent serves its own store on MASTER_PORT; Loom's rank 0 serves
# the job's authenticated store on a free port and announces it there
# (comm/launch/torchrun.h). Every run trains the same small job as a 2-rank
# reference started by gpt itself and must end bit-identical to it.
#   1. one node, static rendezvous: torchrun --nproc-per-node=2;
#   2. torchrun --max-restarts=1: rank 1 SIGKILLed at step 25 (LOOM_FAULT),
#      torchrun restarts both workers, the job resumes from --save (logging
#      the restart count torchrun passed) and finishes;
#   3. bad input, refused before training and naming what was typed: flags
#      that disagree with torchrun's world, a layout that does not fit it, no
#      rendezvous secret;
#   4. two "hosts" (network namespaces, tests/two_hosts_lib.sh), one torchrun
#      each, --rdzv-backend=c10d: one world over the wire; then the same with
#      rank 1 on host B SIGKILLed: both agents restart, the job finishes.
# Skips (exit 0, saying why) without PyTorch (a failure under
# LOOM_REQUIRE_TORCH=1, as in CI); part 4 skips without root / namespaces.
#   torchrun_test.sh GPT PREPROCESS
set -euo pipefail
GPT="$(readlink -f "$1")"; PREPROCESS="$(readlink -f "$2")"
HERE="$(dirname "$0")"
if [ -n "${TEST_SRCDIR:-}" ]; then ROOT="$TEST_SRCDIR/loom"; else ROOT="$(readlink -f "$HERE/..")"; fi
source "$ROOT/tools/pytorch_reference/find_torch.sh"
PY=$(find_torch_python) || { echo "SKIPPED: torchrun_test: $PY"; exit "$(torch_missing_status)"; }
TORCHRUN=("$PY" -W ignore -m torch.distributed.run)
source "$HERE/two_hosts_lib.sh"
source "$HERE/checkpoint_lib.sh"
source "$HERE/corpus_lib.sh"

T="${TEST_TMPDIR:-$(mktemp -d)}"
cd "$T"
start=$SECONDS
elapsed() { echo "[$((SECONDS - start)) s] $*"; }
fail() {
  echo "FAILED: $*"
  local f
  for f in "$T"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -25 "$f"; }; done
  exit 1
}
trap th_cleanup EXIT
trap 'exit 143' TERM INT

export OMP_NUM_THREADS=1
export LOOM_RENDEZVOUS_SECRET; LOOM_RENDEZVOUS_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT LOOM_FAULT LOOM_RESTART_COUNT

tiny_corpus "$PREPROCESS" "$T/corpus"

ITERS=60
JOB=(--distributed-backend=ucx --data-path="$T/corpus" --data-cache-dir="$T/cache" --num-layers=2
     --hidden-size=64 --num-attention-heads=4 --seq-length=32 --micro-batch-size=2
     --global-batch-size=4 --eval-interval=100000 --sample-tokens=0 --log-interval=5
     --save-interval=10 --train-iters=$ITERS --comm-timeout-s=20)
port() { echo $((20000 + RANDOM % 20000)); }

timeout -k 5 120 "$GPT" --nproc-per-node=2 "${JOB[@]}" --save="$T/ref" > ref.log 2>&1 ||
  { tail -20 ref.log; fail "reference run"; }
elapsed "reference (gpt --nproc-per-node=2): $(basename "$(final "$T/ref")")"

# 1. One node, static rendezvous on a port torchrun's agent serves.
P=$(port)
timeout -k 5 120 "${TORCHRUN[@]}" --nproc-per-node=2 --master-port=$P --no-python \
  "$GPT" "${JOB[@]}" --save="$T/static" > static.log 2>&1 || fail "static: torchrun exited $?"
grep -q "Address already in use" static.log && fail "static: a port collision"
grep -q "rank 0 serves the job's store at 127.0.0.1:[0-9]* (announced in torchrun's store" static.log ||
  fail "static: rank 0 did not announce its store in torchrun's"
grep -q "2 ranks = TP 1 x PP 1 x DP 2" static.log || fail "static: not one world of 2 ranks"
same "$T/ref" "$T/static"
elapsed "1. torchrun --nproc-per-node=2: one world, bit-identical"

# 2. torchrun's restart: rank 1 killed at step 25 of the first start.
P=$(port)
LOOM_FAULT=rank=1,iteration=25,kind=sigkill timeout -k 5 180 "${TORCHRUN[@]}" --nproc-per-node=2 \
  --master-port=$P --max-restarts=1 --no-python "$GPT" "${JOB[@]}" --save="$T/restart" \
  > restart.log 2>&1 || fail "restart: torchrun exited $?"
grep -q "LOOM_FAULT fires: rank=1 iteration=25 kind=sigkill" restart.log || fail "restart: no fault"
grep -q "start 1 of this job (TORCHELASTIC_RESTART_COUNT=1 here): rank 0 serves" restart.log ||
  fail "restart: the second start did not log torchrun's restart count"
grep -q "^restart 1: resuming from $T/restart/iter_0000020 iteration 20" restart.log ||
  fail "restart: did not resume from the step-20 checkpoint"
same "$T/ref" "$T/restart"
elapsed "2. torchrun --max-restarts=1, rank 1 SIGKILLed: resumed from --save, bit-identical"

# 3. Bad input: refused before any training step, naming what was typed.
refused() {  # refused NAME EXPECTED_TEXT [torchrun args --] gpt args...
  local name="$1" want="$2"; shift 2
  P=$(port)
  if timeout -k 5 60 "${TORCHRUN[@]}" --nproc-per-node=2 --master-port=$P --no-python "$GPT" \
      "${JOB[@]}" "$@" > "$name.log" 2>&1; then
    fail "$name: torchrun exited 0"
  fi
  grep -qF -- "$want" "$name.log" || fail "$name: no '$want' in the log"
  [ "$(grep -c '^ *iteration ' "$name.log")" = 0 ] || fail "$name: trained before refusing"
  echo "  $name: $(grep -F -- "$want" "$name.log" | head -n1 | cut -c1-160)"
}
refused world "--world-size=4 disagrees with WORLD_SIZE=2 from torchrun" --world-size=4
refused nproc "--nproc-per-node=4" --nproc-per-node=4
refused layout "--tensor-model-parallel-size" --tensor-model-parallel-size=4
LOOM_RENDEZVOUS_SECRET="" refused secret "LOOM_RENDEZVOUS_SECRET"
elapsed "3. bad input refused before training"

# 4. Two hosts, one torchrun each, c10d rendezvous at host A.
if reason=$(th_skip_reason); then
  echo "SKIPPED part 4 (two hosts): $reason"
  echo "PASSED: torchrun_test (parts 1-3)"
  exit 0
fi
th_setup
export UCX_TLS=tcp,self  # the wire only: the namespaces share memory
two_hosts() {  # two_hosts NAME LIMIT_S [env...]: sets RC_A, RC_B
  local name="$1" limit="$2"; shift 2
  local id="job-$name-$$" rdzv="$TH_ADDR_A:$(port)"
  local common=(--nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint="$rdzv"
                --rdzv-id="$id" --max-restarts=1 --monitor-interval=0.2)
  # is_host: the namespaces' host names resolve nowhere, so torchrun cannot
  # tell by name which host serves the rendezvous; say it.
  th_start A "$T/$name.a.log" env "$@" "${TORCHRUN[@]}" "${common[@]}" --local-addr="$TH_ADDR_A" \
    --rdzv-conf=is_host=1 --no-python "$GPT" "${JOB[@]}" --network=ethernet --save="$T/$name"
  th_start B "$T/$name.b.log" env "$@" "${TORCHRUN[@]}" "${common[@]}" --local-addr="$TH_ADDR_B" \
    --rdzv-conf=is_host=0 --no-python "$GPT" "${JOB[@]}" --network=ethernet --save="$T/$name"
  th_wait "$TH_PID_A" "$limit"; RC_A=$TH_RC
  th_wait "$TH_PID_B" 60; RC_B=$TH_RC
}
two_hosts c10d 180 LOOM_NOTHING=1
[ "$RC_A" = 0 ] && [ "$RC_B" = 0 ] || fail "c10d: host A exited $RC_A, host B $RC_B"
grep -q "rank 0 serves the job's store at $TH_ADDR_A:" c10d.a.log c10d.b.log ||
  fail "c10d: rank 0 did not serve on host A's address"
grep -q "2 ranks = TP 1 x PP 1 x DP 2" c10d.a.log c10d.b.log || fail "c10d: not one world of 2 ranks"
same "$T/ref" "$T/c10d"
elapsed "4a. two hosts, torchrun --rdzv-backend=c10d: one world over the wire, bit-identical"

two_hosts c10d_restart 240 LOOM_FAULT=rank=1,iteration=25,kind=sigkill
[ "$RC_A" = 0 ] && [ "$RC_B" = 0 ] || fail "c10d_restart: host A exited $RC_A, host B $RC_B"
grep -q "^restart 1: resuming from $T/c10d_restart/iter_0000020 iteration 20" \
  c10d_restart.a.log || fail "c10d_restart: rank 0 did not resume from step 20"
# Host A's agent restarted its healthy worker without counting a failure:
# the start number still comes from the world, not from that count.
grep -q "start 1 of this job (TORCHELASTIC_RESTART_COUNT=0 here)" c10d_restart.a.log ||
  fail "c10d_restart: host A did not log start 1 with its own count 0"
same "$T/ref" "$T/c10d_restart"
elapsed "4b. two hosts, rank 1 on host B SIGKILLed: both torchruns restarted, bit-identical"
echo "PASSED: torchrun_test"
