#!/bin/bash
# Runs BINARY ARGS... with a hard time limit (the binary starts one rank per
# GPU itself, or prints SKIPPED and exits 0 without a GPU).
set -u
export TMPDIR="${TEST_TMPDIR:-$(mktemp -d)}"
exec timeout -k 10 280 "$@"
