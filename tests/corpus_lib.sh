# Sourced by the end-to-end tests: the tiny corpus they train on.
#
#   tiny_corpus PREPROCESS PREFIX
#
# Writes corpus.txt in the current folder (300 short English-like lines as
# fortune-style documents, separated by %) and tokenizes it byte-level with
# //train:preprocess_data (PREPROCESS) into PREFIX.bin / PREFIX.idx.
tiny_corpus() {
  local preprocess="$1" prefix="$2" i
  for i in $(seq 1 300); do
    printf 'the quick brown fox %d jumps over the lazy dog\n%%\n' "$((i % 17))"
  done > corpus.txt
  "$preprocess" --input=corpus.txt --output-prefix="$prefix" --tokenizer-type=ByteLevelTokenizer \
    --document-separator=% > /dev/null 2>&1
}
