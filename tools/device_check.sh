#!/usr/bin/env bash
# The GPU check, in two halves:
#
#   tools/device_check.sh pack   here (Bazel machine): builds the GPU binaries,
#                                bundles them with every non-CUDA shared library
#                                they load (glibc's loader included) and a
#                                prepared dataset into .device/bundle.tar.xz.
#   tools/device_check.sh run    on the GPU machine (no Bazel, no Debian
#                                packages): unpacks the bundle and runs kernel
#                                tests, NCCL conformance, the kernel and
#                                training benchmarks and a CPU-vs-GPU loss
#                                curve, then prints a short table last.
#
# With the device tool:  run(command="tools/device_check.sh run",
#                            carry=[".device"], timeout_s=420)
# Logs and the table (summary.md) are written to $OUT (or ./.device/out).
#
# The binaries run through the bundled dynamic loader, so they do not depend
# on the GPU machine's glibc; only the CUDA driver, cuBLAS and NCCL come from
# that machine (LOOM_CUDA_LIBS, default /usr/local/cuda/lib64 and wherever
# ldconfig or a search of /usr and /opt finds them; see run()).
set -uo pipefail

MODE="${1:-}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUNDLE_DIR="$ROOT/.device"

# Everything the GPU check runs: label -> file name in the bundle.
TARGETS=(
  //core/cuda:adamw_test //core/cuda:allocator_test //core/cuda:attention_test
  //core/cuda:convert_test //core/cuda:cross_entropy_test //core/cuda:device_probe_test
  //core/cuda:dropout_test //core/cuda:elementwise_test //core/cuda:embedding_test
  //core/cuda:layernorm_test //core/cuda:matmul_test //core/cuda:ops_registration_test
  //core/cuda:reduce_test //core/cuda:softmax_test //core/cuda:vocab_parallel_ce_test
  //core/cuda:bench
  //comm/nccl:communicator_test
  //train:bench //train:gpt
)

