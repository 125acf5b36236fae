#!/usr/bin/env bash
# `mpt pipeline` with one process per stage under a launcher's environment: two ranks started
# by hand with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
# Rank 0 prints and writes the result; rank 1 runs stage 1 and writes nothing.
set -u
mpt=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
run=(pipeline --set executor=processes --set pipeline.stages=2 --set cost.forward_us=50
     --set "pipeline.microbatches=[1,4]" --set pipeline.steps=1 --set pipeline.timeout_s=20)
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$mpt" "${run[@]}" --out "$tmp/r$r.json" > "$tmp/out$r" 2> "$tmp/err$r" &
  pids[$r]=$!
done
wait ${pids[0]}; c0=$?; wait ${pids[1]}; c1=$?
cat "$tmp/out0" "$tmp/err0" "$tmp/err1"
[ $c0 = 0 ] && [ $c1 = 0 ] || { echo "FAIL: exit codes $c0 $c1"; exit 1; }
[ -f "$tmp/r0.json" ] || { echo "FAIL: rank 0 wrote no result"; exit 1; }
[ ! -f "$tmp/r1.json" ] || { echo "FAIL: rank 1 wrote a result"; exit 1; }
[ ! -s "$tmp/out1" ] || { echo "FAIL: rank 1 printed on stdout"; exit 1; }
grep -Eq '1f1b\.m4: processes gradient == threads gradient \(bitwise\) +0 <= 0 +OK' "$tmp/out0" \
  || { echo "FAIL: no processes-vs-threads check"; exit 1; }
echo "ok: torchrun-style launch of 2 stage processes"
