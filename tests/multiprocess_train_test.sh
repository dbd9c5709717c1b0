#!/usr/bin/env bash
# //train:gpt end to end over real processes: each parallel layout, run as
# separate processes on a real backend, must give the single-rank loss
# curve (every step logged to --metrics-file) within 1e-5 relative.
#   multiprocess_train_test.sh GPT PREPROCESS [MPIRUN]
set -euo pipefail
GPT="$(readlink -f "$1")"; PREPROCESS="$(readlink -f "$2")"
MPIRUN="${3:+$(readlink -f "$3")}"
cd "$TEST_TMPDIR"
export OMP_NUM_THREADS=1  # 2 cores, up to 4 ranks

# A small corpus: repeated English-like lines as fortune-style documents.
for i in $(seq 1 300); do
  printf 'the quick brown fox %d jumps over the lazy dog\n%%\n' "$((i % 17))"
done > corpus.txt
"$PREPROCESS" --input=corpus.txt --output-prefix=corpus --tokenizer-type=ByteLevelTokenizer \
  --document-separator=% > /dev/null 2>&1

COMMON=(--data-path=corpus --data-cache-dir="$TEST_TMPDIR" --num-layers=4 --hidden-size=32
        --num-attention-heads=4 --seq-length=16 --micro-batch-size=2 --global-batch-size=8
        --train-iters=8 --log-interval=1 --eval-interval=0 --sample-tokens=0 --peak-flops=1e9
        --hidden-dropout=0.1 --attention-dropout=0.1 --comm-timeout-s=60)

run() {  # run NAME ARGS...: writes NAME.jsonl
  local name="$1"; shift
  if ! timeout -k 5 240 "$@" "${COMMON[@]}" --metrics-file="$name.jsonl" > "$name.log" 2>&1; then
    echo "FAILED: $name"; tail -20 "$name.log"; exit 1
  fi
}

losses() { sed -n 's/.*"loss": \([0-9.]*\).*/\1/p' "$1"; }

compare() {  # compare NAME: against the reference curve
  local ref got
  ref=$(losses reference.jsonl); got=$(losses "$1.jsonl")
  [ "$(echo "$got" | wc -l)" = 8 ] || { echo "$1: expected 8 logged steps"; cat "$1.log"; exit 1; }
  paste <(echo "$ref") <(echo "$got") | awk -v name="$1" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { bad = 1; print name ": step " NR ": " $2 " vs reference " $1 } }
    END { if (bad) exit 1; print name ": " NR " steps match the reference" }'
}

run reference "$GPT" --distributed-backend=local --nproc-per-node=1
run ucx_tp2 "$GPT" --distributed-backend=ucx --nproc-per-node=2 --tensor-model-parallel-size=2 --sequence-parallel
run ucx_pp2 "$GPT" --distributed-backend=ucx --nproc-per-node=2 --pipeline-model-parallel-size=2
run ucx_dp2 "$GPT" --distributed-backend=ucx --nproc-per-node=2 --use-distributed-optimizer
run ucx_tp2_pp2 "$GPT" --distributed-backend=ucx --nproc-per-node=4 --tensor-model-parallel-size=2 \
  --pipeline-model-parallel-size=2 --num-layers-per-virtual-pipeline-stage=1
for name in ucx_tp2 ucx_pp2 ucx_dp2 ucx_tp2_pp2; do compare "$name"; done

if [ -n "$MPIRUN" ]; then
  export TMPDIR="$TEST_TMPDIR" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  run mpi_tp2_dp2 "$MPIRUN" -np 4 --oversubscribe --mca plm_rsh_agent false --mca btl self,vader \
    --mca pml ob1 --mca btl_vader_single_copy_mechanism none \
    --mca btl_vader_backing_directory "$TEST_TMPDIR" --mca mpi_yield_when_idle 1 \
    "$GPT" --distributed-backend=mpi --tensor-model-parallel-size=2
  compare mpi_tp2_dp2
fi
echo "multiprocess_train_test: ok"