pack() {
  cd "$ROOT"
  local stage="$BUNDLE_DIR/stage"
  rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib" "$stage/glibc" "$stage/data"
  # Loom's own libraries linked in statically: one self-contained file per binary.
  bazel build -c opt --dynamic_mode=off "${TARGETS[@]}" || return 1
  local bin_dir
  bin_dir="$(bazel info -c opt bazel-bin 2>/dev/null)"
  for t in "${TARGETS[@]}"; do
    local pkg="${t#//}"; pkg="${pkg%%:*}"; local name="${t##*:}"
    install -m 755 "$bin_dir/$pkg/$name" "$stage/bin/${pkg//\//_}_$name"
  done
  # Non-CUDA shared libraries (and glibc's loader). The driver, cuBLAS and
  # NCCL must match the GPU machine: they are taken from there.
  for b in "$stage"/bin/*; do
    ldd "$b" | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libcuda.so*|libnvidia*|libcublas*|libcublasLt*|libnccl*) ;;
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
  tar -C "$stage" -cJf "$BUNDLE_DIR/bundle.tar.xz" . || return 1
  rm -rf "$stage"
  echo "packed $(du -h "$BUNDLE_DIR/bundle.tar.xz" | cut -f1) into .device/bundle.tar.xz" \
       "(device tool: carry=[\".device\"])"
}

# ------------------------------------------------------------------ GPU side

run() {
  local out="${OUT:-$BUNDLE_DIR/out}"
  mkdir -p "$out"
  local b
  b="$(mktemp -d)"
  tar -C "$b" -xJf "$BUNDLE_DIR/bundle.tar.xz" || { echo "no bundle: run pack first"; return 1; }
  # The driver (libcuda), cuBLAS and NCCL of the GPU machine: the driver may
  # be a read-only mount (/usr/local/nvidia), cuBLAS and NCCL may come with
  # the toolkit or with Python wheels (nvidia-cublas, nvidia-nccl-cu13).
  local cuda_libs="${LOOM_CUDA_LIBS:-}"
  if [[ -z "$cuda_libs" ]]; then
    local lib dir
    for lib in libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
      dir=""
      for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 \
               /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
        if [[ -e "$d/$lib" ]]; then dir="$d"; break; fi
      done
      [[ -z "$dir" ]] && dir="$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}' | xargs -r dirname)"
      [[ -z "$dir" ]] && dir="$(find /usr /opt -name "$lib" 2>/dev/null | head -1 | xargs -r dirname)"
      if [[ -z "$dir" ]]; then echo "device_check: $lib not found on this machine" >&2; continue; fi
      case ":$cuda_libs:" in *":$dir:"*) ;; *) cuda_libs="${cuda_libs:+$cuda_libs:}$dir" ;; esac
    done
  fi
  echo "CUDA libraries from: $cuda_libs" >"$out/libs.txt"
  # $b/x NAME ARGS...: a bundled binary with the bundled libraries. glibc:
  # the machine's own when it is at least ours (its NCCL may need it), else
  # the bundled loader and glibc.
  local ours theirs
  ours="$(cat "$b/glibc/VERSION")"
  theirs="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
  if [[ -n "$theirs" ]] && [[ "$(printf '%s\n%s\n' "$ours" "$theirs" | sort -V | head -1)" == "$ours" ]]; then
    echo "glibc: the machine's $theirs (bundled $ours not needed)" >>"$out/libs.txt"
    printf '#!/bin/sh\nname="$1"; shift\nLD_LIBRARY_PATH="%s" exec "%s/bin/$name" "$@"\n' \
      "$b/lib:$cuda_libs" "$b" >"$b/x"
  else
    echo "glibc: bundled $ours (the machine has ${theirs:-none})" >>"$out/libs.txt"
    local loader
    loader="$(ls "$b"/glibc/ld-linux-x86-64.so.* | head -1)"
    printf '#!/bin/sh\nname="$1"; shift\nexec "%s" --library-path "%s" "%s/bin/$name" "$@"\n' \
      "$loader" "$b/glibc:$b/lib:$cuda_libs" "$b" >"$b/x"
  fi
  chmod +x "$b/x"
  local summary="$out/summary.md"
  : >"$summary"
  row() { echo "| $1 | $2 |" | tee -a "$summary"; }

  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
  else
    echo "no nvidia-smi on this machine" >"$out/gpu.txt"
  fi
  echo "## Loom device check, $(date -u +%Y-%m-%dT%H:%MZ), $(head -1 "$out/gpu.txt")" | tee -a "$summary"
  echo "| check | result |" | tee -a "$summary"
  echo "|---|---|" | tee -a "$summary"

  # 1. Kernel tests (CUDA vs the CPU kernels) and NCCL conformance.
  local t
  for t in "$b"/bin/*_test; do
    t="$(basename "$t")"
    timeout 90 "$b/x" "$t" >"$out/$t.log" 2>&1  # a hung test must not eat the device time
    local rc=$? passed failed skipped
    passed=$(grep -c '^\[       OK \]' "$out/$t.log")
    failed=$(grep -c '^\[  FAILED  \].*(' "$out/$t.log")
    skipped=$(grep -c '^\[  SKIPPED \].*(' "$out/$t.log")
    row "$t" "rc $rc: $passed passed, $failed failed, $skipped skipped"
  done

  # 2. Kernel benchmark: our bf16 GEMM vs raw cuBLAS, attention vs the GEMM rate.
  timeout 180 "$b/x" core_cuda_bench >"$out/core_cuda_bench.txt" 2>&1
  row "core/cuda bench" "rc $? (table below)"

  # 3. Training benchmark, GPT-2-medium shape.
  timeout 240 "$b/x" train_bench --device=cuda --bf16 --num-layers=24 --hidden-size=1024 \
    --num-attention-heads=16 --seq-length=1024 --micro-batch-size=8 --iters=5 \
    >"$out/train_bench.txt" 2>&1
  row "train bench GPT-2-medium bf16" "rc $? (table below)"

  # 4. The same short run on CPU and on GPU in bf16: loss curves must agree.
  rm -f "$out/cpu.jsonl" "$out/gpu.jsonl"  # metrics files are appended to
  local common=(--distributed-backend=local --nproc-per-node=1 --train-iters=40 --log-interval=1
                --eval-interval=0 --sample-tokens=0 --hidden-dropout=0 --data-cache-dir="$b/data")
  timeout 300 "$b/x" train_gpt "${common[@]}" --metrics-file="$out/cpu.jsonl" >"$out/gpt_cpu.txt" 2>&1
  local rc_cpu=$?
  timeout 300 "$b/x" train_gpt "${common[@]}" --device=cuda --bf16 --metrics-file="$out/gpu.jsonl" \
    >"$out/gpt_gpu.txt" 2>&1
  local rc_gpu=$?
  row "gpt 40 steps cpu f32 vs cuda bf16 (rc $rc_cpu/$rc_gpu)" "$(python3 - "$out/cpu.jsonl" "$out/gpu.jsonl" <<'EOF'
import json, sys
def losses(p):
    try:
        return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
    except Exception as e:
        return []
a, b = losses(sys.argv[1]), losses(sys.argv[2])
if not a or len(a) != len(b):
    print(f"missing curves ({len(a)} vs {len(b)} points)")
else:
    rel = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    # bf16 weights/activations against f32: a few percent per step at most.
    print(f"max relative loss gap {rel:.4f} over {len(a)} steps (bf16 bound 0.03): "
          f"{'OK' if rel <= 0.03 else 'TOO LARGE'}; final {a[-1]:.4f} vs {b[-1]:.4f}")
EOF
)"
  rm -rf "$b"
  {
    echo; echo "### core/cuda bench"; echo '```'; cat "$out/core_cuda_bench.txt"; echo '```'
    echo; echo "### train bench (24 layers, hidden 1024, 16 heads, seq 1024, micro-batch 8, bf16)"
    cat "$out/train_bench.txt"
  } >>"$summary"
  echo; echo "===== summary ($out/summary.md; logs beside it) ====="
  cat "$summary"
  # What failed, in the output itself (not every log file may come back).
  local log
  for log in "$out"/*_test.log "$out"/gpt_*.txt; do
    if grep -q '^\[  FAILED  \]\|error\|Error\|not found' "$log" 2>/dev/null; then
      echo; echo "===== $(basename "$log") (failures) ====="
      grep -B2 -A12 '^\[ RUN\|Failure\|error\|Error\|not found' "$log" | grep -v '^\[       OK' | tail -40
    fi
  done
}

case "$MODE" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: tools/device_check.sh pack|run" >&2; exit 2 ;;
esac
