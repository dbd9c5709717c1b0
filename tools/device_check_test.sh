#!/usr/bin/env bash
# tools/device_check.sh without a GPU and without Bazel-built binaries:
#  1. it parses (bash -n) and refuses an unknown mode (exit 2);
#  2. its stage table: the stages in priority order, whole-second budgets,
#     the probe within 15 s, the sanitizers within 60 s, all within 420 s,
#     and a stage_NAME function for every stage the run starts as a child;
#  3. `dry-run` on a fake bundle (shell scripts that print what the gtest and
#     bench binaries print): summary.json has every stage, a passing, a
#     skipping and a failing test each with its own status, the GPU stages
#     "skipped: no GPU", the Llama flag check run, and the summary printed
#     last with the failing test's excerpt.
set -uo pipefail
script="$TEST_SRCDIR/$TEST_WORKSPACE/tools/device_check.sh"
cd "$TEST_TMPDIR"
fail() { echo "FAIL: $*"; [ -f run.txt ] && { echo "--- run.txt"; tail -60 run.txt; }; exit 1; }

# 1.
bash -n "$script" || fail "bash -n"
bash "$script" no-such-mode >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown mode must exit 2"

# 2.
bash "$script" budgets >budgets.txt || fail "budgets mode"
python3 - budgets.txt "$script" <<'EOF' || fail "stage table"
import re, sys
lines = [l.split() for l in open(sys.argv[1]) if l.strip()]
total = int(dict(lines)["total_budget"])
stages = [(n, v) for n, v in lines if n != "total_budget"]
names = [n for n, _ in stages]
errors = []
for n, v in stages:
    if not v.isdigit() or int(v) <= 0:
        errors.append(f"stage {n}: budget {v!r} is not a positive number of seconds")
budget = {n: int(v) for n, v in stages if v.isdigit()}
want = ["setup", "probe", "kernels", "sanitizer", "ab", "loss", "pytorch", "report"]
if names != want:
    errors.append(f"stages {names}, want {want} (priority order)")
if total > 420:
    errors.append(f"total budget {total} > 420 s")
if sum(budget.values()) > total:
    errors.append(f"budgets add up to {sum(budget.values())} s > the total {total} s")
if budget.get("probe", 99) > 15:
    errors.append(f"probe {budget.get('probe')} s > 15 s")
if budget.get("sanitizer", 99) > 60:
    errors.append(f"sanitizer {budget.get('sanitizer')} s > 60 s")
src = open(sys.argv[2]).read()
for n in names:
    if n not in ("setup", "report") and not re.search(rf"^stage_{n}\(\) \{{", src, re.M):
        errors.append(f"no stage_{n}() for stage {n}")
print("\n".join(errors) or f"{len(names)} stages, {sum(budget.values())} s of {total} s")
sys.exit(1 if errors else 0)
EOF

