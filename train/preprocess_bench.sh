#!/usr/bin/env bash
# bazel run //train:preprocess_bench -- [--mb=24] [--vocab=32000] [--threads="1 2"]
#
# //train:preprocess_data --workers=N against Hugging Face `tokenizers`
# (PyPI, Rust) encode_batch with N threads (RAYON_NUM_THREADS), the same
# corpus and the same byte-level BPE tokenizer.json, in one run: tokens/s of
# each and their ratio. Both sides time reading the JSON lines and encoding,
# not loading the tokenizer; Loom also writes its .bin/.idx. The corpus is this machine's license texts
# and Python standard library (at least --mb MB); the tokenizer is trained on
# it by `tokenizers`. Token counts must agree, else the bench fails.
#
# The virtual environment is $LOOM_TOKENIZER_VENV (default
# ~/.cache/loom/tokenizer-venv), created with `tokenizers` when missing.
set -euo pipefail
PREPROCESS=bazel-bin/train/preprocess_data
MB=24
VOCAB=32000
THREADS="1 2"
for a in "$@"; do
  case "$a" in
    --preprocess=*) PREPROCESS="${a#--preprocess=}" ;;
    --mb=*) MB="${a#--mb=}" ;;
    --vocab=*) VOCAB="${a#--vocab=}" ;;
    --threads=*) THREADS="${a#--threads=}" ;;
    --venv_sh=*) VENV_SH="${a#--venv_sh=}" ;;
    --py=*) PY="${a#--py=}" ;;
    *) echo "preprocess_bench: unknown argument $a" >&2; exit 2 ;;
  esac
done
PREPROCESS="$(readlink -f "$PREPROCESS")"
VENV="${LOOM_TOKENIZER_VENV:-$HOME/.cache/loom/tokenizer-venv}"
source "$VENV_SH"
ensure_reference_venv "$VENV" "tokenizers" "tokenizers" >&2
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$VENV/bin/python" "$PY" corpus "$WORK/corpus.jsonl" "$MB" > "$WORK/corpus.json"
"$VENV/bin/python" "$PY" train "$WORK/corpus.jsonl" "$WORK/tok" "$VOCAB" 2> /dev/null
echo "# preprocess bench: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
echo "# corpus $(sed 's/.*"mb": \([0-9.]*\).*/\1/' "$WORK/corpus.json") MB (JSON lines), byte-level BPE of $VOCAB tokens, tokenizers $("$VENV/bin/python" -c 'import tokenizers; print(tokenizers.__version__)')"
printf '# %-8s %-22s %-22s %s\n' threads "tokenizers tokens/s" "Loom tokens/s" "Loom / tokenizers"
for n in $THREADS; do
  hf="$(RAYON_NUM_THREADS=$n TOKENIZERS_PARALLELISM=true "$VENV/bin/python" "$PY" encode \
        "$WORK/corpus.jsonl" "$WORK/tok")"
  hf_tokens="$(sed 's/.*"tokens": \([0-9]*\).*/\1/' <<< "$hf")"
  hf_s="$(sed 's/.*"seconds": \([0-9.e-]*\).*/\1/' <<< "$hf")"
  out="$("$PREPROCESS" --input="$WORK/corpus.jsonl" --output-prefix="$WORK/loom$n" \
         --tokenizer-type=HuggingFaceTokenizer --tokenizer-model="$WORK/tok" --workers="$n" 2>&1)"
  loom_tokens="$(sed -n 's/.*documents, \([0-9]*\) tokens.*/\1/p' <<< "$out")"
  loom_s="$(sed -n 's/.* in \([0-9.]*\) s,.*/\1/p' <<< "$out")"
  if [ "$loom_tokens" != "$hf_tokens" ]; then
    echo "preprocess_bench: Loom wrote $loom_tokens tokens, tokenizers $hf_tokens" >&2
    exit 1
  fi
  python3 -c "
hf = $hf_tokens / $hf_s
loom = $loom_tokens / $loom_s
print(f'  {$n:<8} {hf:<22,.0f} {loom:<22,.0f} {loom / hf:.2f}x')"
done
