#!/usr/bin/env bash
# //train:gpt end to end over real processes: each parallel layout (context
# parallelism included), run as
# separate processes on a real backend, must give the single-rank loss
# curve (every step logged to --metrics-file) within 1e-5 relative (GPT-2,
# and a Llama-style model).
#   multiprocess_train_test.sh GPT PREPROCESS [MPIRUN]
set -euo pipefail
GPT="$(readlink -f "$1")"; PREPROCESS="$(readlink -f "$2")"
MPIRUN="${3:+$(readlink -f "$3")}"
source "$(dirname "$0")/corpus_lib.sh"  # beside this script (also in Bazel's runfiles)
cd "$TEST_TMPDIR"
export OMP_NUM_THREADS=1  # 2 cores, up to 4 ranks

tiny_corpus "$PREPROCESS" corpus

# Before any rank starts, the launcher refuses what cannot work, naming the
# flags as typed (exit 2, no rank started, nothing trained).
refused() {  # refused PATTERN CMD...: exits 2 at once, says PATTERN, starts no rank
  local pattern="$1"; shift
  local out rc=0
  out=$(timeout -k 5 60 "$@" 2>&1) || rc=$?
  echo "$out"
  [ "$rc" = 2 ] || { echo "FAILED: expected exit 2 from: $*"; exit 1; }
  echo "$out" | grep -q -- "$pattern" || { echo "FAILED: no '$pattern' from: $*"; exit 1; }
  if echo "$out" | grep -q "stopped the other ranks\|^loom:"; then
    echo "FAILED: ranks were started by: $*"; exit 1
  fi
}
refused "--distributed-backend='carrier-pigeon'" "$GPT" --distributed-backend=carrier-pigeon
refused "mpirun -np 2 .*--distributed-backend=mpi" "$GPT" --nproc-per-node=2 --distributed-backend=mpi
refused "world size (2 ranks) is not divisible by --tensor-model-parallel-size (3)" \
  "$GPT" --train-iters=5 --tensor-model-parallel-size=3
refused "--seq-length (18) is not divisible by 2 x --context-parallel-size" \
  "$GPT" --train-iters=5 --context-parallel-size=2 --seq-length=18
refused "--nproc-per-node=2 .*RANK=1, WORLD_SIZE=2" env RANK=1 WORLD_SIZE=2 "$GPT" --nproc-per-node=2
refused "RANK=1 is set but WORLD_SIZE is not" env RANK=1 "$GPT"
refused "--pipeline-schedule=dualpipev needs at least 2 x --pipeline-model-parallel-size = 4" \
  "$GPT" --pipeline-model-parallel-size=2 --pipeline-schedule=dualpipev
refused "--num-distributed-optimizer-instances (3) does not divide the data-parallel size (4" \
  "$GPT" --nproc-per-node=4 --micro-batch-size=2 --use-distributed-optimizer \
  --num-distributed-optimizer-instances=3
refused "--data-parallel-sharding-strategy=zero3: Illegal value 'zero3'" \
  "$GPT" --data-parallel-sharding-strategy=zero3
# torchrun's variables and no master: this process is rank 1 and waits for
# rank 0 (here up to 3 s), never starting ranks of its own. Ranks started
# without our launcher bring the job's secret (LOOM_RENDEZVOUS_SECRET).
out=$(RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_PORT=$((20000 + RANDOM % 20000)) \
  LOOM_RENDEZVOUS_SECRET=multiprocess-train-test \
  timeout -k 5 60 "$GPT" --comm-timeout-s=3 2>&1) && { echo "FAILED: rank 1 alone exited 0"; exit 1; }
echo "$out"
echo "$out" | grep -q "could not connect" || { echo "FAILED: no rendezvous error: $out"; exit 1; }
if echo "$out" | grep -q "stopped the other ranks\|^loom:"; then echo "FAILED: $out"; exit 1; fi

# A --data-cache-dir that does not exist yet (nested, a quote and a space in
# its name) is created by the first run.
CACHE="$TEST_TMPDIR/x y'z/new/dir"
COMMON=(--data-path=corpus --data-cache-dir="$CACHE" --num-layers=4 --hidden-size=32
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

compare() {  # compare NAME [REF]: against REF's curve (default: the single-rank reference)
  local ref got
  ref=$(losses "${2:-reference}.jsonl"); got=$(losses "$1.jsonl")
  [ "$(echo "$got" | wc -l)" = 8 ] || { echo "$1: expected 8 logged steps"; cat "$1.log"; exit 1; }
  paste <(echo "$ref") <(echo "$got") | awk -v name="$1" -v ref="${2:-reference}" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { bad = 1; print name ": step " NR ": " $2 " vs " ref " " $1 } }
    END { if (bad) exit 1; print name ": " NR " steps match " ref }'
}

