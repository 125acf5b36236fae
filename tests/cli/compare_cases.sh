#!/usr/bin/env bash
# `mpt compare`: identical runs -> 0; a perturbed value -> 1 naming the path; tolerance -> 0;
# different experiments / unreadable input / bad --tol -> 2.
set -u
mpt=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$mpt" underflow -q --set model.depth=3 --out "$tmp/a.json" || fail "run a"
"$mpt" underflow -q --set model.depth=3 --out "$tmp/b.json" || fail "run b"
out=$("$mpt" compare "$tmp/a.json" "$tmp/b.json"); rc=$?
[ $rc = 0 ] || fail "identical runs: exit $rc: $out"
echo "$out" | grep -q "compare: 0 of [0-9]* values differ" || fail "summary: $out"
# Perturb one value by 1e-9 relative.
/usr/bin/python3 - "$tmp/b.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]["gradients"]:
    if r["name"] == "d3.L01":
        r["mean_abs"] *= 1 + 1e-9
json.dump(d, open(sys.argv[1], "w"))
PY
out=$("$mpt" compare "$tmp/a.json" "$tmp/b.json"); rc=$?
[ $rc = 1 ] || fail "perturbed: exit $rc"
echo "$out" | grep -q "/results/gradients/d3.L01/mean_abs" || fail "perturbed path not named: $out"
"$mpt" compare "$tmp/a.json" "$tmp/b.json" --rtol 1e-8 > /dev/null || fail "--rtol 1e-8 should pass"
"$mpt" compare "$tmp/a.json" "$tmp/b.json" --tol '/results/gradients/*/mean_abs=1e-8' > /dev/null || fail "--tol should pass"
"$mpt" compare "$tmp/a.json" "$tmp/b.json" --tol '/results/casts/*=1e-8' > /dev/null; [ $? = 1 ] || fail "--tol on other keys should not pass"
"$mpt" compare "$tmp/a.json" "$tmp/b.json" --timings | grep -q "wall_s" || fail "--timings shows no timings"
sed 's/"experiment": "underflow"/"experiment": "lossscale"/' "$tmp/a.json" > "$tmp/c.json"
"$mpt" compare "$tmp/a.json" "$tmp/c.json" 2> "$tmp/err"; rc=$?
[ $rc = 2 ] && grep -q "experiment differs" "$tmp/err" || fail "different experiments: exit $rc $(cat "$tmp/err")"
head -c 100 "$tmp/a.json" > "$tmp/trunc.json"
"$mpt" compare "$tmp/a.json" "$tmp/trunc.json" 2> "$tmp/err"; rc=$?
[ $rc = 2 ] && grep -q "trunc.json: invalid JSON" "$tmp/err" || fail "truncated: exit $rc $(cat "$tmp/err")"
"$mpt" compare "$tmp/a.json" "$tmp/missing.json" 2>/dev/null; [ $? = 2 ] || fail "missing file should exit 2"
"$mpt" compare "$tmp/a.json" "$tmp/b.json" --tol 'x=abc' 2>/dev/null; [ $? = 2 ] || fail "bad --tol should exit 2"
for bad in "--rtol nan" "--atol inf" "--rtol -1" "--tol x=nan" "--tol x=1e-8,inf"; do
  # shellcheck disable=SC2086
  "$mpt" compare "$tmp/a.json" "$tmp/b.json" $bad 2> "$tmp/err"; rc=$?
  [ $rc = 2 ] && grep -q "finite" "$tmp/err" || fail "$bad: exit $rc (expected 2 naming finite tolerances) $(cat "$tmp/err")"
done
# Tolerance files: a bound that overflows to infinity is refused with file and line; a tab
# between a rule and its value is accepted.
printf '# header\n/results/*\trel 1e300*1e300\n' > "$tmp/inf.tol"
"$mpt" compare "$tmp/a.json" "$tmp/b.json" --tol-file "$tmp/inf.tol" 2> "$tmp/err"; rc=$?
[ $rc = 2 ] && grep -q "inf.tol:2" "$tmp/err" && grep -q "not finite" "$tmp/err" \
  || fail "infinite tolerance: exit $rc (expected 2 naming inf.tol:2) $(cat "$tmp/err")"
printf '/results/gradients/*/mean_abs\trel\t1e-8\n' > "$tmp/tab.tol"
"$mpt" compare "$tmp/a.json" "$tmp/b.json" --tol-file "$tmp/tab.tol" > /dev/null 2> "$tmp/err" \
  || fail "tab-separated rule: $(cat "$tmp/err")"
# Integers beyond 64 bits compare exactly: 2^64 + 1 vs 2^64 + 2 differ, equal ones are equal.
big() { printf '{"schema_version": 1, "experiment": "x", "results": {"n": %s}}' "$1" > "$tmp/$2"; }
big 18446744073709551617 big1.json; big 18446744073709551618 big2.json; big 18446744073709551617 big3.json
out=$("$mpt" compare "$tmp/big1.json" "$tmp/big2.json"); rc=$?
[ $rc = 1 ] && echo "$out" | grep -q "18446744073709551618" || fail "2^64+1 vs 2^64+2: exit $rc: $out"
"$mpt" compare "$tmp/big1.json" "$tmp/big3.json" > /dev/null || fail "equal integers beyond 2^64 differ"
echo "ok: mpt compare cases"
