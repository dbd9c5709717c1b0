#!/usr/bin/env bash
# //train:gpt under a real Slurm (Debian's slurm-wlm + munge), a one-node
# cluster private to this test (tests/slurm_lib.sh):
#   1. srun -N1 -n2 gpt: two ranks found from SLURM_PROCID/SLURM_NTASKS make ONE
#      world (the final checkpoint is bit-identical to gpt --nproc-per-node=2's);
#   2. sbatch docs/slurm/train.sbatch (the documented way to launch): the same;
#   3. scancel --signal=TERM of a running batch job: every rank finishes its
#      step, saves, exits 0; the job ends COMPLETED with ExitCode 0:0; the
#      checkpoint is complete, and a second sbatch resumes from it to the end;
#   4. a rank killed (LOOM_FAULT) inside the batch job: the script starts the
#      step again from the newest checkpoint and the result is bit-identical.
# Skips (exit 0, saying why) without root or without the Slurm binaries.
#   slurm_test.sh GPT PREPROCESS SBATCH_SCRIPT
set -euo pipefail
GPT="$(readlink -f "$1")"; PREPROCESS="$(readlink -f "$2")"; SCRIPT="$(readlink -f "$3")"
source "$(dirname "$0")/slurm_lib.sh"  # beside this script (also in Bazel's runfiles)
source "$(dirname "$0")/checkpoint_lib.sh"  # final, same
source "$(dirname "$0")/corpus_lib.sh"  # tiny_corpus
if reason=$(slurm_skip_reason); then echo "SKIPPED: slurm_test: $reason"; exit 0; fi

T="${TEST_TMPDIR:-$(mktemp -d)}"
cd "$T"
export OMP_NUM_THREADS=1
start=$SECONDS
elapsed() { echo "[$((SECONDS - start)) s] $*"; }
fail() { echo "FAILED: $*"; slurm_logs; exit 1; }
trap slurm_stop EXIT
trap 'exit 143' TERM INT  # Bazel's timeout: still stop the daemons (EXIT)
slurm_start "$T/slurm"
elapsed "cluster up"

tiny_corpus "$PREPROCESS" "$T/corpus"

JOB=(--data-path="$T/corpus" --data-cache-dir="$T/cache" --num-layers=2 --hidden-size=64
     --num-attention-heads=4 --seq-length=32 --micro-batch-size=2 --global-batch-size=4
     --eval-interval=1000 --sample-tokens=0 --comm-timeout-s=60)
ITERS=20

job_field() {  # job_field ID FIELD: JobState, ExitCode, ... from scontrol
  scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n1
}

# The reference: the same job, two ranks started by gpt itself.
timeout -k 5 120 "$GPT" --distributed-backend=ucx --nproc-per-node=2 "${JOB[@]}" \
  --train-iters=$ITERS --log-interval=5 --save="$T/ref" --save-interval=5 > ref.log 2>&1 ||
  { cat ref.log; fail "reference run"; }
elapsed "reference run (gpt --nproc-per-node=2) done"

# 1. srun: each task is one rank (SLURM_PROCID of SLURM_NTASKS). Without the
# job's secret the ranks refuse to meet (exit 2), saying what to set.
port=$(_slurm_free_port)
rc=0
env -u LOOM_RENDEZVOUS_SECRET MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout -k 5 60 \
  srun -N1 -n2 --kill-on-bad-exit=1 "$GPT" --distributed-backend=ucx "${JOB[@]}" \
  --train-iters=$ITERS --save="$T/nosecret" > nosecret.log 2>&1 || rc=$?
cat nosecret.log
[ "$rc" = 2 ] && grep -q LOOM_RENDEZVOUS_SECRET nosecret.log && [ ! -e "$T/nosecret" ] ||
  fail "srun without LOOM_RENDEZVOUS_SECRET: exit $rc"
export LOOM_RENDEZVOUS_SECRET; LOOM_RENDEZVOUS_SECRET=$(openssl rand -hex 32)
port=$(_slurm_free_port)
rc=0
MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout -k 5 180 \
  srun -N1 -n2 --kill-on-bad-exit=1 "$GPT" --distributed-backend=ucx "${JOB[@]}" \
  --train-iters=$ITERS --log-interval=5 --save="$T/srun" --save-interval=5 > srun.log 2>&1 || rc=$?
cat srun.log
[ "$rc" = 0 ] || fail "srun exited $rc"
grep -q "2 ranks = TP 1 x PP 1 x DP 2" srun.log || fail "srun: not one world of 2 ranks"
[ "$(grep -c "iteration *20/ *20" srun.log)" = 1 ] || fail "srun: expected one rank logging step 20"
same "$T/ref" "$T/srun"
elapsed "srun -N1 -n2: ok"

