#!/usr/bin/env bash
# README's data section end to end, as a user runs it (#38): a blend of two
# corpora, packed pretraining (--reset-position-ids --reset-attention-mask
# --eod-mask-loss) and supervised fine-tuning (preprocess_data --sft with a
# Qwen2-style chat template, gpt --sft), each trained and saved, evaluated
# from its checkpoint (--skip-train gives the validation loss the training
# run logged at its last step) and exported to Hugging Face safetensors.
#   data_end_to_end_test.sh GPT PREPROCESS EXPORT HF_TOKENIZER_DIR
set -euo pipefail
GPT="$(readlink -f "$1")"; PREPROCESS="$(readlink -f "$2")"; EXPORT="$(readlink -f "$3")"
HF="$(readlink -f "$4")"
cd "$TEST_TMPDIR"
export OMP_NUM_THREADS=1

python3 - <<'PY'
import json, random
random.seed(1)
words = "the cat sat on a mat and then it ran to see the dog who was in the park".split()
with open("chat.jsonl", "w") as f:
    for i in range(200):
        msgs = [{"role": "user", "content": " ".join(random.choice(words) for _ in range(6))},
                {"role": "assistant", "content": " ".join(random.choice(words) for _ in range(8))}]
        if i % 3 == 0:
            msgs.insert(0, {"role": "system", "content": "be brief"})
        f.write(json.dumps({"messages": msgs}) + "\n")
for name, flip in (("a", False), ("b", True)):
    with open(name + ".txt", "w") as f:
        for i in range(300):
            line = [random.choice(words) for _ in range(30)]
            f.write(" ".join(reversed(line) if flip else line) + "\n%\n")
PY

fail() { echo "FAILED: $*"; exit 1; }
SMALL=(--num-layers=2 --hidden-size=64 --num-attention-heads=4 --seq-length=64 --train-iters=12
       --eval-interval=12 --eval-iters=4 --log-interval=4 --sample-tokens=0 --peak-flops=1e9
       --data-cache-path=cache --nproc-per-node=2)

"$PREPROCESS" --input=a.txt --output-prefix=data/a --tokenizer-type=ByteLevelTokenizer \
  --document-separator=% --append-eod
"$PREPROCESS" --input=b.txt --output-prefix=data/b --tokenizer-type=ByteLevelTokenizer \
  --document-separator=% --append-eod
"$PREPROCESS" --sft --input=chat.jsonl --output-prefix=data/chat \
  --tokenizer-type=HuggingFaceTokenizer --tokenizer-model="$HF" --append-eod > sft_pre.log
grep -q "wrote data/chat.bin/.idx and data/chat_loss_mask.bin/.idx: 200 conversations" sft_pre.log ||
  fail "preprocess --sft: $(cat sft_pre.log)"

# run NAME ARGS...: trains and saves to ckpt_NAME, evaluates from it, exports it.
run() {
  local name="$1"; shift
  timeout -k 5 300 "$GPT" "${SMALL[@]}" "$@" --save="ckpt_$name" > "$name.log" 2>&1 ||
    { tail -20 "$name.log"; fail "$name: training"; }
  local trained evaluated
  trained=$(sed -n 's/.*validation loss at iteration 12: \([0-9.]*\) .*/\1/p' "$name.log")
  [ -n "$trained" ] || { cat "$name.log"; fail "$name: no validation loss"; }
  timeout -k 5 300 "$GPT" "${SMALL[@]}" "$@" --load="ckpt_$name" --skip-train \
    > "${name}_eval.log" 2>&1 || { tail -20 "${name}_eval.log"; fail "$name: evaluation"; }
  evaluated=$(sed -n 's/.*validation loss at iteration 12: \([0-9.]*\) .*--skip-train.*/\1/p' \
    "${name}_eval.log")
  # The trained run prints 4 decimals, --skip-train 6: the same loss.
  awk -v a="$trained" -v b="$evaluated" -v n="$name" 'BEGIN {
    d = a - b; if (d < 0) d = -d
    if (b == "" || d > 6e-5) { print "FAILED: " n ": evaluated " b " vs trained " a; exit 1 }
    print n ": validation loss " a " trained, " b " from the checkpoint" }'
  "$EXPORT" --load="ckpt_$name" --out="hf_$name" > "${name}_export.log" 2>&1 ||
    { cat "${name}_export.log"; fail "$name: export"; }
  [ -s "hf_$name/config.json" ] && [ -s "hf_$name/model.safetensors" ] ||
    fail "$name: export wrote no config.json / model.safetensors"
}

run blend --data-path="0.3 data/a 0.7 data/b"
grep -q "^loom: data: --data-path=0.3 data/a 0.7 data/b: [0-9]* training and [0-9]* validation samples of 64 tokens (blend indices built)" blend.log ||
  { cat blend.log; fail "no blend line"; }
run packed --data-path=data/a --reset-position-ids --reset-attention-mask --eod-mask-loss
run sft --sft --data-path=data/chat --tokenizer-type=HuggingFaceTokenizer --tokenizer-model="$HF" \
  --reset-position-ids --reset-attention-mask
echo "PASSED"
