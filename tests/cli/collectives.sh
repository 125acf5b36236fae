#!/usr/bin/env bash
# Cases of `mpt collectives` that look into the result document (configs/collectives_quick.json:
# 8 B .. 64 KiB, x4, 2 timed iterations after 1 warm-up):
#   collectives.sh MPT pass       2 processes: every op has its rows, #wrong 0 everywhere, the checks
#                                 pass; size, count and busbw follow nccl-tests' definitions
#   collectives.sh MPT three      3 processes (chunks of n = 3, odd ring): the same
#   collectives.sh MPT corrupt    rank 0 corrupts the first element it sends (check.corrupt_rank=0):
#                                 exit 1, the result is written, every op counts wrong elements
#   collectives.sh MPT torchrun   two ranks started by hand with torchrun's variables: both exit 0,
#                                 rank 0 alone prints and writes the result
#   collectives.sh MPT bfloat16   bfloat16 with redop max: passes on LibTorch 2.x; on 1.13 (whose Gloo has no
#                                 bfloat16) exit 2 naming /dtype, before any worker
#   collectives.sh MPT plot       scripts/plot.py draws busbw and time against size as PNGs (77: no matplotlib)
set -u
mpt=$1 mode=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
quick=(collectives --config configs/collectives_quick.json)

# check RESULT.json NPROC EXPECT: asserts on the result document (EXPECT: ok | corrupt).
check() {
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
path, n, expect = sys.argv[1], int(sys.argv[2]), sys.argv[3]
doc = json.load(open(path))
res, tim, cfg = doc["results"], doc["timings"], doc["config"]
factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
          "alltoall": (n - 1) / n, "broadcast": 1.0, "sendrecv": 1.0}
elem = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}[cfg["dtype"]]
sizes = res["schedule_bytes"]
assert sizes[0] == cfg["min_bytes"] and all(b == a * cfg["step_factor"] for a, b in zip(sizes, sizes[1:])), sizes
assert doc["env"]["collectives"]["ranks"] == n, doc["env"]["collectives"]
for op in cfg["ops"]:
    det, timed = res[op], tim[op]
    assert len(det) == len(timed) > 0, op
    for d, t in zip(det, timed):
        for k, v in d.items():
            assert t[k] == v, (op, k, t[k], v)  # the timings rows repeat the deterministic columns
        chunked = op in ("all_gather", "reduce_scatter", "alltoall")
        assert d["size"] == (n if chunked else 1) * d["count"] * elem, (op, d)
        assert abs(t["algbw_gbps"] - d["size"] / 1e9 / (t["time_us"] * 1e-6)) <= 1e-9 * t["algbw_gbps"], (op, t)
        assert abs(t["busbw_gbps"] - t["algbw_gbps"] * factor[op]) <= 1e-12 + 1e-9 * t["busbw_gbps"], (op, t)
        assert t["time_us"] > 0, (op, t)
    wrong = sum(d["wrong"] for d in det)
    if expect == "ok":
        assert wrong == 0, (op, [d["wrong"] for d in det])
    else:
        assert all(d["wrong"] > 0 for d in det), (op, [d["wrong"] for d in det])
    assert op in tim["avg_busbw_gbps"], op
checks = {c["name"].split(":")[0]: c for c in doc["checks"]}
assert set(checks) == set(cfg["ops"]), checks
assert all(c["ok"] == (expect == "ok") for c in checks.values()), checks
print(f"ok: {len(cfg['ops'])} ops x {len(sizes)} sizes on {n} ranks, #wrong " +
      ("0 everywhere" if expect == "ok" else "> 0 in every row"))
PY
}

run_ok() {  # run_ok ARGS...: the quick config with ARGS must exit 0
  "$mpt" "${quick[@]}" "$@" --out "$tmp/r.json" > "$tmp/out" 2> "$tmp/err"
  local code=$?
  [ $code = 0 ] || { cat "$tmp/out" "$tmp/err"; echo "FAIL: exit $code"; exit 1; }
}

