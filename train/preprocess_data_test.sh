#!/usr/bin/env bash
set -euo pipefail
bin="$TEST_SRCDIR/$TEST_WORKSPACE/train/preprocess_data"
cd "$TEST_TMPDIR"
printf 'one\n%%\ntwo two\n%%\n' > in.txt
"$bin" --input=in.txt --output-prefix=out --tokenizer-type=ByteLevelTokenizer \
  --document-separator=% > stdout.txt 2> stderr.txt
grep -q "2 documents, 12 tokens" stdout.txt || { cat stdout.txt stderr.txt; exit 1; }
grep -q "100.0%" stderr.txt || { echo "no progress bar"; cat stderr.txt; exit 1; }
[ "$(head -c 7 out.idx)" = "MMIDIDX" ] || { echo "bad idx magic"; exit 1; }
[ "$(stat -c %s out.bin)" = 24 ] || { echo "bin should hold 12 u16 tokens"; exit 1; }

# Unknown tokenizer: exit 2 and the flag is named.
if "$bin" --input=in.txt --output-prefix=x --tokenizer-type=nope 2> err.txt; then
  echo "expected failure"; exit 1
fi
grep -q -- "--tokenizer-type=nope" err.txt || { cat err.txt; exit 1; }
# Missing input file is named.
if "$bin" --input=missing.txt --output-prefix=x --tokenizer-type=byte 2> err.txt; then
  echo "expected failure"; exit 1
fi
grep -q "missing.txt" err.txt || { cat err.txt; exit 1; }
echo "preprocess_data_test: ok"
