#!/usr/bin/env bash
# The README's table of public targets lists exactly the targets whose
# visibility is public (what an embedding workspace may depend on), read from
# every BUILD file of the checkout. "external": the BUILD files are not
# declared inputs, so the test is never cached.
set -euo pipefail

marker="${TEST_SRCDIR}/${TEST_WORKSPACE}/README.md"
loom="$(dirname "$(readlink -f "$marker")")"
[ -f "$loom/WORKSPACE" ] || { echo "public_targets_test: no Loom checkout at $loom" >&2; exit 1; }

python3 - "$loom" <<'PY'
import os, re, sys

loom = sys.argv[1]
skip = {"bazel-bin", "bazel-out", "bazel-testlogs", "bazel-main", "tests/embed"}

# Rules with visibility = ["//visibility:public"], from the BUILD files.
public = set()
for root, dirs, files in os.walk(loom):
    rel = os.path.relpath(root, loom)
    dirs[:] = [d for d in dirs
               if not d.startswith((".", "bazel-")) and os.path.join(rel, d).lstrip("./") not in skip]
    if "BUILD" not in files:
        continue
    pkg = "" if rel == "." else rel
    text = open(os.path.join(root, "BUILD")).read()
    # A rule call: an identifier at the start of a line, up to the ')' that
    # starts a line (buildifier's layout, which every BUILD file here follows).
    for rule in re.finditer(r"^\w+\((.*?)^\)", text, re.S | re.M):
        body = rule.group(1)
        name = re.search(r'^\s*name = "([^"]+)"', body, re.M)
        if name and re.search(r'visibility = \["//visibility:public"\]', body):
            public.add(f"//{pkg}:{name.group(1)}")

# The README's table: from its header row to the first line that is not a row.
lines = open(os.path.join(loom, "README.md")).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith("| target (`@loom` prefix omitted)"))
listed = set()
for line in lines[start + 2:]:
    if not line.startswith("|"):
        break
    first_cell = line.split("|")[1]
    for label in re.findall(r"`(//[^`]+)`", first_cell):
        if ":" not in label:
            label += ":" + label.rsplit("/", 1)[-1]
        listed.add(label)

missing, extra = sorted(public - listed), sorted(listed - public)
for t in missing:
    print(f"public_targets_test: {t} is public but not in README.md's public target table")
for t in extra:
    print(f"public_targets_test: README.md's public target table lists {t}, which is not public")
print(f"public_targets_test: {len(public)} public targets, {len(listed)} listed")
sys.exit(1 if missing or extra else 0)
PY
