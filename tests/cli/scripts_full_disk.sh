#!/usr/bin/env bash
# scripts_full_disk.sh: sweep.py and plot.py on a full disk and with stdout on /dev/full (second
# new-user probe, issue 15): one clear line and exit 3, no traceback, no empty plot left behind.
# The full disk is a 64 KiB tmpfs (root only: skipped with exit 77 elsewhere).
set -u
py=/usr/bin/python3
tmp=$(mktemp -d)
full="$tmp/full"
mkdir -p "$full"
cleanup() { umount "$full" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
# plot names to a full stdout: the plots are made, one line, exit 3
$py scripts/plot.py tests/golden/underflow.json --out-dir "$tmp/plots" > /dev/full 2> "$tmp/err"
code=$?
[ $code = 3 ] || fail "plot.py > /dev/full: exit $code, expected 3"
grep -q "cannot write the plot names to stdout" "$tmp/err" || fail "plot.py > /dev/full: message"
! grep -q Traceback "$tmp/err" || fail "plot.py > /dev/full: traceback"
[ -s "$tmp/plots/underflow_zero_fraction.png" ] || fail "plot.py > /dev/full: plots not made"
if ! mount -t tmpfs -o size=64k tmpfs "$full" 2>/dev/null; then
  echo "SKIPPED (the full-disk part): cannot mount a tmpfs here (not root?)"
  exit 0
fi
dd if=/dev/zero of="$full/fill" bs=1k count=60 2>/dev/null
# plot.py onto a full disk: one line per file, exit 2 (none plotted), no empty plot left
$py scripts/plot.py tests/golden/underflow.json --out-dir "$full" > /dev/null 2> "$tmp/err"
code=$?
[ $code = 2 ] || fail "plot.py onto a full disk: exit $code, expected 2"
grep -q "No space left on device" "$tmp/err" || fail "plot.py onto a full disk: message"
! grep -q Traceback "$tmp/err" || fail "plot.py onto a full disk: traceback"
[ -z "$(find "$full" -name '*.png')" ] || fail "plot.py left a partial plot: $(find "$full" -name '*.png')"
# sweep.py whose summary cannot be written: one line, exit 3
cat > "$tmp/fakempt" <<'SH'
#!/bin/bash
[ "$1" = list ] && { echo "underflow  x"; exit 0; }  # sweep.py's check that the experiment is one
for a in "$@"; do [ "$a" = --help ] && exit 0; done
out=""; while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
mkdir -p "$(dirname "$out")" 2>/dev/null; echo '{"schema_version":1,"results":{"x":1}}' > "$out" 2>/dev/null || exit 3
SH
chmod +x "$tmp/fakempt"
$py scripts/sweep.py underflow --mpt "$tmp/fakempt" --grid seed=0,1 --out-dir "$full/sweep" > /dev/null 2> "$tmp/err"
code=$?
[ $code = 3 ] || { cat "$tmp/err"; fail "sweep.py onto a full disk: exit $code, expected 3"; }
grep -q "cannot write .*summary.csv: No space left on device" "$tmp/err" || fail "sweep.py onto a full disk: message"
! grep -q Traceback "$tmp/err" || fail "sweep.py onto a full disk: traceback"
echo "ok: sweep.py and plot.py fail cleanly on a full disk and a full stdout"
