#!/usr/bin/env bash
# Launcher-environment cases of the multi-process experiments (cases cli_case cannot express):
#   launcher_env.sh MPT dataparallel   two ranks of `mpt dataparallel` started by hand with torchrun's
#                                      variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
#   launcher_env.sh MPT pipeline       the same for `mpt pipeline`, one process per stage
#   launcher_env.sh MPT shard          the same for `mpt shard` (ZeRO stages 0-3 on 2 ranks)
#   launcher_env.sh MPT tensorparallel the same for `mpt tensorparallel` (a TP group of t = 2)
#   launcher_env.sh MPT contextparallel the same for `mpt contextparallel` (the sequence over c = 2)
#   launcher_env.sh MPT expertparallel the same for `mpt expertparallel` (the experts over e = 2)
#   launcher_env.sh MPT unreachable    rank 1 of 2 with a master nobody listens on: a clear error
#                                      (exit 3) within the timeout, not a hang
#   launcher_env.sh MPT garbage        rank 1 of 2 whose MASTER_PORT answers random bytes (at once, or
#                                      to each request): exit 3 naming the address, no abort (134)
#   launcher_env.sh MPT world_cap      WORLD_SIZE=1000000: exit 2 naming WORLD_SIZE and the cap, at once
#   launcher_env.sh MPT missing_ranks  rank 0 of 4 alone: exit 3 naming ranks 1-3 within the timeout
#   launcher_env.sh MPT nproc_conflict WORLD_SIZE=1 with an explicit --nproc 2: exit 2 naming both
#   launcher_env.sh MPT mismatch       two ranks of `mpt shard` started with different --set, then
#                                      three processes of which two claim rank 1: the rank that differs
#                                      from rank 0 (and the second rank 1) exits 2 naming the key / the
#                                      rank, at once (they were collective timeouts that blamed the peer)
# With two ranks: both exit 0, rank 0 prints and writes the result, rank 1 writes nothing and
# prints nothing on stdout, and rank 0's output has the row that only the 2-rank run produces.
set -u
mpt=$1 mode=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dataparallel=(dataparallel --config configs/dataparallel_quick.json --set train.nosync_steps=0 --set dist.timeout_s=10)
shard=(shard --config configs/shard_quick.json --set dist.timeout_s=10)
tensorparallel=(tensorparallel --config configs/tensorparallel_quick.json --set dist.timeout_s=10)
contextparallel=(contextparallel --config configs/contextparallel_quick.json --set dist.timeout_s=10)
expertparallel=(expertparallel --config configs/expertparallel_quick.json --set dist.timeout_s=10)
pipeline=(pipeline --set executor=processes --set pipeline.stages=2 --set cost.forward_us=50
          --set "pipeline.microbatches=[1,4]" --set pipeline.steps=1 --set pipeline.timeout_s=20)

two_ranks() {  # two_ranks REGEX MPT_ARGS...: both ranks run; REGEX must match rank 0's stdout
  local regex=$1; shift
  local pids=() r c0 c1
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$mpt" "$@" --out "$tmp/r$r.json" > "$tmp/out$r" 2> "$tmp/err$r" &
    pids[$r]=$!
  done
  wait "${pids[0]}"; c0=$?; wait "${pids[1]}"; c1=$?
  cat "$tmp/out0" "$tmp/err0" "$tmp/err1"
  [ $c0 = 0 ] && [ $c1 = 0 ] || { echo "FAIL: exit codes $c0 $c1"; exit 1; }
  [ -f "$tmp/r0.json" ] || { echo "FAIL: rank 0 wrote no result"; exit 1; }
  [ ! -f "$tmp/r1.json" ] || { echo "FAIL: rank 1 wrote a result"; exit 1; }
  [ ! -s "$tmp/out1" ] || { echo "FAIL: rank 1 printed on stdout"; exit 1; }
  grep -Eq "$regex" "$tmp/out0" || { echo "FAIL: rank 0's output has no match for: $regex"; exit 1; }
  echo "ok: torchrun-style launch of 2 ranks ($1)"
}