# 2. sbatch of the documented script, waiting for the job.
batch() {  # batch NAME [sbatch option]... -- [gpt flag]...: sbatch docs/slurm/train.sbatch
  local name="$1"; shift
  local opts=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done; shift
  LOOM_GPT="$GPT" LOOM_SAVE="$T/$name" env -u LOOM_RENDEZVOUS_SECRET timeout -k 5 200 sbatch --job-name="$name" --nodes=1 \
    --ntasks-per-node=2 --cpus-per-task=1 --time=10 --output="$T/$name.out" "${opts[@]}" \
    "$SCRIPT" "${JOB[@]}" "$@"
}
gone() {  # gone ID SECONDS: waits until job ID is neither pending nor running
  local i
  for i in $(seq 1 $(($2 * 5))); do
    [ -z "$(squeue -h -j "$1" 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  return 1
}
# batch_wait NAME [sbatch option]... -- [gpt flag]...: batch, then waits for
# the job's end (not sbatch --wait: it polls every 2, 4, ..., 32 s); prints
# JobState and ExitCode.
batch_wait() {
  local id
  id=$(batch "$@") || fail "sbatch $1"
  gone "$id" 180 || fail "job $id ($1) still there after 180 s"
  echo "job $id ($1): JobState=$(job_field "$id" JobState) ExitCode=$(job_field "$id" ExitCode)"
}
out=$(batch_wait batch --parsable -- --train-iters=$ITERS --log-interval=5 --save-interval=5)
cat batch.out; echo "$out"
grep -q "JobState=COMPLETED ExitCode=0:0" <<< "$out" || fail "sbatch: $out"
grep -q "rendezvous at $(hostname -s)" batch.out || fail "the script did not name the rendezvous host"
same "$T/ref" "$T/batch"
elapsed "sbatch docs/slurm/train.sbatch: ok"

# 3. scancel --signal=TERM: save and exit 0, then resume to the end.
id=$(batch term --parsable -- --train-iters=1000000 --log-interval=1 --save-interval=1000000)
echo "submitted job $id (1000000 steps, to be stopped)"
for _ in $(seq 1 300); do
  grep -q "iteration *20/" term.out 2>/dev/null && break
  [ -n "$(squeue -h -j "$id" 2>/dev/null)" ] || { cat term.out; fail "job $id ended on its own"; }
  sleep 0.2
done
grep -q "iteration *20/" term.out || { cat term.out; fail "job $id made no progress in 60 s"; }
scancel --signal=TERM "$id"
elapsed "scancel --signal=TERM $id"
gone "$id" 60 || { tail -20 term.out; fail "job $id still there 60 s after SIGTERM"; }
tail -8 term.out
state=$(job_field "$id" JobState); code=$(job_field "$id" ExitCode)
echo "job $id: JobState=$state ExitCode=$code"
[ "$state" = COMPLETED ] && [ "$code" = 0:0 ] || fail "job $id: JobState=$state ExitCode=$code"
grep -q "restart 1/" term.out && fail "the script restarted the step after SIGTERM"
ckpt=$(final "$T/term")
n=$((10#$(basename "$ckpt" | sed 's/^iter_//')))
[ "$n" -ge 20 ] && [ "$n" -lt 1000000 ] || fail "stopped at iteration $n?"
[ -f "$ckpt/shard_00000_of_00002.bin" ] && [ -f "$ckpt/shard_00001_of_00002.bin" ] ||
  fail "$ckpt lacks a shard"
grep -q "iteration *$((n + 1))/" term.out && fail "trained past the saved iteration $n"
elapsed "stopped at iteration $n, saved, exit 0"
# Submitted again, the same script resumes from it and trains 4 more steps.
out=$(batch_wait term --parsable --output="$T/term2.out" -- --train-iters=$((n + 4)) \
  --log-interval=1 --save-interval=1000000)
cat term2.out; echo "$out"
grep -q "JobState=COMPLETED ExitCode=0:0" <<< "$out" || fail "resumed job: $out"
grep -q "iteration *$((n + 1))/" term2.out || fail "resumed job did not start at $((n + 1))"
grep -q "iteration *[1-9]/" term2.out && fail "resumed job started from scratch"
[ "$(basename "$(final "$T/term")")" = "$(printf 'iter_%07d' $((n + 4)))" ] ||
  fail "resumed job did not save at $((n + 4))"
elapsed "submitted again: resumed at $((n + 1)), saved at $((n + 4))"

# 4. A rank killed inside the batch job: the script starts the step again
# from the newest checkpoint (LOOM_FAULT fires only while LOOM_RESTART_COUNT
# is 0, the first attempt), and the job ends as if nothing happened.
out=$(LOOM_FAULT=rank=1,iteration=12,kind=sigkill batch_wait fault --parsable -- \
  --train-iters=$ITERS --log-interval=5 --save-interval=5)
cat fault.out; echo "$out"
grep -q "JobState=COMPLETED ExitCode=0:0" <<< "$out" || fail "job with a killed rank: $out"
grep -q "restart 1/3" fault.out || fail "the script did not restart the step"
same "$T/ref" "$T/fault"
elapsed "rank 1 killed at step 12: step restarted from iteration 10, bit-identical"
echo "slurm_test: ok in $((SECONDS - start)) s"