# 3. A fake bundle.
rm -rf fake out
mkdir -p fake/bin fake/lib fake/glibc fake/data fake/ref fake/pytorch
echo "2.0" >fake/glibc/VERSION  # older than any glibc: the machine's own is used
printf 'packed: test\ncommit: test\nnot built: none\n' >fake/BUNDLE_INFO
gtest() {  # NAME LINES... : a fake gtest binary
  local name=$1 rc=$2; shift 2
  { echo '#!/bin/sh'; for l in "$@"; do printf 'echo "%s"\n' "$l"; done; echo "exit $rc"; } >"fake/bin/$name"
  chmod +x "fake/bin/$name"
}
gtest core_cuda_good_test 0 "[ RUN      ] A.B" "[       OK ] A.B (1 ms)" "[  PASSED  ] 1 test."
gtest core_cuda_gpu_only_test 0 "[ RUN      ] A.C" "[  SKIPPED ] A.C (0 ms)"
gtest core_cuda_broken_test 1 "[ RUN      ] A.D" "x_test.cc:3: Failure" "[  FAILED  ] A.D (0 ms)"
gtest core_cuda_attention_test 0 "[ RUN      ] F.G" "[       OK ] F.G (2 ms)"
cat >fake/bin/train_bench <<'EOF'
#!/bin/sh
for a in "$@"; do [ "$a" = --helpfull ] && { echo "    --num_layers (Layers); default: 12;"; exit 1; }; done
case "${LOOM_KERNEL_IMPL:-}" in *cudnn) t=120000 ;; *) t=100000 ;; esac
echo "loom: attention on cuda runs \"${LOOM_KERNEL_IMPL#attention=}\": forced" >&2
printf '| metric | value |\n|---|---|\n| ms/step (median of 5) | 80.0 |\n| tokens/s | %s |\n| model GFLOP/s | 1.0 |\n' $t
EOF
printf '#!/bin/sh\necho "attention fwd+bwd s=2048 b=4 h=16 d=64 bf16 causal   2.0000   60.13   0.088"\n' >fake/bin/core_cuda_bench
cat >fake/bin/train_gpt <<'EOF'
#!/bin/sh
for a in "$@"; do case "$a" in --metrics-file=*) m="${a#--metrics-file=}" ;; esac; done
[ -n "${m:-}" ] && for i in 1 2 3; do
  echo "{\"iteration\": $i, \"loss\": 10.$i, \"tokens_per_s\": 1000.0, \"model_tflops_per_rank\": 0.5}" >>"$m"