run reference "$GPT" --distributed-backend=local --nproc-per-node=1
run ucx_tp2 "$GPT" --distributed-backend=ucx --nproc-per-node=2 --tensor-model-parallel-size=2 --sequence-parallel
run ucx_pp2 "$GPT" --distributed-backend=ucx --nproc-per-node=2 --pipeline-model-parallel-size=2
run ucx_dp2 "$GPT" --distributed-backend=ucx --nproc-per-node=2 --use-distributed-optimizer
run ucx_tp2_pp2 "$GPT" --distributed-backend=ucx --nproc-per-node=4 --tensor-model-parallel-size=2 \
  --pipeline-model-parallel-size=2 --num-layers-per-virtual-pipeline-stage=1
# Data-parallel overlap: gradient buckets (a few layers each) reduced while
# the backward runs, ZeRO-1 reduce-scatters, and the parameter all-gathers
# overlapped with the next forward. Each equals its non-overlapped run.
BUCKET=(--ddp-bucket-size=30000)
run ucx_dp2_overlap "$GPT" --distributed-backend=ucx --nproc-per-node=2 --use-distributed-optimizer \
  --overlap-grad-reduce --overlap-param-gather "${BUCKET[@]}"
run ucx_pp2_dp2 "$GPT" --distributed-backend=ucx --nproc-per-node=4 --pipeline-model-parallel-size=2 \
  "${BUCKET[@]}"
run ucx_pp2_dp2_overlap "$GPT" --distributed-backend=ucx --nproc-per-node=4 \
  --pipeline-model-parallel-size=2 --overlap-grad-reduce "${BUCKET[@]}"
# Context parallelism: the sequence in zig-zag chunks over processes, K/V
# passed around the ring over UCX; with TP + SP inside each CP rank.
run ucx_cp2 "$GPT" --distributed-backend=ucx --nproc-per-node=2 --context-parallel-size=2
run ucx_cp2_tp2 "$GPT" --distributed-backend=ucx --nproc-per-node=4 --context-parallel-size=2 \
  --tensor-model-parallel-size=2 --sequence-parallel
# Zero bubble (ZB-H1: the weight gradients deferred into the bubble): PP x DP
# with the bucket reductions started as the deferred weight gradients land,
# and TP + SP x PP with full recomputation.
run ucx_pp2_dp2_zbh1 "$GPT" --distributed-backend=ucx --nproc-per-node=4 \
  --pipeline-model-parallel-size=2 --pipeline-schedule=zb-h1 --overlap-grad-reduce "${BUCKET[@]}"
run ucx_tp2_pp2_zbh1 "$GPT" --distributed-backend=ucx --nproc-per-node=4 \
  --tensor-model-parallel-size=2 --sequence-parallel --pipeline-model-parallel-size=2 \
  --pipeline-schedule=zb-h1 --recompute-granularity=full --recompute-method=uniform \
  --recompute-num-layers=1
# The V (zbv, dualpipev: stage 0 holds the first and the last layers): its
# sends must not wait for their receives, so each (sender, receiver, kind)
# link is its own communicator.
run ucx_pp2_dualpipev "$GPT" --distributed-backend=ucx --nproc-per-node=2 \
  --pipeline-model-parallel-size=2 --pipeline-schedule=dualpipev
run ucx_tp2_pp2_zbv "$GPT" --distributed-backend=ucx --nproc-per-node=4 \
  --tensor-model-parallel-size=2 --sequence-parallel --pipeline-model-parallel-size=2 \
  --pipeline-schedule=zbv
for name in ucx_tp2 ucx_pp2 ucx_dp2 ucx_tp2_pp2 ucx_pp2_dp2 ucx_cp2 ucx_cp2_tp2 ucx_pp2_dp2_zbh1 \
    ucx_tp2_pp2_zbh1 ucx_pp2_dualpipev ucx_tp2_pp2_zbv; do
  compare "$name"