# expect CODE MESSAGE MAX_S WHAT -- VAR=VALUE... -- MPT_ARGS...: runs mpt as one rank with the launcher
# variables given; passes when it exits CODE within MAX_S seconds and stderr holds MESSAGE (fixed string).
expect() {
  local want=$1 msg=$2 max=$3 what=$4; shift 5
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local start; start=$(date +%s)
  env "${envs[@]}" timeout 60 "$mpt" "$@" --out "$tmp/r.json" > "$tmp/out" 2> "$tmp/err"
  local code=$? took=$(( $(date +%s) - start ))
  cat "$tmp/err"
  [ $code = "$want" ] || { echo "FAIL: exit code $code, expected $want"; exit 1; }
  grep -qF -- "$msg" "$tmp/err" || { echo "FAIL: the message does not say: $msg"; exit 1; }
  [ $took -le "$max" ] || { echo "FAIL: took $took s (at most $max s expected)"; exit 1; }
  echo "ok: $what in $took s"
}

case $mode in
  dataparallel) two_ranks '^ +n2 ' "${dataparallel[@]}" ;;
  shard) two_ranks 'stage3: parameters equal DDP.s bitwise, every step \(N = 2\) +0 <= 0 +OK' "${shard[@]}" ;;
  tensorparallel) two_ranks 'OK: 15 of 15 checks passed' "${tensorparallel[@]}" ;;
  contextparallel) two_ranks 'OK: 24 of 24 checks passed' "${contextparallel[@]}" ;;
  expertparallel) two_ranks 'OK: 32 of 32 checks passed' "${expertparallel[@]}" ;;
  pipeline) two_ranks '1f1b\.m4: processes gradient == threads gradient \(bitwise\) +0 <= 0 +OK' "${pipeline[@]}" ;;
  unreachable)
    expect 3 "cannot reach the TCPStore at 127.0.0.1:$port within 3 s" 20 "unreachable master reported" \
      -- RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- "${dataparallel[@]}" --set dist.timeout_s=3 ;;
  garbage)
    cat > "$tmp/garbage.py" <<'PY'
