#!/usr/bin/env bash
# A hung or dead rank (issue 4, faults; issue 19): a two-process run of a multi-process experiment
# with the shared /fault and /dist keys (dataparallel, shard, tensorparallel, contextparallel,
# expertparallel) where rank 1, from step 1 on, stays alive but silent (FAULT_MODE=hang, the default: it sleeps forever) or dies
# (FAULT_MODE=exit: it exits with code 86 mid-step). Checks that
#  - mpt exits 3 within a bound (timeout + report window + start-up, far below "forever");
#  - rank 0's error names rank 1 as the rank that did not answer;
#  - the launcher names rank 1 as the failed rank (not rank 0, which only gave up waiting), with
#    its exit code when it died;
#  - no result file is written and no process of the run is left behind (pgrep -f on the
#    run's unique scratch path, which every worker carries in its command line).
#   [FAULT_MODE=exit] hung_rank.sh MPT EXPERIMENT [mpt args of a quick 2-process config...]
set -u
mpt=$1 exp=$2
shift 2
mode=${FAULT_MODE:-hang}
case $mode in hang | exit) ;; *) echo "FAULT_MODE=$mode: expected hang or exit"; exit 1 ;; esac
timeout_s=3
tmp=$(mktemp -d /tmp/mpt-hang.XXXXXX)
cleanup() { for p in $(pgrep -f -- "$tmp"); do kill -KILL "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- stderr:"; cat "$tmp/err"; exit 1; }
start=$(date +%s%N)
"$mpt" "$exp" "$@" \
  --set fault.rank=1 --set fault.step=1 --set fault.mode="$mode" --set dist.timeout_s=$timeout_s \
  --out "$tmp/result.json" > "$tmp/out" 2> "$tmp/err"
code=$?
took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$code" = 3 ] || fail "exit code $code, expected 3"
# A collective says "rank 1 did not answer"; a send/recv (the ring of contextparallel) "rank 1 is late".
grep -Eq "failed on rank 0 of 2: .*rank 1 (did not answer|is late)" "$tmp/err" \
  || fail "rank 0's message does not name rank 1 as the rank that did not answer"
if [ "$mode" = hang ]; then
  grep -Eq "rank 1 of 2 failed: did not answer" "$tmp/err" || fail "the launcher does not blame rank 1"
else
  grep -Eq "rank 1 of 2 failed: exit code 86 \(injected fault\)" "$tmp/err" \
    || fail "the launcher does not name rank 1 and its exit code"
fi
grep -Eq "rank 0 of 2 failed" "$tmp/err" && fail "the launcher blames rank 0, which only timed out"
[ ! -e "$tmp/result.json" ] || fail "a result file was written"
[ "$took_ms" -le $(( (timeout_s + 25) * 1000 )) ] || fail "took ${took_ms} ms for a ${timeout_s} s timeout"
sleep 0.3
left=$(pgrep -f -- "$tmp")
[ -z "$left" ] || fail "processes left behind: $(ps -o pid=,args= -p "$(echo $left | tr ' ' ,)")"
grep -E "did not answer|killing|exit code 86" "$tmp/err"
echo "ok: $mode of rank 1 reported, mpt exited 3 after ${took_ms} ms, no process left"
