#!/usr/bin/env bash
# check_golden.sh MPT GOLDEN.json: re-runs the experiment with the config stored in the golden
# result file and checks with `mpt compare` that every number under results/checks is unchanged.
# Regenerate on purpose with scripts/update-golden.sh (the diff then shows in review).
set -eu
mpt=$1 golden=$2
if [ ! -f "$golden" ]; then
  echo "SKIPPED: no golden file $golden for this LibTorch (scripts/update-golden.sh makes it)"
  exit 77
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
exp=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["experiment"])' "$golden")
/usr/bin/python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["config"]; c["device"]="cpu"; c["threads"]=1; json.dump(c, open(sys.argv[2],"w"))' "$golden" "$tmp/config.json"
"$mpt" "$exp" -q --config "$tmp/config.json" --out "$tmp/new.json"
"$mpt" compare "$golden" "$tmp/new.json"
