#!/usr/bin/env bash
# `mpt underflow --print-config --set ...` saved as a file and run with --config gives
# the same resolved config and the same results as the run with --set.
set -eu
mpt=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$mpt" underflow --print-config --set model.depth=5 --set data.batch=16 > "$tmp/cfg.json"
"$mpt" underflow -q --config "$tmp/cfg.json" --out "$tmp/a.json"
"$mpt" underflow -q --set model.depth=5 --set data.batch=16 --out "$tmp/b.json"
/usr/bin/python3 - "$tmp/cfg.json" "$tmp/a.json" "$tmp/b.json" <<'PY'
import json, sys
cfg, a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["config"] == cfg, "config echoed into the result differs from --print-config"
assert a["config"]["model"]["depth"] == 5
assert a["results"] == b["results"], "results differ between --config and --set"
print("ok: print-config round-trip")
PY
