#!/usr/bin/env bash
# One CLI test case: run_case.sh MPT EXPECTED_EXIT REGEX [mpt args...]
# Runs mpt with --out pointing into a scratch folder (unless the args give --out) and checks:
#  - the exit code equals EXPECTED_EXIT;
#  - stdout+stderr match the extended regex REGEX (ANY: no requirement);
#  - exit 0: the result file exists and is valid JSON with schema_version 1;
#  - exit != 0 (usage/config errors): a pre-existing result file is byte-identical after the run
#    (nothing half-written, nothing overwritten) and no temporary file is left behind.
# The mpt args may use @OUT@ and @TMP@ for the result path and the scratch folder.
set -u
mpt=$1 want=$2 regex=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out="$tmp/result.json"
args=()
has_out=0
appended=0
for a in "$@"; do
  a=${a//@OUT@/$out}
  a=${a//@TMP@/$tmp}
  args+=("$a")
  [ "$a" = "--out" ] && has_out=1
done
# Subcommands that write results get --out; `list`, --help and --version do not.
if [ $has_out = 0 ] && [ ${#args[@]} -gt 0 ] && [[ ${args[0]} != -* ]] && [ "${args[0]}" != list ] \
   && [[ " ${args[*]} " != *" --help "* ]] && [[ " ${args[*]} " != *" --print-config "* ]]; then
  args+=(--out "$out")
  appended=1
fi
if [ "$want" != 0 ]; then
  printf 'sentinel\n' > "$out"
fi
"$mpt" "${args[@]}" > "$tmp/stdout" 2> "$tmp/stderr"
got=$?
fail() { echo "FAIL: $*"; echo "--- command: $mpt ${args[*]}"; echo "--- stdout:"; head -50 "$tmp/stdout"; echo "--- stderr:"; cat "$tmp/stderr"; exit 1; }
[ "$got" = "$want" ] || fail "exit code $got, expected $want"
if [ "$regex" != ANY ] && ! cat "$tmp/stdout" "$tmp/stderr" | grep -Eq -- "$regex"; then
  fail "output does not match /$regex/"
fi
if [ "$want" = 0 ]; then
  if [ $appended = 1 ] && [ ! -f "$out" ]; then
    fail "exit 0 but no result file was written"
  fi
  if [ $has_out = 0 ] && [ -f "$out" ]; then
    /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["schema_version"]==1, "schema_version"; assert "results" in d and "env" in d and "timings" in d' "$out" \
      || fail "result file is not a valid result document"
  fi
else
  [ "$(cat "$out")" = sentinel ] || fail "the pre-existing result file was changed"
  leftovers=$(find "$tmp" -name '.*.tmp.*' | wc -l)
  [ "$leftovers" = 0 ] || fail "temporary files left behind"
fi
echo "ok: exit $got"
