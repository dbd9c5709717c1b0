#!/usr/bin/env bash
# The GPU check, in two halves (docs/DEVICE_CHECK.md says more):
#
#   tools/device_check.sh pack     here (Bazel machine): builds the GPU binaries
#                                  (every cc_test under //core/cuda/..., the
#                                  benches, //train:gpt), bundles them with every
#                                  non-CUDA shared library they load (glibc's
#                                  loader included), a tokenized dataset and the
#                                  CPU side of the loss-curve check (computed
#                                  here) into .device/bundle.tar.xz.
#   tools/device_check.sh run      on the GPU machine (no Bazel): one prepared
#                                  run of priority-ordered stages, each with its
#                                  own time budget (STAGES below, 420 s in all),
#                                  going on past a failed stage; summary.md,
#                                  summary.json and the logs land in $OUT.
#   tools/device_check.sh dry-run  the `run` logic here, against the packed
#                                  bundle: every GPU stage says "skipped: no GPU"
#                                  (output: $OUT or /tmp/loom-device-dry-run).
#   tools/device_check.sh budgets  the stage table (name, seconds), for tests.
#
# With the device tool:  run(command="tools/device_check.sh run",
#                            carry=[".device"], timeout_s=480)
#
# The binaries run through the bundled libraries (and the bundled glibc where
# the GPU machine's is older); the CUDA driver, cuBLAS, NCCL and cuDNN (loaded
# with dlopen by cudnn-frontend) come from the GPU machine: LOOM_CUDA_LIBS, or
# a search of the usual directories, ldconfig, and Python's site-packages
# (nvidia/*/lib, torch/lib); see find_lib().
set -uo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
ROOT="$(cd "$(dirname "$SELF")/.." && pwd)"
BUNDLE_DIR="$ROOT/.device"
BUNDLE="${LOOM_DEVICE_BUNDLE:-$BUNDLE_DIR/bundle.tar.xz}"

# The stages of `run`, in priority order, NAME:SECONDS. A stage's deadline is
# the sum of the budgets up to and including it, counted from the start: the
# seconds a stage leaves unused go to the stages after it, and the whole run
# ends within TOTAL_BUDGET whatever each stage does.
STAGES=(setup:15 probe:15 kernels:70 sanitizer:55 ab:135 loss:35 pytorch:90 report:5)
TOTAL_BUDGET=420

