#!/usr/bin/env bash
# fp4_twin_can_fail.sh MPT PYTHON [mpt fp4 args...]: shows that parity.fp4_* can fail. Runs mpt once,
# then tests/parity/fp4_ref.py with one choice changed (--change), and checks that compare.py fails
# and that each variant's loss history first differs at the expected step (none: equal throughout):
#   sr_seed    (operand A's SR bits from another seed)  nvfp4, no_rht, no_2d, no_bf16 at step 1: step 0's
#              loss is a forward, SR acts in the backward; nvfp4_no_sr and the rest stay equal
#   e8m0_ceil  (MX scales rounded up)                   mxfp4 at step 0 (the forward quantizes); nothing else
set -u
mpt=$1 py=$2; shift 2
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "SKIPPED: $py cannot import torch; install Debian's python3-torch (scripts/setup.sh does) to run parity tests"
  exit 77
fi
here=$(dirname "$0")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$mpt" "$@" -q --device cpu --out "$tmp/mpt.json" || { echo "FAIL: mpt exited $?"; exit 1; }
check() {  # check CHANGE 'variant=step,...'
  "$py" "$here/fp4_ref.py" "$tmp/mpt.json" --change "$1" > "$tmp/ref_$1.json" || { echo "FAIL: twin --change $1 failed"; exit 1; }
  if "$py" "$here/compare.py" "$tmp/mpt.json" "$tmp/ref_$1.json" > "$tmp/cmp_$1.txt"; then
    echo "FAIL: the twin with --change $1 still equals mpt"; exit 1
  fi
  "$py" - "$tmp/mpt.json" "$tmp/ref_$1.json" "$1" "$2" <<'PY' || exit 1
import json, sys
mpt = json.load(open(sys.argv[1]))["results"]["history"]
ref = json.load(open(sys.argv[2]))["history"]
want = dict(kv.split("=") for kv in sys.argv[4].split(","))
bad = []
for v, losses in ref.items():
    first = next((i for i, (a, b) in enumerate(zip(mpt[v], losses)) if a != b), None)
    exp = want.get(v, "none")
    print(f"  --change {sys.argv[3]}: {v} first differs at step {first}")
    if str(first if first is not None else "none") != exp:
        bad.append(f"{v}: first difference at step {first}, expected {exp}")
if bad:
    print("FAIL: " + "; ".join(bad))
    sys.exit(1)
PY
}
check sr_seed "nvfp4=1,nvfp4_no_rht=1,nvfp4_no_2d=1,nvfp4_no_bf16=1"
check e8m0_ceil "mxfp4=0"
echo "ok: a twin with one choice changed fails, first at the step where the choice acts"
