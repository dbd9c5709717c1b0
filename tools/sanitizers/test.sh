#!/usr/bin/env bash
# Runs tests under a sanitizer with Loom's suppression files:
#   tools/sanitizers/test.sh asan|tsan|ubsan [bazel test args...] [targets...]
# e.g. tools/sanitizers/test.sh tsan //comm/...
# The suppression files list third-party libraries only, each with a reason.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
san=${1:-}
case "$san" in
  asan)
    # OpenMPI unloads its plugins at MPI_Finalize, so a plugin's leak has no
    # module name left; the slow unwinder records the whole allocation stack,
    # whose libmpi frames the suppressions match.
    env=(--test_env="ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:fast_unwind_on_malloc=0"
         --test_env="LSAN_OPTIONS=suppressions=$root/tools/sanitizers/lsan.supp:print_suppressions=0") ;;
  tsan)
    # UCX's memory hooks (libucm) intercept the madvise a dying thread makes
    # after TSan has torn down that thread's state, and crash in TSan's mutex
    # hook; Loom registers no memory that needs them.
    env=(--test_env="TSAN_OPTIONS=suppressions=$root/tools/sanitizers/tsan.supp:halt_on_error=1:second_deadlock_stack=1:print_suppressions=0"
         --test_env=UCX_MEM_MMAP_HOOK_MODE=none --test_env=UCX_MEM_MALLOC_HOOKS=no) ;;
  ubsan)
    env=() ;;
  *)
    echo "usage: $0 asan|tsan|ubsan [bazel test args...] targets..." >&2
    echo "  first argument '$san': expected asan, tsan or ubsan" >&2
    exit 2 ;;
esac
shift
if [ $# -eq 0 ]; then
  echo "$0: no targets given (e.g. //comm/...)" >&2
  exit 2
fi
cd "$root"
exec bazel test --config="$san" "${env[@]}" "$@"
