#!/usr/bin/env bash
# //train:preprocess_data with --tokenizer-type HuggingFaceTokenizer and
# SentencePieceTokenizer (--tokenizer-model): the ids written equal those of
# Hugging Face tokenizers / sentencepiece (computed with
# tools/tokenizer_reference's venv for these two documents), and bad flags
# fail naming the flag or the file.
set -euo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
bin="$root/train/preprocess_data"
data="$root/train/data/testdata/tokenizers"
cd "$TEST_TMPDIR"
cat > docs.jsonl <<'JSONL'
{"text": "Hello world! I'm 42."}
{"text": "Caf\u00e9 <|endoftext|> na\u00efve\n"}
JSONL

# run NAME EXPECTED_IDS FLAGS...: preprocess, then compare the .bin (uint16 ids).
run() {
  local name="$1" expected="$2"
  shift 2
  "$bin" --input=docs.jsonl --output-prefix="$name" --append-eod "$@" > "$name.out" 2> "$name.err" ||
    { echo "$name: preprocess_data failed"; cat "$name.err"; exit 1; }
  local got
  got="$(od -An -tu2 -v "$name.bin" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')"
  if [ "$got" != "$expected" ]; then
    echo "$name: ids differ"; echo "  expected: $expected"; echo "  got:      $got"; exit 1
  fi
  grep -q "2 documents" "$name.out" || { cat "$name.out"; exit 1; }
  echo "$name: ids match"
}

run hf "41 70 302 80 400 418 2 409 8 78 222 21 19 15 0 36 66 71 129 104 222 0 296 66 129 109 337 200 0" \
  --tokenizer-type=HuggingFaceTokenizer --tokenizer-model="$data/gpt2_style"
grep -q "(vocab 600)" hf.out || { cat hf.out; exit 1; }
# Llama 3 style: <|begin_of_text|> (500) from the template, eos <|end_of_text|> (501)
# from tokenizer_config.json.
run llama3 "500 39 68 300 78 397 415 0 405 6 76 220 19 17 13 501 500 34 64 69 127 102 220 27 91 272 67 78 69 83 68 87 83 91 29 294 64 127 107 333 198 501" \
  --tokenizer-type=HuggingFaceTokenizer --tokenizer-model="$data/llama3_style/tokenizer.json"
if [ -n "${LOOM_TEST_HAVE_SENTENCEPIECE:-}" ]; then
  run spm "337 390 338 307 341 273 272 348 347 379 337 384 380 352 337 404 370 355 2 337 378 340 356 439 337 63 127 279 347 341 356 339 338 385 339 127 65 297 340 440 364 338 13 2" \
    --tokenizer-type=SentencePieceTokenizer --tokenizer-model="$data/spm_bpe.model"
else
  echo "SentencePiece: skipped (Loom was built without libsentencepiece)"
fi

# expect_fail TEXT FLAGS...: exit status 2 and TEXT in the error.
expect_fail() {
  local text="$1"
  shift
  local rc=0
  "$bin" --input=docs.jsonl --output-prefix=x "$@" 2> err.txt > /dev/null || rc=$?
  [ "$rc" = 2 ] || { echo "expected exit 2, got $rc for: $*"; cat err.txt; exit 1; }
  grep -qF -- "$text" err.txt || { echo "\"$text\" not in the error for: $*"; cat err.txt; exit 1; }
}
expect_fail "--tokenizer-type=HuggingFaceTokenizer needs --tokenizer-model" \
  --tokenizer-type=HuggingFaceTokenizer
expect_fail "--tokenizer-type=SentencePieceTokenizer needs --tokenizer-model" \
  --tokenizer-type=SentencePieceTokenizer
expect_fail "--tokenizer-type=HuggingFace: Illegal value 'HuggingFace': expected one of ByteLevelTokenizer | GPT2BPETokenizer" \
  --tokenizer-type=HuggingFace
expect_fail "--tokenizer-model=$PWD/nowhere" \
  --tokenizer-type=HuggingFaceTokenizer --tokenizer-model="$PWD/nowhere"
head -c 300 "$data/gpt2_style/tokenizer.json" > truncated.json
expect_fail "$PWD/truncated.json is not valid JSON" \
  --tokenizer-type=HuggingFaceTokenizer --tokenizer-model="$PWD/truncated.json"
echo "preprocess_tokenizers_test: ok"
