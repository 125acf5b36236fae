#!/usr/bin/env bash
# Speed of mpt's data parallelism vs PyTorch-Python's DistributedDataParallel (Gloo, Debian's
# python3-torch), same model, global batch and N, measured side by side (alternating, 3 rounds):
#   bench/dataparallel.sh [MPT] [N] [STEPS]
# Prints each round's step times and the ratio mpt / DDP of the medians (<= 1: mpt is not slower).
set -eu
mpt=${1:-build/mpt} n=${2:-2} steps=${3:-60}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
common=(dataparallel --nproc "$n" --set "train.nprocs=[$n]" --set train.max_steps=$steps --set train.samples=60000
        --set train.nosync_steps=0 --set threads=1 -q)
m=() d=()
for round in 1 2 3; do
  "$mpt" "${common[@]}" --out "$tmp/mpt.json"
  m+=("$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["timings"]["per_n"]["n'$n'"]["step_ms"])' "$tmp/mpt.json")")
  d+=("$(/usr/bin/python3 bench/dataparallel_ddp.py "$tmp/mpt.json" "$n" "$steps" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["step_ms"])')")
  echo "round $round: mpt ${m[-1]} ms/step, torch DDP ${d[-1]} ms/step"
done
/usr/bin/python3 - "${m[*]}" "${d[*]}" <<'PY'
import statistics, sys
m = statistics.median(map(float, sys.argv[1].split())); d = statistics.median(map(float, sys.argv[2].split()))
print(f"median step: mpt {m:.3f} ms, torch DDP {d:.3f} ms, ratio mpt/DDP = {m / d:.3f}")
PY
