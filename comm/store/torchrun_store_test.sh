#!/usr/bin/env bash
# Loom's client of torchrun's store (comm/store/torchrun_store.h) against the
# real thing: PyTorch's TCPStore (libuv server, as torchrun's agent runs it)
# from the reference environment `tools/setup.sh --torch` makes. Both directions: values
# set in C++ read in Python and the other way, an atomic add seen by both, a
# wait that times out and a call after it on a new connection.
# Skips (exit 0, saying why) without PyTorch, unless LOOM_REQUIRE_TORCH=1 (CI).
#   torchrun_store_test.sh PROBE
set -euo pipefail
PROBE="$(readlink -f "$1")"
if [ -n "${TEST_SRCDIR:-}" ]; then ROOT="$TEST_SRCDIR/loom"; else ROOT="$(dirname "$(readlink -f "$0")")/../.."; fi
source "$ROOT/tools/pytorch_reference/find_torch.sh"
PY=$(find_torch_python) || { echo "SKIPPED: torchrun_store_test: $PY"; exit "$(torch_missing_status)"; }

"$PY" -W ignore - "$PROBE" <<'PYEOF'
import subprocess, sys
from datetime import timedelta
from torch.distributed import TCPStore

probe = sys.argv[1]
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                 timeout=timedelta(seconds=30))
print(f"PyTorch TCPStore on 127.0.0.1:{store.port} (libuv: {store.libuvBackend})")
store.add("counter", 2)
proc = subprocess.Popen([probe, "127.0.0.1", str(store.port)], stdout=subprocess.PIPE, text=True)
store.wait(["from_loom"])            # set by Loom before it waits for ours
got = store.get("from_loom").decode()
assert got == "hello-from-loom", got
store.set("from_torch", "hello-from-torch")
out, _ = proc.communicate(timeout=60)
print(out, end="")
assert proc.returncode == 0, f"probe exited {proc.returncode}"
lines = dict(line.split(" ", 1) for line in out.strip().splitlines() if " " in line)
assert lines["add"] == "7", lines            # 2 from Python + 5 from Loom
assert lines["get"] == "hello-from-torch", lines
assert lines["get_again"] == "hello-from-torch", lines
assert "not set within" in lines["missing"], lines
assert lines["local_address"] == "127.0.0.1", lines
assert int(store.get("counter")) == 7
assert store.get("done") == b"1"
print("PASSED: torchrun_store_test")
PYEOF
