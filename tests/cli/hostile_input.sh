#!/usr/bin/env bash
# Hostile input to the config loader and `mpt compare` (issue 15, defects 3, 4 and 11):
#   hostile_input.sh MPT CASE
# Each case runs mpt under a time limit and checks the exit code and the message; a config
# error must also leave a pre-existing result file untouched.
set -u
mpt=$1 case=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL [$case]: $*"; echo "--- stdout:"; head -c 3000 "$tmp/out"; echo "--- stderr:"; head -c 3000 "$tmp/err"; exit 1; }
# run EXIT REGEX ARGS...: mpt ARGS within 30 s, exit code EXIT, output matching REGEX.
run() {
  local want=$1 regex=$2; shift 2
  printf 'sentinel\n' > "$tmp/result.json"
  timeout 30 "$mpt" "$@" > "$tmp/out" 2> "$tmp/err"; local got=$?
  [ $got = 124 ] && fail "did not end within 30 s"
  [ "$got" = "$want" ] || fail "exit code $got, expected $want"
  cat "$tmp/out" "$tmp/err" | grep -Eq -- "$regex" || fail "output does not match /$regex/"
  [ "$(cat "$tmp/result.json")" = sentinel ] || fail "the result file was changed"
  if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$tmp/out" "$tmp/err"; then fail "raw control characters in the output"; fi
}
result() {  # result FILE RESULTS_JSON [TIMINGS_JSON]: a minimal mpt result document
  printf '{"schema_version": 1, "experiment": "underflow", "results": %s, "checks": [], "timings": %s}\n' \
    "$2" "${3:-{\}}" > "$1"
}
py=/usr/bin/python3
case $case in
  config_dev_zero)      run 2 "/dev/zero: the config file is larger than 16 MiB" underflow --config /dev/zero --out "$tmp/result.json" ;;
  config_dev_urandom)   run 2 "/dev/urandom: the config file is larger than 16 MiB" underflow --config /dev/urandom --out "$tmp/result.json" ;;
  config_deep)
    $py -c 'import sys; n=100000; sys.stdout.write("{\"model\":" + "["*n + "]"*n + "}")' > "$tmp/deep.json"
    run 2 "deep.json: nested deeper than 64 levels" underflow --config "$tmp/deep.json" --out "$tmp/result.json" ;;
  set_deep)
    run 2 "/model/depth: the value is nested deeper than 64 levels" underflow --out "$tmp/result.json" \
        --set "model.depth=$($py -c 'n=20000; print("["*n + "]"*n)')" ;;
  config_long_list)
    $py -c 'print("{\"model\": {\"depth\": [" + ",".join(["2"]*20000) + "]}}")' > "$tmp/long.json"
    run 2 "/model/depth: expected an integer or a list of at most 10000 of them, got a list of 20000" \
        underflow --config "$tmp/long.json" --out "$tmp/result.json" ;;
  config_long_key)
    $py -c 'print("{\"" + "k"*(1<<20) + "\": 1}")' > "$tmp/key.json"
    run 2 "unknown key \"k+… \(1048576 bytes\)\"" underflow --config "$tmp/key.json" --out "$tmp/result.json"
    [ "$(wc -c < "$tmp/err")" -lt 2000 ] || fail "the message is $(wc -c < "$tmp/err") bytes long" ;;
  set_ansi_key)
    run 2 'unknown key "\\x1b\[31mred\\x1b\[0m"' underflow --out "$tmp/result.json" --set $'\e[31mred\e[0m=1' ;;
  config_nul_key)
    printf '{"mod\\u0000el": {"depth": 3}}' > "$tmp/nul.json"
    run 2 '/mod\\0el: unknown key "mod\\0el" \(did you mean "model"\?\)' underflow --config "$tmp/nul.json" --out "$tmp/result.json" ;;
  exact_limits)  run 2 "/data/batch: expected an integer >= 1 and <= 1048576, got 2000000" underflow --set data.batch=2000000 --out "$tmp/result.json" ;;
  compare_dev_zero)
    result "$tmp/a.json" '{"x": 1}'
    run 2 "/dev/zero: the result file is larger than 256 MiB" compare "$tmp/a.json" /dev/zero ;;
  compare_deep)
    result "$tmp/a.json" '{"x": 1}'
    result "$tmp/b.json" "{\"x\": $($py -c 'n=100000; print("["*n + "]"*n)')}"
    run 2 "b.json: nested deeper than 256 levels" compare "$tmp/a.json" "$tmp/b.json" ;;
  compare_results_not_object)
    for r in '"text"' 3 '[1, 2]'; do
      result "$tmp/a.json" '"other"'
      result "$tmp/b.json" "$r"
      run 2 "a.json: /results: expected an object, got a string \"other\"" compare "$tmp/a.json" "$tmp/b.json"
      result "$tmp/a.json" '{"x": 1}'
      run 2 "b.json: /results: expected an object" compare "$tmp/a.json" "$tmp/b.json"
    done ;;
  compare_missing_leaf)
    result "$tmp/a.json" '{"x": 1, "s": "p"}'
    result "$tmp/b.json" '{"y": 1, "s": "q"}'
    run 1 "/results/x +1 +\(missing\) +- +- +only in base" compare "$tmp/a.json" "$tmp/b.json"
    grep -Eq "/results/y +\(missing\) +1 +- +- +only in new" "$tmp/out" || fail "only in new"
    grep -Eq "/results/s +p +q +- +- +not numbers" "$tmp/out" || fail "non-numeric leaf" ;;
  compare_big_integers)
    result "$tmp/a.json" '{"n": 9007199254740993}'
    result "$tmp/b.json" '{"n": 9007199254740992}'
    run 1 "/results/n +9007199254740993 +9007199254740992 +1.000e\+00" compare "$tmp/a.json" "$tmp/b.json" ;;
  compare_timing_zero)
    result "$tmp/a.json" '{"x": 1}' '{"t_s": 0}'
    result "$tmp/b.json" '{"x": 1}' '{"t_s": 0.5}'
    run 0 "/timings/t_s +0 +0.5 +n/a" compare --timings "$tmp/a.json" "$tmp/b.json" ;;
  compare_ansi)
    result "$tmp/a.json" '{"\u001b[31mred": "\u001b[2J"}'
    result "$tmp/b.json" '{"\u001b[31mred": "x"}'
    run 1 '/results/\\x1b\[31mred +\\x1b\[2J +x' compare "$tmp/a.json" "$tmp/b.json" ;;
  *) echo "hostile_input.sh: no case '$case'" >&2; exit 2 ;;
esac
echo "ok: $case"
