#!/usr/bin/env bash
# check_golden.sh MPT GOLDEN.json [THREADS]: re-runs the experiment with the config stored in the
# golden result file (on the CPU, with THREADS intra-op threads, default 1) and checks with
# `mpt compare` that every value under results/checks holds within the tolerances derived in
# tests/golden/tolerances/<experiment>.tol (exact where no rule matches; docs/results.md).
# ctest runs it under several oneDNN ISA caps, ATen CPU capabilities and thread counts, so one
# machine proves the results hold across the kernels other CPUs would choose.
# Regenerate on purpose with scripts/update-golden.sh (the diff then shows in review).
set -eu
mpt=$1 golden=$2 threads=${3:-1}
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -f "$golden" ]; then
  echo "SKIPPED: no golden file $golden for this LibTorch (scripts/update-golden.sh makes it)"
  exit 77
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
exp=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["experiment"])' "$golden")
/usr/bin/python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["config"]; c["device"]="cpu"; c["threads"]=int(sys.argv[3]); json.dump(c, open(sys.argv[2],"w"))' "$golden" "$tmp/config.json" "$threads"
tol="$here/tolerances/$exp.tol"
[ -f "$tol" ] || { echo "FAIL: no tolerance file $tol (every golden experiment classifies its values)"; exit 1; }
echo "kernels: $("$mpt" env | grep -E '^hardware\.(aten_cpu_capability|onednn\.isa |threads\.intra_op)' | tr -s ' ' | paste -sd ';' -)"
"$mpt" "$exp" -q --config "$tmp/config.json" --out "$tmp/new.json"
"$mpt" compare "$golden" "$tmp/new.json" --tol-file "$tol"
