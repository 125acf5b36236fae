#!/usr/bin/env bash
# A run that diverges on purpose (a huge learning rate, or a forward that overflows its format):
#   diverged_case.sh MPT EXPECTED_EXIT REGEX [mpt args...]
# Runs `mpt args... --out FILE` in a scratch folder and checks that
#  - the exit code is EXPECTED_EXIT: 1 where the experiment's equivalence checks compare the
#    diverged run (a nan on either side is a mismatch: they must fail, not pass on the finite
#    part), 0 where it only reports the loss;
#  - stdout+stderr match REGEX (the note naming the run, its non-finite loss and the step);
#  - the result file was written (a failed check still writes it) and lists the runs under
#    results.diverged, each with a step and a non-finite loss ("nan", "inf", "-inf").
set -u
mpt=$1 want=$2 regex=$3
shift 3
cmd="$mpt $*"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$mpt" "$@" --out "$tmp/r.json" > "$tmp/stdout" 2> "$tmp/stderr"
got=$?
fail() { echo "FAIL: $*"; echo "--- command: $cmd"; grep -n "diverged\|nan\|FAIL" "$tmp/stdout" | head -40; echo "--- stderr:"; tail -20 "$tmp/stderr"; exit 1; }
[ "$got" = "$want" ] || fail "exit code $got, expected $want"
cat "$tmp/stdout" "$tmp/stderr" | grep -Eq -- "$regex" || fail "output does not match /$regex/"
/usr/bin/python3 - "$tmp/r.json" <<'PY' || fail "results.diverged missing or malformed"
import json, sys
d = json.load(open(sys.argv[1]))["results"].get("diverged")
assert d, "no results.diverged"
for row in d:
    assert row["loss"] in ("nan", "inf", "-inf"), row
    assert isinstance(row["step"], int) and row["step"] >= 0, row
    assert row["name"] and row["table"], row
print("ok: diverged:", ", ".join(f"{r['name']} at step {r['step']}" for r in d))
PY
echo "ok: exit $got"
