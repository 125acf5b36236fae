#!/usr/bin/env bash
# A killed rank is named by every rank (issue 38, item 8): a 4-process run of a multi-process
# experiment with the shared /fault and /dist keys where rank 3 is killed (SIGKILL) at the start
# of step 1 of its loop: it hangs there (/fault/mode = hang, the point where it says "rank 3:
# hanging at step 1"), and this script kills it at once. Checks that
#  - mpt exits 3 within a bound (timeout + report window + start-up) and the launcher names rank 3;
#  - every other rank (0, 1, 2) ends with an error line of its own ("[error] mpt EXP (rank R of 4): ...")
#    that names rank 3 as the rank to blame ("rank 3 did not answer", "rank 3 is late", "rank 3
#    did not arrive", "the cause is rank 3") or says plainly that it cannot tell ("cannot tell"),
#    and blames no other rank: not a rank that only gave up on rank 3 and exited ("rank 2 is
#    late: its heartbeat stopped ... or dead"), nor the ranks still waiting elsewhere ("rank 0, 1, 3
#    did not answer");
#  - no result file is written and no process of the run is left behind.
# FAULT_MODE=exit: rank 3 exits by itself there (exit 86; `mpt pipeline`, whose fault point has no
# hang mode); TIMEOUT_KEY: the experiment's timeout key (default dist.timeout_s).
#   [FAULT_MODE=exit] [TIMEOUT_KEY=KEY] killed_rank_named.sh MPT EXPERIMENT [mpt args of a quick 4-process config...]
set -u
mpt=$1 exp=$2
shift 2
mode=${FAULT_MODE:-hang}
case $mode in hang | exit) ;; *) echo "FAULT_MODE=$mode: expected hang or exit"; exit 1 ;; esac
timeout_key=${TIMEOUT_KEY:-dist.timeout_s}
timeout_s=5
tmp=$(mktemp -d /tmp/mpt-killed.XXXXXX)
cleanup() { for p in $(pgrep -f -- "$tmp"); do kill -KILL "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- stderr:"; cat "$tmp/err"; exit 1; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }

fault=(--set fault.rank=3 --set fault.step=1)
[ "$mode" = hang ] && fault+=(--set fault.mode=hang)
"$mpt" "$exp" "$@" "${fault[@]}" --set "$timeout_key=$timeout_s" --out "$tmp/result.json" > "$tmp/out" 2> "$tmp/err" &
launcher=$!
# Rank 3 reaches its fault point (an ASan build on a loaded machine needs long to start).
for _ in $(seq 1200); do
  grep -Eq "rank 3: (hanging|exiting) at step 1" "$tmp/err" && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.05
done
grep -Eq "rank 3: (hanging|exiting) at step 1" "$tmp/err" || fail "rank 3 did not reach step 1 within 60 s"
if [ "$mode" = hang ]; then
  victim=
  for p in $(pgrep -P "$launcher"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "MPT_RANK=3"; then victim=$p; fi
  done
  [ -n "$victim" ] || fail "no worker with MPT_RANK=3"
  kill -KILL "$victim"
fi
killed=$(ms)
wait "$launcher"; code=$?
took=$(( $(ms) - killed ))
[ "$code" = 3 ] || fail "exit code $code, expected 3"
grep -Eq "rank 3 of 4 failed: (killed by signal 9|exit code 86)" "$tmp/err" || fail "the launcher does not name rank 3"
[ "$took" -le $(( (timeout_s + 25) * 1000 )) ] || fail "took ${took} ms after the kill for a ${timeout_s} s timeout"
for r in 0 1 2; do
  line=$(grep -E "^\[error\] mpt $exp \(rank $r of 4\): " "$tmp/err" | head -1)
  [ -n "$line" ] || fail "rank $r printed no error of its own"
  # Blamed: a list of ranks before "did not answer", "is late", "are late", or after "the cause is";
  # a list before "did not arrive within ..." followed at once by the ranks' states (its own blame).
  other='(rank ([0-9]+, )*[0-2](, [0-9]+)* (did not answer|is late|are late)|the cause is rank ([0-9]+, )*[0-2]\b|rank ([0-9]+, )*[0-2](, [0-9]+)* did not arrive within [0-9.]+ s of the last sign of progress \(heartbeat\); rank |rank [0-2]: its heartbeat stopped)'
  if echo "$line" | grep -Eq "$other"; then fail "rank $r blames a rank other than 3: $line"; fi
  echo "$line" | grep -Eq "rank 3 (did not answer|is late|did not arrive)|the cause is rank 3\b|cannot tell" \
    || fail "rank $r neither names rank 3 nor says it cannot tell: $line"
done
[ ! -e "$tmp/result.json" ] || fail "a result file was written"
sleep 0.3
left=$(pgrep -f -- "$tmp")
[ -z "$left" ] || fail "processes left behind: $(ps -o pid=,args= -p "$(echo $left | tr ' ' ,)")"
grep -E "^\[error\]" "$tmp/err"
echo "ok: rank 3 killed; ranks 0, 1, 2 and the launcher name it or cannot tell; mpt exited 3 ${took} ms after the kill"