# Packed besides every cc_test under //core/cuda/... (bazel query at pack
# time); OPTIONAL ones only where `bazel query` finds them.
FIXED_TARGETS=(//core/cuda:bench //core/cuda:attention_bench //comm/nccl:communicator_test
               //train:bench //train:gpt)
OPTIONAL_TARGETS=(//core/cuda/cudnn:attention_bench)
# The loss-curve check: CPU f32 here at pack time, CUDA bf16 on the device.
LOSS_STEPS="${LOOM_LOSS_STEPS:-200}"
LOSS_FLAGS=(--distributed-backend=local --nproc-per-node=1 --log-interval=1 --eval-interval=0
            --sample-tokens=0 --hidden-dropout=0)
# The packed-documents curve (#38): the same job with Megatron's packing flags,
# RoPE and GQA (micro-batch 4: several rows), whose GPU kernels (document
# starts in the attention, RoPE at position ids, per-token loss weights) run
# only with --allow-unproven-gpu-packing until this row and
# core_cuda_packed_attention_test pass on a device.
PACKED_LOSS_STEPS="${LOOM_PACKED_LOSS_STEPS:-60}"
PACKED_LOSS_FLAGS=("${LOSS_FLAGS[@]}" --reset-position-ids --reset-attention-mask --eod-mask-loss
                   --position-embedding-type=rope --group-query-attention --num-query-groups=2
                   --allow-unproven-gpu-packing)
# Kernel tests run before the others (newest first): their rows are the
# proof the next device session is for.
FIRST_TESTS=(core_cuda_packed_attention_test)
# //train:bench shapes.
GPT2M_FLAGS=(--num-layers=24 --hidden-size=1024 --num-attention-heads=16 --seq-length=1024
             --micro-batch-size=8)
LLAMA_FLAGS=(--num-layers=16 --hidden-size=2048 --num-attention-heads=32
             --group-query-attention --num-query-groups=8 --ffn-hidden-size=8192 --swiglu
             --normalization=RMSNorm --position-embedding-type=rope
             --untie-embeddings-and-output-weights --disable-bias-linear --seq-length=4096
             --micro-batch-size=1)
# The flags //train:bench needs for LLAMA_FLAGS (absl spelling); without them
# the Llama shape runs through //train:gpt (same FLOP formula, tokens/s from
# its metrics file).
LLAMA_BENCH_FLAGS=(num_query_groups group_query_attention ffn_hidden_size swiglu normalization
                   position_embedding_type untie_embeddings_and_output_weights
                   disable_bias_linear)
# compute-sanitizer: tool|binary|gtest filter (small shapes, ~1-10 s each).
SANITIZER_RUNS=(
  "memcheck|core_cuda_attention_test|CudaAttentionTest.MatchesCpuWithoutDropout:CudaFlashAttentionTest.MatchesCpuFlashKernel"
  "racecheck|core_cuda_attention_test|CudaFlashAttentionTest.MatchesCpuFlashKernel"
  "memcheck|core_cuda_layernorm_test|CudaLayerNormTest.ForwardAndBackwardMatchCpu"
  "memcheck|core_cuda_cross_entropy_test|CudaCrossEntropyTest.ForwardAndBackwardMatchCpu"
  "memcheck|core_cuda_packed_attention_test|CudaPackedAttentionTest.FlashMatchesCpuAcrossDocumentsAndTiles:CudaPackedAttentionTest.SxsMatchesCpuAcrossDocumentsAndTiles"
  "racecheck|core_cuda_packed_attention_test|CudaPackedAttentionTest.FlashMatchesCpuAcrossDocumentsAndTiles"
)
SANITIZER_CUDNN_FILTER="${LOOM_SANITIZER_CUDNN_FILTER:-*}"

# //core/cuda/cudnn:attention_test -> core_cuda_cudnn_attention_test
bin_name() { local l="${1#//}"; local pkg="${l%%:*}"; echo "${pkg//\//_}_${l##*:}"; }

# ====================================================================== pack

pack_targets() {
  # One query (the Bazel server is shared: each command waits its turn);
  # --keep_going: a package mid-edit elsewhere does not hide the others' tests.
  bazel query --keep_going --output=label_kind 'kind("cc_(test|binary)", //core/cuda/...)' 2>/dev/null |
    awk -v opt=" ${OPTIONAL_TARGETS[*]} " '$1 == "cc_test" || ($1 == "cc_binary" && index(opt, " " $3 " ")) {print $3}'
  printf '%s\n' "${FIXED_TARGETS[@]}"
}

# cpu_reference_curve NAME STEPS WHAT FLAG...: the CPU run a device loss curve
# is compared with, into $stage/ref/NAME_flags, NAME_cpu.jsonl and
# NAME_cpu.log (nothing when STEPS is 0); sets curve_s to its seconds.
cpu_reference_curve() {
  local name="$1" steps="$2" what="$3"
  shift 3
  curve_s=0
  (( steps > 0 )) || return 0
  printf '%s\n' "$@" "--train-iters=$steps" >"$stage/ref/${name}_flags"
  local t0=$SECONDS
  "$stage/bin/train_gpt" "$@" --train-iters="$steps" --data-cache-dir="$stage/data" \
    --metrics-file="$stage/ref/${name}_cpu.jsonl" >"$stage/ref/${name}_cpu.log" 2>&1 ||
    { tail "$stage/ref/${name}_cpu.log"; return 1; }
  curve_s=$((SECONDS - t0))
  echo "pack: CPU $what, $steps steps in $curve_s s"
}

pack() {
  cd "$ROOT" || return 1
  local stage
  stage="$(mktemp -d)"
  # shellcheck disable=SC2064  # expand now: the folder is known
  trap "rm -rf '$stage'" RETURN
  mkdir -p "$stage/bin" "$stage/lib" "$stage/glibc" "$stage/data" "$stage/ref" "$stage/pytorch"
  local targets=() built=() unbuilt=() t
  mapfile -t targets < <(pack_targets | awk 'NF && !seen[$0]++')
  echo "pack: ${#targets[@]} targets: ${targets[*]}"
  # Loom's own libraries linked in statically: one self-contained file per binary.
  # --keep_going and the build event file: one command (the Bazel server is
  # shared), and a target mid-edit elsewhere costs only itself: pack what
  # built, name what did not.
  local bep="$stage/bep.json"
  bazel build -c opt --dynamic_mode=off --keep_going --build_event_json_file="$bep" "${targets[@]}"
  mapfile -t built < <(python3 - "$bep" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    label = e.get("id", {}).get("targetCompleted", {}).get("label")
    if label and e.get("completed", {}).get("success"):
        print(label)
EOF
  )
  rm -f "$bep"
  for t in "${targets[@]}"; do
    [[ " ${built[*]} " == *" $t "* ]] || unbuilt+=("$t")
  done
  if (( ${#unbuilt[@]} )); then
    echo "pack: did not build (not packed): ${unbuilt[*]}" >&2
    case " ${unbuilt[*]} " in *" //train:gpt "*) echo "pack: //train:gpt is needed" >&2; return 1 ;; esac
  fi
  local bin_dir
  bin_dir="$(bazel info -c opt --dynamic_mode=off bazel-bin 2>/dev/null)"
  for t in "${built[@]}"; do
    local pkg="${t#//}"; pkg="${pkg%%:*}"
    install -m 755 "$bin_dir/$pkg/${t##*:}" "$stage/bin/$(bin_name "$t")" || return 1
  done
  # Non-CUDA shared libraries (and glibc's loader). The driver, cuBLAS, NCCL
  # and cuDNN must match the GPU machine: they are taken from there.
  for b in "$stage"/bin/*; do
    ldd "$b" | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libcuda.so*|libnvidia*|libcublas*|libnccl*|libcudnn*|libnvrtc*) ;;
      # glibc apart: used only where the GPU machine's own is older (its
      # libnccl may need a newer glibc than ours; ours runs on a newer one).
      ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*) cp -L "$lib" "$stage/glibc/" ;;
      *) cp -L "$lib" "$stage/lib/" ;;
    esac
  done
  getconf GNU_LIBC_VERSION | awk '{print $2}' >"$stage/glibc/VERSION"
  # The default corpus, tokenized here (the GPU machine has no fortunes).
  "$stage/bin/train_gpt" --distributed-backend=local --nproc-per-node=1 --train-iters=1 \
    --global-batch-size=4 --micro-batch-size=4 --eval-interval=0 --sample-tokens=0 \
    --data-cache-dir="$stage/data" --log-interval=1 >/dev/null || return 1
  # The CPU side of the loss-curve checks, here: the device runs only the GPU side.
  local loss_s packed_s
  cpu_reference_curve loss "$LOSS_STEPS" "loss curve" "${LOSS_FLAGS[@]}" || return 1
  loss_s=$curve_s
  cpu_reference_curve packed_loss "$PACKED_LOSS_STEPS" "packed-documents loss curve" \
    "${PACKED_LOSS_FLAGS[@]}" || return 1
  packed_s=$curve_s
  cp tools/pytorch_reference/gpu_bench.py tools/pytorch_reference/gpt_bench.py "$stage/pytorch/"
  {
    echo "packed: $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' (work tree has changes)')"
    echo "cuda toolkit: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    local h
    for h in /usr/local/cuda/include/cudnn_version.h /usr/include/cudnn_version.h \
             /usr/include/x86_64-linux-gnu/cudnn_version_v9.h; do
      [[ -e "$h" ]] || continue
      echo "cudnn headers: $(awk '/^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) /{printf "%s%s", s, $3; s="."}' "$h") ($h)"
      break
    done
    echo "cpu loss curve: $LOSS_STEPS steps, $loss_s s"
    echo "cpu packed-documents loss curve: $PACKED_LOSS_STEPS steps, $packed_s s"
    echo "packed targets: ${built[*]}"
    echo "not built: ${unbuilt[*]:-none}"
  } >"$stage/BUNDLE_INFO"
  mkdir -p "$BUNDLE_DIR"
  tar -C "$stage" -cf - . | xz -T0 -9 >"$BUNDLE_DIR/bundle.tar.xz.tmp" || return 1
  mv "$BUNDLE_DIR/bundle.tar.xz.tmp" "$BUNDLE_DIR/bundle.tar.xz"
  local size
  size=$(stat -c %s "$BUNDLE_DIR/bundle.tar.xz")
  echo "packed $(du -h "$BUNDLE_DIR/bundle.tar.xz" | cut -f1) into .device/bundle.tar.xz" \
       "(device tool: carry=[\".device\"], timeout_s=480)"
  (( size > 60 * 1024 * 1024 )) && echo "pack: WARNING: over 60 MiB; the device tool carries 64 MiB at most" >&2
  [[ ${#unbuilt[@]} -eq 0 ]]
}

# =================================================== run: helpers (children)

epoch() { printf '%(%s)T' -1; }
now_s() { if [[ -n "${EPOCHREALTIME:-}" ]]; then echo "${EPOCHREALTIME/,/.}"; else date +%s.%N; fi; }
since() { awk -v a="$1" -v b="$(now_s)" 'BEGIN { printf "%.1f", b - a }'; }
left() { echo $(( LOOM_DEADLINE - $(epoch) )); }

# row CHECK STATUS SECONDS RESULT [LOG]: one line of the summary table.
# STATUS: ok | fail | timeout | skip | info.
row() {
  local r="${4//$'\t'/ }"; r="${r//$'\n'/; }"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$LOOM_STAGE" "$1" "$2" "$3" "$r" "${5:-}" >>"$LOOM_OUT/rows.tsv"
  printf '[%s] %s: %s (%s s) %s\n' "$LOOM_STAGE" "$1" "$2" "$3" "$r"
}

# tmo CAP CMD...: CMD under `timeout`, at most CAP seconds and never past the
# stage's deadline. Sets TMO_RAN=0 (and returns 125) when under 3 s are left.
tmo() {
  local cap=$1 l
  shift
  l=$(( $(left) - 1 ))
  (( l > cap )) && l=$cap
  if (( l < 3 )); then TMO_RAN=0; return 125; fi
  TMO_RAN=1
  timeout -k 2 "$l" "$@"
}

# rc_status RC: ok / timeout / fail.
rc_status() { case "$1" in 0) echo ok ;; 124|137) echo timeout ;; *) echo fail ;; esac; }

# The value column of '| NAME | VALUE |' in a //train:bench-style table.
table_value() { sed -n "s#^| $2 | \([^|]*\) |\$#\1#p" "$1" 2>/dev/null | head -1 | xargs; }

bench_result() {  # FILE: tokens/s, model GFLOP/s, model / GEMM of a train bench
  local f=$1
  printf 'tokens/s %s, model GFLOP/s %s, model/GEMM %s, ms/step %s' \
    "$(table_value "$f" 'tokens/s')" "$(table_value "$f" 'model GFLOP/s')" \
    "$(table_value "$f" 'model / GEMM')" "$(sed -n 's/^| ms\/step (median of [0-9]*) | \([^|]*\) |$/\1/p' "$f" | head -1 | xargs)"
}

# ============================================================ run: stages

stage_probe() {
  local t0 f="$LOOM_OUT/logs/probe.txt"
  t0=$(now_s)
  {
    echo "== nvidia-smi"
    if command -v nvidia-smi >/dev/null; then
      timeout 5 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
      timeout 5 nvidia-smi | grep -o 'CUDA Version: [0-9.]*'
    else
      echo "no nvidia-smi"
    fi
  } >"$f" 2>&1
  local gpu
  gpu="$(sed -n 2p "$f")"
  if (( LOOM_HAVE_GPU )); then
    row gpu ok "$(since "$t0")" "$gpu; $(grep -o 'CUDA Version: [0-9.]*' "$f" | head -1)" logs/probe.txt
  else
    row gpu skip "$(since "$t0")" "skipped: no GPU (${gpu:-no nvidia-smi})" logs/probe.txt
  fi
  # Library versions from the libraries themselves (ctypes: no CUDA context).
  t0=$(now_s)
  local py
  py="$(command -v python3 || echo "${LOOM_TORCH_PY:-}")"
  if [[ -n "$py" ]]; then
    tmo 6 "$py" - "$LOOM_B" "${LOOM_LIB_PATHS:-}" >>"$f" 2>&1 <<'EOF'
import ctypes, glob, os, sys
b, paths = sys.argv[1], dict(p.split("=", 1) for p in sys.argv[2].split(";") if "=" in p)
def lib(name):
    p = paths.get(name) or next(iter(sorted(glob.glob(os.path.join(b, "lib", name + "*")))), None)
    return ctypes.CDLL(p) if p else None
found = []
def ver(label, name, fn):
    try:
        l = lib(name)
        v = fn(l) if l else "not found"
        print(f"{label}: {v}" + (f" ({paths.get(name, 'bundled')})" if l else ""))
    except Exception as e:
        v = "error"
        print(f"{label}: error {e}")
    found.append(f"{label} {v}")
def int_out(l, f):
    v = ctypes.c_int(0); getattr(l, f)(ctypes.byref(v)); return v.value
def dotted(v, major_div, minor_div=100):
    return f"{v // major_div}.{v % major_div // minor_div}.{v % minor_div}"
ver("cuda driver API", "libcuda.so.1", lambda l: dotted(int_out(l, "cuDriverGetVersion"), 1000, 10))
ver("cuda runtime", "libcudart.so", lambda l: dotted(int_out(l, "cudaRuntimeGetVersion"), 1000, 10))
def lt(l):
    l.cublasLtGetVersion.restype = ctypes.c_size_t; return dotted(l.cublasLtGetVersion(), 10000)
ver("cublasLt", "libcublasLt.so.13", lt)
def cudnn(l):
    l.cudnnGetVersion.restype = ctypes.c_size_t; return dotted(l.cudnnGetVersion(), 10000)
ver("cudnn", "libcudnn.so.9", cudnn)
ver("nccl", "libnccl.so.2", lambda l: dotted(int_out(l, "ncclGetVersion"), 10000))
print("versions: " + ", ".join(found))
EOF
  fi
  local libs
  libs="$(sed -n 's/^versions: //p' "$f" | tail -1)"
  row libraries "$( [[ "$libs" == *"not found"* || "$libs" == *error* || -z "$libs" ]] && echo info || echo ok)" "$(since "$t0")" \
    "${libs:-no python3 to read versions}; libcudnn from ${LOOM_CUDNN_DIR:-nowhere found}" logs/probe.txt
  # PyTorch's own view (an import: seconds).
  t0=$(now_s)
  if [[ -z "${LOOM_TORCH_PY:-}" ]]; then
    row pytorch "$( (( LOOM_HAVE_GPU )) && echo fail || echo skip)" "$(since "$t0")" "no Python with torch found" logs/probe.txt
    return
  fi
  echo "== pytorch ($LOOM_TORCH_PY)" >>"$f"
  tmo 15 "$LOOM_TORCH_PY" -c 'import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-",
      "gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")' >>"$f" 2>&1
  local rc=$?
  if (( TMO_RAN == 0 )); then row pytorch skip 0 "skipped: stage budget" logs/probe.txt; return; fi
  row pytorch "$(rc_status $rc)" "$(since "$t0")" "$(grep '^torch ' "$f" | tail -1) ($LOOM_TORCH_PY)" logs/probe.txt
}

stage_kernels() {
  # Newest kernels first (cudnn), then //core/cuda, then the rest (NCCL).
  local tests=() t
  mapfile -t tests < <(cd "$LOOM_B/bin" && ls -1 -- *_test 2>/dev/null |
                       awk -v first=" ${FIRST_TESTS[*]} " '{p = index(first, " " $0 " ") ? 0 : /^core_cuda_cudnn_/ ? 1 : /^core_cuda_/ ? 2 : 3; print p "\t" $0}' |
                       sort | cut -f2)
  if (( ${#tests[@]} == 0 )); then row tests fail 0 "no *_test binary in the bundle"; return; fi
  for t in "${tests[@]}"; do
    local log="logs/kernels_$t.log" t0 rc
    t0=$(now_s)
    tmo 40 "$LOOM_B/x" "$t" >"$LOOM_OUT/$log" 2>&1
    rc=$?
    if (( TMO_RAN == 0 )); then row "$t" skip 0 "skipped: stage budget"; continue; fi
    local passed failed skipped st
    passed=$(grep -c '^\[       OK \]' "$LOOM_OUT/$log")
    failed=$(grep -c '^\[  FAILED  \].*(' "$LOOM_OUT/$log")
    skipped=$(grep -c '^\[  SKIPPED \].*(' "$LOOM_OUT/$log")
    st=$(rc_status $rc)
    [[ $st == ok && $failed -gt 0 ]] && st=fail
    [[ $st == ok && $passed -eq 0 && $skipped -gt 0 ]] && st=skip
    row "$t" "$st" "$(since "$t0")" "rc $rc: $passed passed, $failed failed, $skipped skipped" "$log"
  done
}

find_sanitizer() {
  command -v compute-sanitizer 2>/dev/null && return
  local c
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
           /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
    [[ -x "$c" ]] && { echo "$c"; return; }
  done
}

stage_sanitizer() {
  if (( ! LOOM_HAVE_GPU )); then row "memcheck, racecheck" skip 0 "skipped: no GPU"; return; fi
  local cs
  cs="$(find_sanitizer)"
  if [[ -z "$cs" ]]; then row "memcheck, racecheck" skip 0 "skipped: no compute-sanitizer on PATH or under /usr/local/cuda*/bin"; return; fi
  local runs=("${SANITIZER_RUNS[@]}") t
  for t in "$LOOM_B"/bin/core_cuda_cudnn_*_test; do
    [[ -e "$t" ]] && runs+=("memcheck|$(basename "$t")|$SANITIZER_CUDNN_FILTER")
  done
  local r
  for r in "${runs[@]}"; do
    local tool="${r%%|*}" rest="${r#*|}" bin filter
    bin="${rest%%|*}"; filter="${rest#*|}"
    local check="$tool $bin" log="logs/sanitizer_${tool}_$bin.log" t0 rc
    if [[ ! -e "$LOOM_B/bin/$bin" ]]; then row "$check" skip 0 "not in the bundle"; continue; fi
    t0=$(now_s)
    tmo 25 "$cs" --tool "$tool" --target-processes all --error-exitcode 86 --print-limit 20 \
      "$LOOM_B/x" "$bin" --gtest_filter="$filter" >"$LOOM_OUT/$log" 2>&1
    rc=$?
    if (( TMO_RAN == 0 )); then row "$check" skip 0 "skipped: stage budget"; continue; fi
    local summary st
    summary="$(grep -o '\(ERROR\|RACECHECK\) SUMMARY: .*' "$LOOM_OUT/$log" | tail -1)"
    st=$(rc_status $rc)
    [[ $rc == 86 ]] && st=fail
    row "$check" "$st" "$(since "$t0")" "rc $rc: ${summary:-no sanitizer summary}; $(grep -c '^\[       OK \]' "$LOOM_OUT/$log") passed; filter $filter" "$log"
  done
}

# ab_run CHECK CAP FILE CMD...: one A/B benchmark run into logs/FILE.
ab_run() {
  local check=$1 cap=$2 file="logs/$3" t0 rc
  shift 3
  local a prev=""
  for a in "$@"; do  # the bundled binary it runs ("$LOOM_B/x" NAME)
    if [[ $prev == "$LOOM_B/x" && ! -e "$LOOM_B/bin/$a" ]]; then
      row "$check" skip 0 "not in the bundle ($a)"; return
    fi
    prev=$a
  done
  if (( $(left) < 8 )); then row "$check" skip 0 "skipped: stage budget"; return; fi
  t0=$(now_s)
  tmo "$cap" "$@" >"$LOOM_OUT/$file" 2>&1
  rc=$?
  if (( TMO_RAN == 0 )); then row "$check" skip 0 "skipped: stage budget"; return; fi
  local res
  if grep -q '^| tokens/s |' "$LOOM_OUT/$file"; then
    res="$(bench_result "$LOOM_OUT/$file")"
  else
    res="$(grep -v '^\s*$' "$LOOM_OUT/$file" | tail -2 | cut -c1-160 | paste -sd' ' -)"
  fi
  # What the kernel choice says it ran (core/ops/kernel_choice.cc logs
  # 'loom: attention on cuda runs "cudnn": why'): proof that the override took.
  local ran
  ran="$(grep -o 'attention on [a-z]* runs "[^"]*"' "$LOOM_OUT/$file" | head -1)"
  row "$check" "$(rc_status $rc)" "$(since "$t0")" "rc $rc: $res${ran:+ [$ran]}" "$file"
}

# The Llama-style shape needs //train:bench flags it may not have yet.
llama_route() {
  local help f
  help="$(timeout 10 "$LOOM_B/x" train_bench --helpfull 2>&1)"
  for f in "${LLAMA_BENCH_FLAGS[@]}"; do
    grep -q -- "--${f}[ (]" <<<"$help" || { echo "gpt"; return; }
  done
  echo "bench"
}

# Llama-style shape through //train:gpt: its metrics file's tokens/s and model
# TFLOP/s (ModelFlopsPerToken, as //train:bench) written as a bench table.
llama_via_gpt() {  # EXTRA FLAGS...
  local m="$LOOM_OUT/logs/ab_llama_gpt.jsonl"
  rm -f "$m"
  "$LOOM_B/x" train_gpt --distributed-backend=local --nproc-per-node=1 "${LLAMA_FLAGS[@]}" \
    --global-batch-size=1 --eval-interval=0 --sample-tokens=0 --log-interval=1 \
    --data-cache-dir="$LOOM_B/data" --metrics-file="$m" "$@" || return
  python3 - "$m" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
late = rows[2:] or rows  # past the warm-up steps
tps = statistics.median(r["tokens_per_s"] for r in late)
tf = statistics.median(r["model_tflops_per_rank"] for r in late)
print(f"//train:gpt, {len(rows)} steps, medians of steps 3 on (metrics file)")
print("| metric | value |\n|---|---|")
print(f"| ms/step (median of {len(late)}) | {4096 / tps * 1e3:.1f} |")
print(f"| tokens/s | {tps:.0f} |")
print(f"| model GFLOP/s | {tf * 1e3:.1f} |")
EOF
}

stage_ab() {
  local route
  route="$(llama_route)"
  if (( ! LOOM_HAVE_GPU )); then
    row "core_cuda_bench, attention benches, train_bench GPT-2-medium x {default, cudnn, flash, sxs, reference}, Llama-1B" \
      skip 0 "skipped: no GPU (Llama shape via $( [[ $route == bench ]] && echo //train:bench || echo '//train:gpt: //train:bench lacks its flags'))"
    # The Llama flag set, checked here on the CPU at a toy width (flags, data at seq 4096).
    local t0 rc
    t0=$(now_s)
    if [[ $route == bench ]]; then
      tmo 60 "$LOOM_B/x" train_bench "${LLAMA_FLAGS[@]}" --num-layers=1 --hidden-size=64 \
        --num-attention-heads=4 --num-query-groups=2 --ffn-hidden-size=128 --iters=1 \
        --kernel_breakdown=0 >"$LOOM_OUT/logs/ab_llama_cpu_check.txt" 2>&1
    else
      tmo 60 "$BASH" "$SELF" __call llama_via_gpt --num-layers=1 --hidden-size=64 --num-attention-heads=4 \
        --num-query-groups=2 --ffn-hidden-size=128 --train-iters=1 \
        >"$LOOM_OUT/logs/ab_llama_cpu_check.txt" 2>&1
    fi
    rc=$?
    local res
    if grep -q '^| tokens/s |' "$LOOM_OUT/logs/ab_llama_cpu_check.txt"; then
      res="$(bench_result "$LOOM_OUT/logs/ab_llama_cpu_check.txt")"
    else
      res="$(tail -1 "$LOOM_OUT/logs/ab_llama_cpu_check.txt" | cut -c1-160)"
    fi
    row "Llama flags on the CPU (toy width, seq 4096)" "$(rc_status $rc)" "$(since "$t0")" \
      "rc $rc via $route: $res" logs/ab_llama_cpu_check.txt
    return
  fi
  local unset_impl=(env -u LOOM_KERNEL_IMPL -u LOOM_REFERENCE_KERNELS)
  local tb=("$LOOM_B/x" train_bench --device=cuda --bf16 "${GPT2M_FLAGS[@]}" --iters=5)
  # In priority order; each run capped, the later ones skipped when the stage runs short.
  ab_run "core_cuda_bench (GEMM vs cuBLAS, attention)" 25 ab_core_cuda_bench.txt \
    "${unset_impl[@]}" "$LOOM_B/x" core_cuda_bench
  if [[ -e "$LOOM_B/bin/core_cuda_cudnn_attention_bench" ]]; then
    ab_run "core_cuda_cudnn_attention_bench" 25 ab_core_cuda_cudnn_attention_bench.txt \
      "${unset_impl[@]}" "$LOOM_B/x" core_cuda_cudnn_attention_bench
  else
    row "core_cuda_cudnn_attention_bench" skip 0 "not packed (//core/cuda/cudnn:attention_bench absent at pack time)"
  fi
  ab_run "train_bench GPT-2-medium bf16, attention default" 25 ab_train_gpt2m_default.txt \
    "${unset_impl[@]}" "${tb[@]}"
  if [[ $route == bench ]]; then
    ab_run "train_bench Llama-1B bf16 (GQA 32/8, RoPE, RMSNorm, SwiGLU, seq 4096), default" 60 \
      ab_train_llama_default.txt "${unset_impl[@]}" "$LOOM_B/x" train_bench --device=cuda --bf16 \
      "${LLAMA_FLAGS[@]}" --iters=3
  else
    ab_run "train_gpt Llama-1B bf16 (GQA 32/8, RoPE, RMSNorm, SwiGLU, seq 4096), default; //train:bench lacks the flags" \
      60 ab_train_llama_default.txt "${unset_impl[@]}" "$BASH" "$SELF" __call llama_via_gpt --device=cuda --bf16 --train-iters=6
  fi
  local impl
  for impl in cudnn flash sxs; do
    ab_run "train_bench GPT-2-medium bf16, LOOM_KERNEL_IMPL=attention=$impl" 20 \
      "ab_train_gpt2m_$impl.txt" "${unset_impl[@]}" LOOM_KERNEL_IMPL="attention=$impl" "${tb[@]}"
  done
  ab_run "train_bench GPT-2-medium bf16, LOOM_REFERENCE_KERNELS=1" 25 ab_train_gpt2m_reference.txt \
    "${unset_impl[@]}" LOOM_REFERENCE_KERNELS=1 "${tb[@]:0:${#tb[@]}-1}" --iters=2
  ab_run "core_cuda_attention_bench (s x s vs flash, dropout 0.1)" 20 ab_core_cuda_attention_bench.txt \
    "${unset_impl[@]}" "$LOOM_B/x" core_cuda_attention_bench
}

# One curve: loss_curve PREFIX LABEL: the bundle's ref/PREFIX_flags and
# ref/PREFIX_cpu.jsonl (pack), the GPU run's logs/PREFIX_gpu.{jsonl,txt}.
loss_curve() {
  local prefix=$1 label=$2 ref="$LOOM_B/ref" t0
  t0=$(now_s)
  if [[ ! -s "$ref/${prefix}_cpu.jsonl" ]]; then
    if [[ $prefix == loss ]]; then
      row "loss curve" fail 0 "no CPU curve in the bundle (pack with LOOM_LOSS_STEPS > 0)"
    else
      row "$label" skip 0 "skipped: no CPU curve in the bundle (pack with LOOM_PACKED_LOSS_STEPS > 0)"
    fi
    return
  fi
  local flags=()
  mapfile -t flags <"$ref/${prefix}_flags"
  local steps
  steps=$(grep -c '"loss"' "$ref/${prefix}_cpu.jsonl")
  if (( ! LOOM_HAVE_GPU )); then
    row "$label cpu f32 (pack) vs cuda bf16" skip "$(since "$t0")" \
      "skipped: no GPU; the CPU curve from pack has $steps steps (final $(tail -1 "$ref/${prefix}_cpu.jsonl" | sed -n 's/.*"loss": \([0-9.]*\).*/\1/p'))"
    return
  fi
  local m="$LOOM_OUT/logs/${prefix}_gpu.jsonl" rc
  rm -f "$m"
  tmo 600 "$LOOM_B/x" train_gpt "${flags[@]}" --data-cache-dir="$LOOM_B/data" --device=cuda --bf16 \
    --metrics-file="$m" >"$LOOM_OUT/logs/${prefix}_gpu.txt" 2>&1
  rc=$?
  if (( TMO_RAN == 0 )); then row "$label $steps steps cpu f32 (pack) vs cuda bf16" skip 0 "skipped: stage budget"; return; fi
  cp "$ref/${prefix}_cpu.jsonl" "$LOOM_OUT/logs/${prefix}_cpu.jsonl"
  local verdict
  verdict="$(python3 - "$ref/${prefix}_cpu.jsonl" "$m" <<'EOF'
import json, sys
def losses(p):
    try:
        return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
    except Exception:
        return []
a, b = losses(sys.argv[1]), losses(sys.argv[2])
if not a or len(a) != len(b):
    print(f"fail missing curves ({len(a)} CPU vs {len(b)} GPU points)")
    sys.exit()
rel = [abs(x - y) / abs(x) for x, y in zip(a, b)]
early = max(rel[:40])
tail_a, tail_b = sum(a[-10:]) / len(a[-10:]), sum(b[-10:]) / len(b[-10:])
tail = abs(tail_a - tail_b) / abs(tail_a)
# bf16 against f32: a few percent per step early on; later the runs may drift
# apart step by step, so the end is judged on the mean of the last 10 steps.
ok = early <= 0.03 and tail <= 0.05
print(f"{'ok' if ok else 'fail'} {len(a)} steps: max relative gap over steps 1-{min(40, len(a))} "
      f"{early:.4f} (bound 0.03), over all {max(rel):.4f}; mean of the last 10 "
      f"{tail_a:.4f} vs {tail_b:.4f} (relative {tail:.4f}, bound 0.05)")
EOF
)"
  local st="${verdict%% *}"
  (( rc != 0 )) && st=$(rc_status $rc)
  row "$label $steps steps cpu f32 (pack) vs cuda bf16" "$st" "$(since "$t0")" "rc $rc: ${verdict#* }" "logs/${prefix}_gpu.txt"
}

stage_loss() {
  loss_curve loss gpt
  loss_curve packed_loss "gpt packed documents (RoPE, GQA)"
}

stage_pytorch() {
  local script="$ROOT/tools/pytorch_reference/gpu_bench.py"
  [[ -e "$script" ]] || script="$LOOM_B/pytorch/gpu_bench.py"
  local t0
  t0=$(now_s)
  if (( ! LOOM_HAVE_GPU )); then
    local parse
    parse="$(python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read()); print("parses")' "$script" 2>&1 | tail -1)"
    row "SDPA microbench, GPT-2-medium and Llama-1B steps" skip "$(since "$t0")" \
      "skipped: no GPU ($(basename "$script") $parse; torch: ${LOOM_TORCH_PY:-none found})"
    return
  fi
  if [[ -z "${LOOM_TORCH_PY:-}" ]]; then row "PyTorch reference" fail 0 "no Python with torch found"; return; fi
  local l rc
  l=$(( $(left) - 2 ))
  tmo "$l" "$LOOM_TORCH_PY" "$script" --budget=$(( l - 6 )) --json="$LOOM_OUT/pytorch.json" \
    >"$LOOM_OUT/logs/pytorch.txt" 2>&1
  rc=$?
  if (( TMO_RAN == 0 )); then row "PyTorch reference" skip 0 "skipped: stage budget"; return; fi
  if [[ ! -s "$LOOM_OUT/pytorch.json" ]]; then
    row "PyTorch reference" "$(rc_status $rc)" "$(since "$t0")" "rc $rc, no results: $(tail -1 "$LOOM_OUT/logs/pytorch.txt" | cut -c1-200)" logs/pytorch.txt
    return
  fi
  # One row per result (the JSON file holds everything).
  python3 - "$LOOM_OUT/pytorch.json" "$rc" "$(since "$t0")" <<'EOF' | while IFS=$'\t' read -r c s r; do row "$c" "$s" "" "$r" logs/pytorch.txt; done
import json, sys
d, rc, secs = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
print(f"PyTorch {d.get('torch')}\t{'ok' if rc == 0 else 'fail'}\trc {rc} in {secs} s; GEMM {d.get('gemm_tflops', 0):.1f} TFLOP/s (bf16 {d.get('gemm_n')}^3)")
sd = d.get("sdpa", [])
if sd:
    best = {}
    for r in sd:
        if r["pass"] == "fwd+bwd":
            best.setdefault(r["backend"], []).append(r["tflops"])
    print("SDPA microbench\tok\t" + f"{len(sd)} rows; fwd+bwd TFLOP/s " + ", ".join(
        f"{k} {min(v):.0f}-{max(v):.0f}" for k, v in best.items()))
for r in d.get("train", []):
    print(f"{r['name']} {r['mode']}\tok\ttokens/s {r['tokens_per_s']:.0f}, model TFLOP/s "
          f"{r['model_tflops']:.1f}, model/GEMM {r['model_over_gemm']:.2f}, ms/step {r['ms']:.1f} "
          f"(warm-up {r['warmup_s']:.0f} s)")
for s in d.get("skipped", []):
    if not s["what"].startswith("sdpa"):
        print(f"{s['what']}\tskip\tskipped: {s['why']}")
n = sum(s["what"].startswith("sdpa") for s in d.get("skipped", []))
if n:
    print(f"SDPA cases not run\tinfo\t{n} (unsupported by a backend or out of time; logs/pytorch.txt)")
EOF
}

# ============================================================ run: the parent

# find_lib NAME: the directory holding NAME on this machine, or nothing.
find_lib() {
  local lib=$1 d
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 \
           /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/lib64 \
           "${PY_LIB_DIRS[@]}"; do
    [[ -e "$d/$lib" ]] && { echo "$d"; return; }
  done
  d="$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')"
  [[ -n "$d" ]] && { dirname "$d"; return; }
  [[ $lib == libnvrtc* ]] && return  # optional: not worth a search of the disk
  d="$(timeout 3 find /usr /opt -name "$lib" 2>/dev/null | head -1)"
  [[ -n "$d" ]] && dirname "$d"
}

# Pythons of this machine, the first with torch; their site-packages' NVIDIA
# library folders (nvidia-cudnn-cu13 & co., torch/lib) into PY_LIB_DIRS.
find_pythons() {
  PY_LIB_DIRS=()
  LOOM_TORCH_PY=""
  local c seen=" " p
  for c in ${LOOM_PYTHON:-} python3 python /opt/conda/bin/python /usr/local/bin/python3 /usr/bin/python3; do
    p="$(command -v "$c" 2>/dev/null)" || continue
    p="$(readlink -f "$p")"
    [[ "$seen" == *" $p "* ]] && continue
    seen+="$p "
    local out
    out="$(timeout 5 "$p" -c 'import importlib.util, site, sys
dirs = [d for d in sys.path if d.endswith(("site-packages", "dist-packages"))]
try:
    dirs += site.getsitepackages()
except Exception:
    pass
print("torch" if importlib.util.find_spec("torch") else "-")
for d in dict.fromkeys(dirs):
    print(d)' 2>/dev/null)" || continue
    [[ -z "$LOOM_TORCH_PY" && "$(head -1 <<<"$out")" == torch ]] && LOOM_TORCH_PY="$p"
    local sp
    while read -r sp; do
      local l
      for l in "$sp"/nvidia/*/lib "$sp"/torch/lib; do [[ -d "$l" ]] && PY_LIB_DIRS+=("$l"); done
    done < <(tail -n +2 <<<"$out")
  done
}

run() {
  local dry=${1:-0}
  local out
  if (( dry )); then out="${OUT:-/tmp/loom-device-dry-run}"; else out="${OUT:-$BUNDLE_DIR/out}"; fi
  mkdir -p "$out"
  rm -rf "$out/logs" "$out/rows.tsv" "$out/stages.tsv" "$out/summary.md" "$out/summary.json" "$out/pytorch.json"
  mkdir -p "$out/logs"
  local t_start
  t_start=$(epoch)
  local deadlines=() names=() budgets=() acc=0 s
  for s in "${STAGES[@]}"; do
    names+=("${s%%:*}"); budgets+=("${s##*:}"); acc=$((acc + ${s##*:})); deadlines+=($((t_start + acc)))
  done
  export LOOM_OUT="$out" LOOM_DRY="$dry"

  # ---- setup (here, not a child: the unpacked bundle and the wrapper persist)
  export LOOM_STAGE=setup LOOM_DEADLINE=${deadlines[0]}
  local t0 b
  t0=$(now_s)
  b="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$b'" EXIT
  if ! timeout $(( $(left) > 2 ? $(left) : 2 )) tar -C "$b" -xJf "$BUNDLE"; then
    row bundle fail "$(since "$t0")" "cannot unpack $BUNDLE: run tools/device_check.sh pack first"
    printf 'setup\t%s\t%s\t1\n' "${budgets[0]}" "$(( $(epoch) - t_start ))" >>"$out/stages.tsv"
    report "$t_start"
    return 1
  fi
  export LOOM_B="$b"
  find_pythons
  export LOOM_TORCH_PY
  local cuda_libs="${LOOM_CUDA_LIBS:-}" lib dir lib_paths="" missing=()
  local libs=(libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcudnn.so.9 libnvrtc.so.13)
  for lib in "${libs[@]}"; do
    if [[ -n "${LOOM_CUDA_LIBS:-}" ]]; then
      dir=""
      local d
      IFS=: read -ra _dirs <<<"$LOOM_CUDA_LIBS"
      for d in "${_dirs[@]}"; do [[ -e "$d/$lib" ]] && { dir=$d; break; }; done
    else
      dir="$(find_lib "$lib")"
    fi
    if [[ -z "$dir" ]]; then missing+=("$lib"); continue; fi
    [[ $lib == libcudnn.so.9 ]] && export LOOM_CUDNN_DIR="$dir"
    lib_paths+="$lib=$dir/$lib;"
    case ":$cuda_libs:" in *":$dir:"*) ;; *) cuda_libs="${cuda_libs:+$cuda_libs:}$dir" ;; esac
  done
  export LOOM_LIB_PATHS="$lib_paths"
  # $b/x NAME ARGS...: a bundled binary with the bundled libraries. glibc:
  # the machine's own when it is at least ours (its NCCL may need it), else
  # the bundled loader and glibc. libcudnn.so.9 is dlopen'ed: its folder is on
  # the library path too.
  local ours theirs glibc_note
  ours="$(cat "$b/glibc/VERSION" 2>/dev/null || echo 0)"
  theirs="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
  printf '#!/bin/sh\nname="$1"; shift\n' >"$b/x"
  # Loom's cuDNN loader tries LOOM_CUDNN_LIBRARY first (core/cuda/cudnn/loader.cc).
  [[ -n "${LOOM_CUDNN_DIR:-}" ]] &&
    printf '[ -n "$LOOM_CUDNN_LIBRARY" ] || export LOOM_CUDNN_LIBRARY="%s"\n' "$LOOM_CUDNN_DIR/libcudnn.so.9" >>"$b/x"
  if [[ -n "$theirs" ]] && [[ "$(printf '%s\n%s\n' "$ours" "$theirs" | sort -V | head -1)" == "$ours" ]]; then
    glibc_note="the machine's $theirs"
    printf 'LD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s/bin/$name" "$@"\n' \
      "$b/lib:$cuda_libs" "$b" >>"$b/x"
  else
    glibc_note="bundled $ours (the machine has ${theirs:-none})"
    local loader
    loader="$(ls "$b"/glibc/ld-linux-x86-64.so.* | head -1)"
    printf 'exec "%s" --library-path "%s" "%s/bin/$name" "$@"\n' \
      "$loader" "$b/glibc:$b/lib:$cuda_libs" "$b" >>"$b/x"
  fi
  chmod +x "$b/x"
  {
    echo "CUDA libraries from: $cuda_libs"
    echo "found: ${lib_paths//;/ }"
    echo "missing: ${missing[*]:-none}"
    echo "glibc: $glibc_note"
    echo "python with torch: ${LOOM_TORCH_PY:-none}"
    echo "python library folders searched: ${PY_LIB_DIRS[*]:-none}"
    echo; cat "$b/BUNDLE_INFO" 2>/dev/null
    echo; echo "the wrapper every binary runs through (\$b/x):"; cat "$b/x"
  } >"$out/logs/setup.txt"
  local have_gpu=0
  if (( ! dry )) && command -v nvidia-smi >/dev/null && timeout 10 nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    have_gpu=1
  fi
  export LOOM_HAVE_GPU=$have_gpu
  local not_built
  not_built="$(sed -n 's/^not built: //p' "$b/BUNDLE_INFO" 2>/dev/null)"
  local setup_status=ok
  [[ " ${missing[*]} " == *" libcudnn.so.9 "* || " ${missing[*]} " == *" libcublas.so.13 "* ]] && (( have_gpu )) && setup_status=fail
  [[ -n "$not_built" && "$not_built" != none ]] && setup_status=fail
  row bundle "$setup_status" "$(since "$t0")" \
    "$(ls "$b/bin" | wc -l) binaries ($(sed -n 's/^commit: //p' "$b/BUNDLE_INFO" 2>/dev/null)); not built at pack: ${not_built:-?}; glibc: $glibc_note; libraries missing: ${missing[*]:-none}; libcudnn.so.9 from ${LOOM_CUDNN_DIR:-nowhere}" \
    logs/setup.txt
  printf 'setup\t%s\t%s\t0\n' "${budgets[0]}" "$(( $(epoch) - t_start ))" >>"$out/stages.tsv"

  # ---- the stages, each a child under its own deadline
  local i
  for ((i = 1; i < ${#names[@]}; i++)); do
    local name=${names[$i]}
    [[ $name == report ]] && continue
    export LOOM_STAGE=$name LOOM_DEADLINE=${deadlines[$i]}
    local st0 l rc
    st0=$(epoch)
    l=$(left)
    if (( l < 3 )); then
      row "$name" skip 0 "skipped: no time left"
      printf '%s\t%s\t0\tskipped\n' "$name" "${budgets[$i]}" >>"$out/stages.tsv"
      continue
    fi
    echo "== stage $name: up to $l s (budget ${budgets[$i]} s)"
    timeout -k 3 "$l" "$BASH" "$SELF" __stage "$name" >"$out/logs/stage_$name.log" 2>&1
    rc=$?
    grep "^\[$name\]" "$out/logs/stage_$name.log"
    if (( rc == 124 || rc == 137 )); then
      row "$name" timeout "$(( $(epoch) - st0 ))" "stage killed at its deadline ($l s); the rows above are what it finished"
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "${budgets[$i]}" "$(( $(epoch) - st0 ))" "$rc" >>"$out/stages.tsv"
  done
  export LOOM_STAGE=report LOOM_DEADLINE=${deadlines[-1]}
  report "$t_start"
}

# report T_START: summary.md and summary.json from rows.tsv and stages.tsv,
# the ratios (same run, same card), the per-kernel table if any; prints the
# summary and the failures' excerpts last.
report() {
  local out="$LOOM_OUT"
  python3 - "$out" "$1" "$(epoch)" "$TOTAL_BUDGET" "${LOOM_DRY:-0}" "${STAGES[*]}" <<'EOF'
import csv, json, os, re, sys
out, t_start, t_end, total, dry, stages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6].split()
budget = {s.split(":")[0]: int(s.split(":")[1]) for s in stages}
def read(p, n):
    try:
        with open(os.path.join(out, p)) as f:
            return [(l.rstrip("\n").split("\t") + [""] * n)[:n] for l in f if l.strip()]
    except FileNotFoundError:
        return []
rows = read("rows.tsv", 6)
used = {r[0]: (int(r[2]) if r[2].isdigit() else 0, r[3]) for r in read("stages.tsv", 4)}
def text(p):
    try:
        return open(os.path.join(out, p), errors="replace").read()
    except FileNotFoundError:
        return ""
gpu = "no GPU (dry run)" if dry else (text("logs/probe.txt").splitlines()[1:2] or ["?"])[0]
rank = {"fail": 4, "timeout": 3, "ok": 2, "info": 1, "skip": 0}
stage_list = []
for name in budget:
    if name == "report":
        continue
    mine = [r for r in rows if r[0] == name]
    status = max((r[2] for r in mine), key=lambda s: rank.get(s, 0), default="skip")
    u, rc = used.get(name, (0, ""))
    stage_list.append({"name": name, "budget_s": budget[name], "used_s": u, "rc": rc,
                       "status": status,
                       "checks": [{"check": r[1], "status": r[2], "seconds": r[3], "result": r[4],
                                   "log": r[5]} for r in mine]})

# ---- ratios: Loom / PyTorch, same run, same card
def val(p, key):
    m = re.search(r"^\| " + re.escape(key) + r" \| ([0-9.]+)", text(p), re.M)
    return float(m.group(1)) if m else None
pt = {}
try:
    pt = json.load(open(os.path.join(out, "pytorch.json")))
except Exception:
    pass
ptrain = {(r["name"], r["mode"]): r for r in pt.get("train", [])}
ratios = []
def ratio(what, num, den, unit):
    if num and den:
        ratios.append({"what": what, "loom": num, "reference": den, "ratio": num / den, "unit": unit})
for shape, f in (("gpt2-medium", "logs/ab_train_gpt2m_default.txt"), ("llama-1b", "logs/ab_train_llama_default.txt")):
    loom = val(f, "tokens/s")
    for mode in ("eager", "torch.compile"):
        r = ptrain.get((shape, mode))
        ratio(f"{shape} step: Loom (default kernels) / PyTorch {mode}", loom, r and r["tokens_per_s"], "tokens/s")
base = val("logs/ab_train_gpt2m_default.txt", "tokens/s")
for impl in ("cudnn", "flash", "sxs", "reference"):
    ratio(f"gpt2-medium step: {impl} / default", val(f"logs/ab_train_gpt2m_{impl}.txt", "tokens/s"), base, "tokens/s")
# Attention rows (case, ms, TFLOP/s, ratio) of Loom's benches against SDPA's
# at the same pass, s, b, h, d.
key_re = re.compile(r"(fwd\+bwd|fwd)\b.*?s=(\d+).*?b=(\d+).*?h=([\d/]+).*?d=(\d+)")
sdpa = {}
for r in pt.get("sdpa", []):
    m = key_re.search(r["name"])
    if m:
        sdpa.setdefault((m.groups()), {})[r["backend"]] = r["tflops"]
for f in ("logs/ab_core_cuda_bench.txt", "logs/ab_core_cuda_cudnn_attention_bench.txt"):
    for line in text(f).splitlines():
        m = key_re.search(line)
        nums = re.findall(r"\s(\d+\.\d+)", line)
        if not m or "attention" not in line or len(nums) < 2:
            continue
        for backend, tf in sdpa.get(m.groups(), {}).items():
            ratio(f"{line.split('  ')[0].strip()} ({os.path.basename(f)[3:-4]}) / SDPA[{backend}]",
                  float(nums[1]), tf, "TFLOP/s")

# ---- per-kernel table of the CUDA training bench
bench = text("logs/ab_train_gpt2m_default.txt")
kt = None
m = re.search(r"^Kernel by kernel", bench, re.M)
if m:  # the bench prints it last: to the end, at most 80 lines
    kt = "\n".join(bench[m.start():].strip().splitlines()[:80])

elapsed = t_end - t_start
summary = {"date_utc": os.popen("date -u +%Y-%m-%dT%H:%MZ").read().strip(), "dry_run": dry,
           "gpu": gpu, "budget_s": total, "elapsed_s": elapsed, "stages": stage_list,
           "ratios": ratios, "kernel_table": kt, "bundle": text("logs/setup.txt")}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)

def cell(x):
    return str(x).replace("|", "\\|")
md = [f"## Loom device check, {summary['date_utc']}, {gpu}{' (DRY RUN: the logic only)' if dry else ''}",
      f"{elapsed} s of the {total} s budget. Stage rows in bold: status, seconds used / budget "
      "(unused seconds pass to the next stage).", "",
      "| stage | check | result | seconds |", "|---|---|---|---|"]
for s in stage_list:
    md.append(f"| **{s['name']}** | | **{s['status']}** | **{s['used_s']} / {s['budget_s']}** |")
    for c in s["checks"]:
        md.append(f"| {s['name']} | {cell(c['check'])} | {c['status']}: {cell(c['result'])} | {c['seconds']} |")
md += ["", "### Ratios (same run, same card; > 1: Loom faster)"]
if ratios:
    md += ["| what | Loom | reference | ratio |", "|---|---|---|---|"]
    md += [f"| {r['what']} | {r['loom']:.1f} {r['unit']} | {r['reference']:.1f} | {r['ratio']:.2f} |" for r in ratios]
else:
    md.append("none: the benches on one or both sides did not run")
md += ["", "### Per-kernel GPU time (//train:bench, GPT-2-medium, default kernels)"]
md.append(kt if kt else "absent: //train:bench printed no per-kernel table for CUDA in this run "
          "(its kernel-by-kernel table is CPU-only unless a CUDA kernel timer prints one)")
for title, f in (("core/cuda bench", "logs/ab_core_cuda_bench.txt"),
                 ("cudnn attention bench", "logs/ab_core_cuda_cudnn_attention_bench.txt"),
                 ("train bench GPT-2-medium (24 layers, hidden 1024, 16 heads, seq 1024, micro-batch 8, bf16)",
                  "logs/ab_train_gpt2m_default.txt"),
                 ("train bench Llama-1B", "logs/ab_train_llama_default.txt"),
                 ("PyTorch reference", "logs/pytorch.txt")):
    t = text(f).strip()
    if t:
        md += ["", f"### {title}", "```", "\n".join(t.splitlines()[-60:]), "```"]
open(os.path.join(out, "summary.md"), "w").write("\n".join(md) + "\n")
EOF
  echo; echo "===== summary ($out/summary.md, summary.json; logs in $out/logs) ====="
  cat "$out/summary.md"
  # What failed, in the output itself (not every log file may come back):
  # the logs of the failed and timed-out rows, 20 lines each, 6 logs at most,
  # then one line per stage, so the output's tail always says how it went.
  local n=0 log
  while IFS=$'\t' read -r _ check status _ _ log; do
    [[ ($status == fail || $status == timeout) && -n "$log" && -f "$out/$log" ]] || continue
    if (( ++n > 6 )); then echo; echo "(more failures: summary.json)"; break; fi
    echo; echo "===== $check: $status ($log) ====="
    grep -B2 -A8 '^\[  FAILED  \]\|Failure\|[Ee]rror\|ERROR\|Invalid\|Race\|hazard\|Abort\|Segmentation\|not found\|Traceback' \
      "$out/$log" | grep -v '^\[       OK\|^\[  SKIPPED' | tail -20
  done <"$out/rows.tsv"
  echo
  echo "stages: $(python3 -c 'import json, sys
s = json.load(open(sys.argv[1]))
print(", ".join("%s %s %s/%s s" % (x["name"], x["status"], x["used_s"], x["budget_s"]) for x in s["stages"]))' "$out/summary.json" 2>/dev/null)"
}

case "${1:-}" in
  pack) pack ;;
  run) run 0 ;;
  dry-run) run 1 ;;
  budgets)
    for s in "${STAGES[@]}"; do echo "${s%%:*} ${s##*:}"; done
    echo "total_budget $TOTAL_BUDGET" ;;
  __stage)  # internal: one stage, as a child of run (its own timeout)
    "stage_$2" ;;
  __call)  # internal: a function under `timeout`
    shift; "$@" ;;
  *) echo "usage: tools/device_check.sh pack|run|dry-run|budgets" >&2; exit 2 ;;
esac
