# Sourced by the end-to-end tests: comparing the checkpoints two runs left.
# Needs a `fail MESSAGE` function in the sourcing script.

final() {  # final DIR: the iter folder DIR/latest names (fails if incomplete)
  local it
  it=$(cat "$1/latest" 2>/dev/null) || fail "$1 has no latest"
  [ -f "$1/$it/manifest.pb" ] || fail "$1/$it has no manifest"
  echo "$1/$it"
}

same() {  # same DIR_A DIR_B: the final checkpoints are byte for byte equal
  local a b
  a=$(final "$1"); b=$(final "$2")
  [ "$(basename "$a")" = "$(basename "$b")" ] || fail "$1 ends at $(basename "$a"), $2 at $(basename "$b")"
  diff -r "$a" "$b" > /dev/null || fail "final checkpoints differ: $a vs $b"
  echo "  $a == $b (bit-identical)"
}