done
compare ucx_dp2_overlap ucx_dp2
compare ucx_pp2_dp2_overlap ucx_pp2_dp2
compare ucx_pp2_dp2_zbh1 ucx_pp2_dp2_overlap
ls "$CACHE"/*.gptidx > /dev/null || { echo "FAILED: no sample index cache in $CACHE"; exit 1; }

# Llama-style (RMSNorm, RoPE, SwiGLU, 2 query groups, untied output layer, no
# biases): TP + SP splitting the groups, and PP (no tied-embedding sum) x DP
# with ZeRO-1, each against its own single-rank curve.
LLAMA=(--normalization=RMSNorm --norm-epsilon=1e-6 --position-embedding-type=rope --swiglu
       --group-query-attention --num-query-groups=2 --untie-embeddings-and-output-weights
       --disable-bias-linear)
run llama_reference "$GPT" --distributed-backend=local --nproc-per-node=1 "${LLAMA[@]}"
run llama_ucx_tp2 "$GPT" --distributed-backend=ucx --nproc-per-node=2 --tensor-model-parallel-size=2 \
  --sequence-parallel "${LLAMA[@]}"
run llama_ucx_pp2_dp2 "$GPT" --distributed-backend=ucx --nproc-per-node=4 \
  --pipeline-model-parallel-size=2 --use-distributed-optimizer "${LLAMA[@]}"
# CP x DP with ZeRO-1 over the 4 ranks (RoPE phases follow the chunks).
run llama_ucx_cp2_dp2 "$GPT" --distributed-backend=ucx --nproc-per-node=4 \
  --context-parallel-size=2 --use-distributed-optimizer "${LLAMA[@]}"
compare llama_ucx_tp2 llama_reference
compare llama_ucx_pp2_dp2 llama_reference
compare llama_ucx_cp2_dp2 llama_reference
# ZeRO-2 (--data-parallel-sharding-strategy=optim_grads) across processes:
# every micro-batch's buckets reduce-scattered over UCX behind the backward,
# only the owned gradient shard kept; GPT-2 (tied embedding) at DP 2, and
# Llama-style PP 2 x DP 2.
run ucx_dp2_zero2 "$GPT" --distributed-backend=ucx --nproc-per-node=2 \
  --data-parallel-sharding-strategy=optim_grads --overlap-grad-reduce "${BUCKET[@]}"
run llama_ucx_pp2_dp2_zero2 "$GPT" --distributed-backend=ucx --nproc-per-node=4 \
  --pipeline-model-parallel-size=2 --data-parallel-sharding-strategy=optim_grads \
  --overlap-grad-reduce "${LLAMA[@]}"
compare ucx_dp2_zero2
compare llama_ucx_pp2_dp2_zero2 llama_reference

# Mixtral-style (8 experts, top-2, load-balancing loss): EP 2 x TP 2 on 4
# processes, tokens moved to their experts by UCX all-to-all-v, against the
# single-process curve.
MIXTRAL=("${LLAMA[@]}" --num-experts=8 --moe-router-topk=2 --moe-aux-loss-coeff=0.01)
run mixtral_reference "$GPT" --distributed-backend=local --nproc-per-node=1 "${MIXTRAL[@]}"
run mixtral_ucx_ep2_tp2 "$GPT" --distributed-backend=ucx --nproc-per-node=4 \
  --tensor-model-parallel-size=2 --expert-model-parallel-size=2 "${MIXTRAL[@]}"
compare mixtral_ucx_ep2_tp2 mixtral_reference
grep -q "expert parallel: each MoE layer's 8 experts split over EP 2" mixtral_ucx_ep2_tp2.log ||
  { echo "FAILED: no expert-parallel line"; cat mixtral_ucx_ep2_tp2.log; exit 1; }
# The overlaps (#39): the MoE all-to-alls pipelined over 2 token chunks and
# the TP all-gathers/reduce-scatters as a ring, over UCX.
run mixtral_ucx_ep2_tp2_overlap "$GPT" --distributed-backend=ucx --nproc-per-node=4 \
  --tensor-model-parallel-size=2 --sequence-parallel --tp-comm-overlap \
  --expert-model-parallel-size=2 --moe-a2a-overlap-chunks=2 "${MIXTRAL[@]}"
compare mixtral_ucx_ep2_tp2_overlap mixtral_reference
# ZeRO-3 (#37): parameters sharded at rest, each unit all-gathered before its
# forward and backward (the next one prefetched), over UCX.
run ucx_dp2_zero3 "$GPT" --distributed-backend=ucx --nproc-per-node=2 \
  --data-parallel-sharding-strategy=optim_grads_params --overlap-grad-reduce \
  --overlap-param-gather "${BUCKET[@]}"
compare ucx_dp2_zero3
# ZeRO-3 under zb-h1's split backward: buckets bound until the deferred Ws ran.
run ucx_pp2_dp2_zbh1_zero3 "$GPT" --distributed-backend=ucx --nproc-per-node=4 \
  --pipeline-model-parallel-size=2 --pipeline-schedule=zb-h1 \
  --data-parallel-sharding-strategy=optim_grads_params --overlap-grad-reduce \
  --overlap-param-gather "${BUCKET[@]}"
compare ucx_pp2_dp2_zbh1_zero3
# Hybrid sharding (#37): DP 4 as 2 instances of 2 consecutive ranks, ZeRO-3
# within each, each bucket's shard all-reduced across the instances once reduced within.
run ucx_dp4_zero3_hybrid "$GPT" --distributed-backend=ucx --nproc-per-node=4 \
  --data-parallel-sharding-strategy=optim_grads_params --num-distributed-optimizer-instances=2 \
  --overlap-grad-reduce --overlap-param-gather "${BUCKET[@]}"
compare ucx_dp4_zero3_hybrid
grep -q "hybrid sharding (--num-distributed-optimizer-instances 2): the 4 data-parallel ranks in 2 instances" \
  ucx_dp4_zero3_hybrid.log || { echo "FAILED: no hybrid sharding line"; cat ucx_dp4_zero3_hybrid.log; exit 1; }

if [ -n "$MPIRUN" ]; then
  export TMPDIR="$TEST_TMPDIR" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  run mpi_tp2_dp2 "$MPIRUN" -np 4 --oversubscribe --mca plm_rsh_agent false --mca btl self,vader \
    --mca pml ob1 --mca btl_vader_single_copy_mechanism none \
    --mca btl_vader_backing_directory "$TEST_TMPDIR" --mca mpi_yield_when_idle 1 \
    "$GPT" --distributed-backend=mpi --tensor-model-parallel-size=2
  compare mpi_tp2_dp2
fi
echo "multiprocess_train_test: ok"