done
echo "fake train_gpt $*"
EOF
chmod +x fake/bin/*
printf '%s\n' --train-iters=3 >fake/ref/loss_flags
for i in 1 2 3; do echo "{\"iteration\": $i, \"loss\": 10.$i}" >>fake/ref/loss_cpu.jsonl; done
tar -C fake -cJf bundle.tar.xz . || fail "tar"

start=$SECONDS
LOOM_DEVICE_BUNDLE="$PWD/bundle.tar.xz" OUT="$PWD/out" LOOM_CUDA_LIBS=/nonexistent \
  bash "$script" dry-run >run.txt 2>&1 || fail "dry-run exited $?"
took=$((SECONDS - start))
[ -s out/summary.md ] || fail "no summary.md"
python3 - out/summary.json <<'EOF' || fail "summary.json"
import json, sys
s = json.load(open(sys.argv[1]))
errors = []
st = {x["name"]: x for x in s["stages"]}
if list(st) != ["setup", "probe", "kernels", "sanitizer", "ab", "loss", "pytorch"]:
    errors.append(f"stages {list(st)}")
checks = {c["check"]: c for x in s["stages"] for c in x["checks"]}
for name, want in (("core_cuda_good_test", "ok"), ("core_cuda_gpu_only_test", "skip"),
                   ("core_cuda_broken_test", "fail")):
    got = checks.get(name, {}).get("status")
    if got != want:
        errors.append(f"{name}: {got}, want {want}")
if st.get("kernels", {}).get("status") != "fail":
    errors.append("the kernels stage must fail with a failing test")
for name in ("sanitizer", "ab", "loss", "pytorch"):
    gpu_rows = [c for c in st.get(name, {}).get("checks", []) if "no GPU" in c["result"]]
    if not gpu_rows or any(c["status"] != "skip" for c in gpu_rows):
        errors.append(f"stage {name}: no 'skipped: no GPU' row")
llama = [c for c in checks.values() if c["check"].startswith("Llama flags")]
if not llama or llama[0]["status"] != "ok" or "via gpt" not in llama[0]["result"] \
        or "tokens/s 1000," not in llama[0]["result"]:
    errors.append(f"Llama flag check: {llama}")
if "3 steps" not in str(st.get("loss")):
    errors.append("the loss stage does not count the packed CPU curve")
if s["elapsed_s"] > s["budget_s"]:
    errors.append(f"took {s['elapsed_s']} s > {s['budget_s']} s")
if not s["dry_run"]:
    errors.append("dry_run is false")
print("\n".join(errors) or "summary.json ok")
sys.exit(1 if errors else 0)
EOF
grep -q '===== summary' run.txt || fail "the summary is not printed"
# The summary, then the failures' excerpts (the broken test's, not the
# skipping one's), then one line per stage, last.
sed -n '/===== summary/,$p' run.txt >tail.txt
grep -q '===== core_cuda_broken_test: fail' tail.txt || fail "no excerpt of the failing test"
grep -q 'x_test.cc:3: Failure' tail.txt || fail "the excerpt lacks the failure"
grep -q '===== core_cuda_gpu_only_test' tail.txt && fail "an excerpt of a test that only skipped"
tail -1 run.txt | grep -q '^stages: setup ok .*, kernels fail .*, pytorch skip' || fail "the last line is not the stage line"
grep -q '| stage | check | result | seconds |' out/summary.md || fail "summary.md has no table"
(( took < 60 )) || fail "dry-run took $took s"

# 4. The GPU branch on the same fake bundle: a fake nvidia-smi and
# compute-sanitizer on PATH; the rows, the same-run ratios, the loss check.
mkdir -p fakepath
printf '#!/bin/sh\ncase "$1" in -L) echo "GPU 0: Fake GPU (UUID: x)" ;; --query-gpu=*) echo "Fake GPU, 1.0, 1 MiB, 9.0" ;; esac\n' >fakepath/nvidia-smi
printf '#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift 2; done\n"$@"\necho "========= ERROR SUMMARY: 0 errors"\n' >fakepath/compute-sanitizer
chmod +x fakepath/*
PATH="$PWD/fakepath:$PATH" LOOM_DEVICE_BUNDLE="$PWD/bundle.tar.xz" OUT="$PWD/gpu" LOOM_CUDA_LIBS=/nonexistent \
  bash "$script" run >run.txt 2>&1 || fail "run with a fake GPU exited $?"
python3 - gpu/summary.json <<'EOF' || fail "summary.json of the fake-GPU run"
import json, sys
s = json.load(open(sys.argv[1]))
errors = []
rows = {(x["name"], c["check"]): c for x in s["stages"] for c in x["checks"]}
def want(stage, check, status, text=""):
    c = rows.get((stage, check))
    if not c or c["status"] != status or text not in c["result"]:
        errors.append(f"{stage} / {check}: {c}, want {status} with {text!r}")
want("probe", "gpu", "ok", "Fake GPU")
want("sanitizer", "memcheck core_cuda_attention_test", "ok", "ERROR SUMMARY: 0 errors; 1 passed")
want("sanitizer", "racecheck core_cuda_attention_test", "ok", "filter CudaFlashAttentionTest")
want("sanitizer", "memcheck core_cuda_layernorm_test", "skip", "not in the bundle")
want("ab", "train_bench GPT-2-medium bf16, attention default", "ok", "tokens/s 100000,")
want("ab", "train_bench GPT-2-medium bf16, LOOM_KERNEL_IMPL=attention=cudnn", "ok", "tokens/s 120000,")
want("ab", "train_bench GPT-2-medium bf16, LOOM_KERNEL_IMPL=attention=flash", "ok", '[attention on cuda runs "flash"]')
want("ab", "core_cuda_cudnn_attention_bench", "skip", "not packed")
want("ab", "core_cuda_attention_bench (s x s vs flash, dropout 0.1)", "skip", "not in the bundle")
want("loss", "gpt 3 steps cpu f32 (pack) vs cuda bf16", "ok", "max relative gap over steps 1-3 0.0000")
r = [x for x in s["ratios"] if x["what"] == "gpt2-medium step: cudnn / default"]
if not r or abs(r[0]["ratio"] - 1.2) > 1e-9:
    errors.append(f"ratio cudnn / default: {r}")
if s["dry_run"]:
    errors.append("dry_run is true")
print("\n".join(errors) or "fake-GPU summary.json ok")
sys.exit(1 if errors else 0)
EOF
echo "PASS (dry-run on a fake bundle in $took s; the GPU branch with a fake GPU)"
