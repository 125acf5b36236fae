#!/usr/bin/env bash
# result_check.sh MPT CHECK [mpt args...]: runs `mpt args... -q --out FILE` (must exit 0),
# then tests/cli/result_checks.py CHECK FILE asserts properties of the result document
# (orderings and inequalities that a regex on stdout cannot express).
set -eu
mpt=$1 check=$2
shift 2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$mpt" "$@" -q --out "$tmp/r.json"
/usr/bin/python3 "$(dirname "$0")/result_checks.py" "$check" "$tmp/r.json"