import os, socket, sys, threading
first = sys.argv[1] == "first"  # speak first (at accept), else only answer what is sent
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
def serve(c):
    try:
        if first: c.sendall(os.urandom(100000))
        while c.recv(4096): c.sendall(os.urandom(4096))
    except OSError: pass
    finally: c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
    for how in first reply; do
      /usr/bin/python3 "$tmp/garbage.py" $how > "$tmp/gport" & gpid=$!
      for i in $(seq 50); do [ -s "$tmp/gport" ] && break; sleep 0.1; done
      gport=$(cat "$tmp/gport")
      start=$(date +%s)
      RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$gport timeout 60 \
        "$mpt" "${dataparallel[@]}" --set dist.timeout_s=3 --out "$tmp/r.json" > "$tmp/out" 2> "$tmp/err"
      code=$?; took=$(( $(date +%s) - start ))
      kill $gpid; wait $gpid 2>/dev/null
      cat "$tmp/err"
      [ $code = 3 ] || { echo "FAIL ($how): exit code $code, expected 3"; exit 1; }
      grep -q "127.0.0.1:$gport" "$tmp/err" || { echo "FAIL ($how): the message does not name 127.0.0.1:$gport"; exit 1; }
      [ $took -le 20 ] || { echo "FAIL ($how): took $took s for a 3 s timeout"; exit 1; }
      echo "ok ($how): a master port answering random bytes gives exit 3 in $took s"
    done ;;
  world_cap)
    start=$(date +%s)
    RANK=0 WORLD_SIZE=1000000 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 \
      "$mpt" "${dataparallel[@]}" --set dist.timeout_s=3 --out "$tmp/r.json" > "$tmp/out" 2> "$tmp/err"
    code=$?; took=$(( $(date +%s) - start ))
    cat "$tmp/err"
    [ $code = 2 ] || { echo "FAIL: exit code $code, expected 2"; exit 1; }
    grep -q "WORLD_SIZE=1000000 (torchrun environment): expected at most 64 processes" "$tmp/err" \
      || { echo "FAIL: message"; exit 1; }
    [ $took -le 10 ] || { echo "FAIL: took $took s"; exit 1; }
    [ ! -e "$tmp/r.json" ] || { echo "FAIL: a result was written"; exit 1; }
    echo "ok: WORLD_SIZE capped (exit 2 in $took s)" ;;
  missing_ranks)
    expect 3 "rank 1, 2, 3 did not arrive within 2 s" 15 "ranks that never come are named" \
      -- RANK=0 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- "${dataparallel[@]}" --set dist.timeout_s=2 ;;
  nproc_conflict)
    WORLD_SIZE=1 RANK=0 timeout 60 "$mpt" "${dataparallel[@]}" --nproc 2 --out "$tmp/r.json" > "$tmp/out" 2> "$tmp/err"
    code=$?
    cat "$tmp/err"
    [ $code = 2 ] || { echo "FAIL: exit code $code, expected 2"; exit 1; }
    grep -q -- "--nproc 2: expected the world size of the torchrun environment (WORLD_SIZE=1)" "$tmp/err" \
      || { echo "FAIL: message"; exit 1; }
    echo "ok: --nproc against WORLD_SIZE is an error" ;;
  mismatch)
    # Both sub-cases end by the launch check's verdict, not by a timeout: the timeout only has to
    # cover the start of a process on a loaded machine (rank 0 waits there for the others).
    quick=("${shard[@]}" --set dist.timeout_s=20)
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$mpt" "${quick[@]}" --out "$tmp/r0.json" \
      > "$tmp/out0" 2> "$tmp/err0" & p0=$!
    start=$(date +%s)
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$mpt" "${quick[@]}" --set train.steps=7 \
      --out "$tmp/r1.json" > "$tmp/out1" 2> "$tmp/err1"
    code=$?; took=$(( $(date +%s) - start ))
    wait $p0; c0=$?
    cat "$tmp/err1" "$tmp/err0"
    [ $code = 2 ] || { echo "FAIL: rank 1 exited $code, expected 2"; exit 1; }
    grep -qF "rank 1 of 2: this process runs another job than rank 0: /config/train/steps is 7 here, 4 on rank 0" \
      "$tmp/err1" || { echo "FAIL: rank 1 does not name the key that differs"; exit 1; }
    [ $took -le 10 ] || { echo "FAIL: rank 1 took $took s"; exit 1; }
    # Rank 0 must not run into its first collective and blame its peer as dead or stopped: it
    # stops at the launch check too, with rank 1's reason.
    [ $c0 = 2 ] || { echo "FAIL: rank 0 exited $c0, expected 2"; exit 1; }
    grep -qF "rank 0 of 2: another rank was started for another job, so this one stops: rank 1 of 2: this process runs another job than rank 0: /config/train/steps is 7 here, 4 on rank 0" \
      "$tmp/err0" || { echo "FAIL: rank 0 does not name rank 1's difference"; exit 1; }
    [ ! -e "$tmp/r0.json" ] && [ ! -e "$tmp/r1.json" ] || { echo "FAIL: a result was written"; exit 1; }
    echo "ok: the config that differs from rank 0's is named on both ranks (exit 2 in $took s)"
    # Two processes started as rank 1: the later one is refused; the job of the other two runs.
    port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    pids=()
    for i in 0 1 2; do
      r=$(( i == 0 ? 0 : 1 ))
      RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$mpt" "${quick[@]}" \
        --out "$tmp/d$i.json" > "$tmp/dout$i" 2> "$tmp/derr$i" & pids[$i]=$!
      [ $i = 0 ] && sleep 0.5  # rank 0 hosts the store
    done
    codes=""
    for i in 0 1 2; do wait "${pids[$i]}"; codes="$codes $?"; done
    cat "$tmp"/derr*
    [ "$(grep -lF "rank 1 of 2: another process already joined this job as rank 1" "$tmp"/derr1 "$tmp"/derr2 | wc -l)" = 1 ] \
      || { echo "FAIL: not exactly one rank 1 refused (exit codes$codes)"; exit 1; }
    case "$codes" in " 0 0 2"|" 0 2 0") ;; *) echo "FAIL: exit codes$codes, expected 0 and one 2 among the ranks 1"; exit 1 ;; esac
    echo "ok: a second process started as rank 1 is refused (exit codes$codes)" ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
