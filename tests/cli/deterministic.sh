#!/usr/bin/env bash
# Runs `mpt EXPERIMENT [args]` twice and checks that `results` and `checks` are identical
# and that run-dependent values live only under `env` and `timings`.
set -eu
mpt=$1; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$mpt" "$@" -q --out "$tmp/a.json"
"$mpt" "$@" -q --out "$tmp/b.json"
/usr/bin/python3 - "$tmp/a.json" "$tmp/b.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for key in ("schema_version", "tool", "experiment", "config", "results", "checks"):
    assert a[key] == b[key], f"{key} differs between two identical runs"
assert "wall_s" in a["timings"], "timings.wall_s missing"
print("ok: results identical across runs")
PY
