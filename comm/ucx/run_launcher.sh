#!/bin/bash
# Runs BINARY ARGS... (which uses --nproc-per-node) with a hard time limit.
# UCX shared-memory files go to the test's own TMPDIR.
set -u
export TMPDIR="${TEST_TMPDIR:-$(mktemp -d)}"
exec timeout -k 10 280 "$@"
