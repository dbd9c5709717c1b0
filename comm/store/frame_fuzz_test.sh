#!/bin/bash
# A bounded libFuzzer run over the TCP store's frame parser (frame_fuzz.cc):
# a fixed seed, a small seed corpus of valid frames, 5 seconds. Any crash,
# sanitizer report or broken invariant fails the test with the input saved.
set -eu
FUZZER="$1"
DIR="${TEST_TMPDIR:-$(mktemp -d)}"
ART="${TEST_UNDECLARED_OUTPUTS_DIR:-$DIR}/artifacts"
mkdir -p "$DIR/corpus" "$ART"
# Byte 0 picks the limit; then frames: head, len_a (LE32), a, len_b (LE32), b.
printf '\006\001\003\000\000\000key\005\000\000\000value' > "$DIR/corpus/set"
printf '\006\002\003\000\000\000key\004\000\000\0001000\003\003\000\000\000cnt\001\000\000\0001' \
  > "$DIR/corpus/get_add"
printf '\003\001\377\377\377\377' > "$DIR/corpus/huge"
"$FUZZER" -seed=17 -max_total_time=5 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$ART/" "$DIR/corpus" 2>&1 | tail -n 25
status=${PIPESTATUS[0]}
if [ "$status" != 0 ]; then
  echo "FAIL: the fuzzer exited $status; reproducer(s):"
  ls -l "$ART"
  exit 1
fi
echo PASS
