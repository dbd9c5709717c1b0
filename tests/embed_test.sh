#!/usr/bin/env bash
# Builds and runs tests/embed (a separate workspace that declares Loom with
# local_repository) with a nested Bazel, proving our targets embed cleanly.
set -euo pipefail

# The Loom checkout: the real path behind a runfile of the root package.
marker="${TEST_SRCDIR}/${TEST_WORKSPACE}/README.md"
loom="$(dirname "$(readlink -f "$marker")")"
[ -f "$loom/WORKSPACE" ] || { echo "embed_test: cannot find the Loom checkout from $marker" >&2; exit 1; }

work="${TEST_TMPDIR}/embed"
rm -rf "$work" && cp -r "$loom/tests/embed" "$work"
sed -i "s#LOOM_PATH#${loom}#" "$work/WORKSPACE"
cd "$work"
export HOME="${TEST_TMPDIR}/home" && mkdir -p "$HOME"
status=0
bazel --output_user_root="${TEST_TMPDIR}/bazel_root" --batch test //... \
  --symlink_prefix=/ --spawn_strategy=local || status=$?
echo "embed_test: nested bazel exited with ${status}"
exit "$status"