case $mode in
  pass)
    run_ok --nproc 2
    grep -Eq '^# Avg bus bandwidth +: [0-9.e+-]+ GB/s' "$tmp/out" || { cat "$tmp/out"; echo "FAIL: no footer"; exit 1; }
    check "$tmp/r.json" 2 ok ;;
  three)
    run_ok --nproc 3
    check "$tmp/r.json" 3 ok ;;
  corrupt)
    "$mpt" "${quick[@]}" --nproc 2 --set check.corrupt_rank=0 --out "$tmp/r.json" > "$tmp/out" 2> "$tmp/err"
    code=$?
    cat "$tmp/err"
    [ $code = 1 ] || { cat "$tmp/out"; echo "FAIL: exit $code, expected 1"; exit 1; }
    grep -q "check failed: all_reduce: #wrong elements" "$tmp/err" || { echo "FAIL: no failed check named"; exit 1; }
    grep -Eq '^# Out of bounds values : [1-9][0-9]* FAILED' "$tmp/out" || { cat "$tmp/out"; echo "FAIL: footer"; exit 1; }
    check "$tmp/r.json" 2 corrupt ;;
  torchrun)
    port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    pids=()
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$mpt" "${quick[@]}" --out "$tmp/r$r.json" > "$tmp/out$r" 2> "$tmp/err$r" &
      pids[$r]=$!
    done
    wait "${pids[0]}"; c0=$?; wait "${pids[1]}"; c1=$?
    cat "$tmp/err0" "$tmp/err1"
    [ $c0 = 0 ] && [ $c1 = 0 ] || { echo "FAIL: exit codes $c0 $c1"; exit 1; }
    [ ! -f "$tmp/r1.json" ] || { echo "FAIL: rank 1 wrote a result"; exit 1; }
    [ ! -s "$tmp/out1" ] || { echo "FAIL: rank 1 printed on stdout"; exit 1; }
    grep -q '^# sendrecv: 2 ranks' "$tmp/out0" || { cat "$tmp/out0"; echo "FAIL: rank 0 printed no sendrecv table"; exit 1; }
    check "$tmp/r0.json" 2 ok ;;
  bfloat16)
    if "$mpt" --version | grep -q 'LibTorch 1\.'; then
      "$mpt" "${quick[@]}" --set dtype=bfloat16 --out "$tmp/r.json" > "$tmp/out" 2> "$tmp/err"
      code=$?
      cat "$tmp/err"
      [ $code = 2 ] && grep -q '/dtype: expected float32, float64 or float16 on the CPU' "$tmp/err" && [ ! -e "$tmp/r.json" ] \
        || { echo "FAIL: exit $code, expected 2 naming /dtype"; exit 1; }
      echo "ok: LibTorch 1.x refuses bfloat16 on Gloo (exit 2)"
    else
      run_ok --nproc 2 --set dtype=bfloat16 --set redop=max
      check "$tmp/r.json" 2 ok
    fi ;;
  plot)
    /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || { echo "SKIPPED: python3-matplotlib missing"; exit 77; }
    run_ok --nproc 2
    /usr/bin/python3 scripts/plot.py "$tmp/r.json" --out-dir "$tmp/plots" > "$tmp/list" || { echo "FAIL: plot.py"; exit 1; }
    for p in busbw time; do
      f="$tmp/plots/r_$p.png"
      grep -qx "$f" "$tmp/list" && head -c 8 "$f" | od -An -c | grep -q 'P   N   G' || { cat "$tmp/list"; echo "FAIL: no PNG $f"; exit 1; }
    done
    echo "ok: $(wc -l < "$tmp/list") plots"
    # One rank: all_reduce's busbw is 0 (factor 2(n-1)/n), which a log axis cannot draw. The busbw
    # plot is not made and stderr says why; with broadcast beside it the legend says so instead.
    run_ok --nproc 1 --set 'ops=["all_reduce"]'
    rm -rf "$tmp/plots"
    /usr/bin/python3 scripts/plot.py "$tmp/r.json" --out-dir "$tmp/plots" > "$tmp/list" 2> "$tmp/plot.err" \
      || { echo "FAIL: plot.py, one rank"; exit 1; }
    grep -q "no busbw plot: every busbw_gbps is 0 or less (1 rank" "$tmp/plot.err" && [ ! -e "$tmp/plots/r_busbw.png" ] \
      && grep -qx "$tmp/plots/r_time.png" "$tmp/list" \
      || { echo "FAIL: one rank: expected the time plot only and a note on stderr, got $(cat "$tmp/list") / $(cat "$tmp/plot.err")"; exit 1; }
    echo "ok: one rank: no busbw plot, said on stderr" ;;
  *) echo "collectives.sh: unknown mode $mode"; exit 2 ;;
esac
