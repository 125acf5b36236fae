#!/usr/bin/env bash
# Two "nodes" x two processes (issue 19, multi-node): two network namespaces joined by a veth pair,
# node 0 at 10.77.0.1, node 1 at 10.77.0.2, each with its own hostname (node0, node1) and its own
# torchrun agent, MASTER_ADDR = node 0's veth address as torchrun sets it across hosts:
#   torchrun --nnodes 2 --nproc_per_node 2 --node_rank I --master_addr 10.77.0.1 --master_port 29500
#            --no_python mpt EXPERIMENT ...
# (torchrun is `PYTHON -m torch.distributed.run`: the wheel's on the default route, Debian's
# python3-torch 1.13 on the Debian route; the underscore spellings are the ones both accept.)
# Node 0 names its interface with GLOO_SOCKET_IFNAME=veth0 (as PyTorch users do); node 1 does not:
# its Gloo binds the address of its route to the master (core/dist route_source_address), not the
# 127.0.0.1 that its hostname would give.
#   multinode.sh MPT PYTHON shard|dataparallel  the 4-rank two-node run's `results` and `checks` equal
#                  a one-node `--nproc 4` run of the same config bitwise (tests/parity/compare.py, and
#                  key for key); its env.launch names 2 nodes, ranks 0-1 on node0 and 2-3 on node1
#   multinode.sh MPT PYTHON fault  rank 3 (node 1) exits at step 1: every rank on both nodes exits
#                  non-zero within the timeout + a bound, rank 0's error names rank 3, both agents
#                  exit non-zero, no result is written
# Every case: no process is left behind (checked inside the namespaces before they are torn down,
# and outside with pgrep on the run's scratch path). The namespaces live in a PID namespace whose
# init is the script below: when it ends (or `timeout` kills unshare, --kill-child), the kernel
# kills everything in it. Skipped (exit 77) naming the step where namespaces or veth cannot be made
# or torchrun is missing.
set -u
mpt=$(readlink -f "$1") py=$2 mode=$3
tmp=$(mktemp -d /tmp/mpt-nodes.XXXXXX)
cleanup() { for p in $(pgrep -f -- "$tmp"); do kill -KILL "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; for f in "$tmp"/node*.log; do [ -f "$f" ] && { echo "--- $f"; grep -v -e "^    " "$f" | tail -30; }; done; exit 1; }
export PATH="$PATH:/usr/sbin:/sbin"

# Preflight: each tool, then a user + network namespace, then a veth pair in it.
command -v unshare > /dev/null || skip "unshare (util-linux) not found"
command -v nsenter > /dev/null || skip "nsenter (util-linux) not found"
command -v ip > /dev/null || skip "ip (iproute2) not found: apt-get install iproute2"
# torch/distributed/run.py is there (found without importing torch: that alone costs seconds of CPU)
"$py" -c 'import importlib.util as u, os, sys; t = u.find_spec("torch")
sys.exit(not (t and os.path.isfile(os.path.join(t.submodule_search_locations[0], "distributed", "run.py"))))' 2> /dev/null \
  || skip "torchrun not found: $py has no torch.distributed.run"
# Debian's torchrun (torch 1.13 on Python 3.11) fails before it starts a worker ("AttributeError:
# 'NoneType' object has no attribute 'get'" in elastic/multiprocessing/api.py's to_map: its Std
# lookup returns None there). Then each node's ranks are started by hand with the variables
# torchrun's agent sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
# MASTER_PORT; rank 0 hosts the TCPStore, as under SLURM): the same multi-node path through mpt.
launcher=torchrun
if grep -q "^__version__ = '1\." "$(dirname "$("$py" -c 'import importlib.util as u; print(u.find_spec("torch").origin)')")/version.py" 2> /dev/null \
   && ! why=$(cd "$tmp" && timeout 60 "$py" -m torch.distributed.run --nproc_per_node 1 --no_python true 2>&1); then
  launcher=env
  echo "note: $py -m torch.distributed.run fails here ($(echo "$why" | tail -1)): each node's ranks get torchrun's variables by hand"
fi
why=$(unshare -rmnupf --kill-child --mount-proc true 2>&1) || skip "unshare -rmnupf (user, mount, net, UTS, PID namespaces) failed: $why"
why=$(unshare -rn ip link add veth0 type veth peer name veth1 2>&1) || skip "ip link add ... type veth in a network namespace failed: $why"

case $mode in
  shard) args=(shard --config configs/shard_quick.json --set train.global_batch=32 --set train.samples=64
               --set train.steps=2) ;;
  dataparallel) args=(dataparallel --config configs/dataparallel_quick.json --set "train.nprocs=[1,2,4]"
                      --set train.max_steps=2) ;;
  fault) args=(shard --config configs/shard_quick.json --set train.global_batch=32 --set train.samples=64
               --set train.steps=2 --set fault.rank=3 --set fault.step=1) ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
# One thread per rank in both runs: the thread count must not differ between them (torchrun sets
# OMP_NUM_THREADS=1; mpt --nproc 4 shares the cores out).
timeout_s=3
args+=(--set threads=1 --set dist.timeout_s=$timeout_s)

# Each rank runs through a wrapper that records its exit code and when it ended (rc.RANK), so the
# test sees every rank's end, not only the agents'. A SIGTERM from the agent is passed on.
cat > "$tmp/rank.sh" <<'SH'
#!/usr/bin/env bash
"$@" & child=$!
trap 'kill -TERM $child 2>/dev/null' TERM
while :; do wait $child; rc=$?; kill -0 $child 2> /dev/null || break; done  # a trapped TERM ends a wait early
wait $child 2> /dev/null; r=$?; [ $r = 127 ] || rc=$r                        # the child's own status
echo "$rc $(date +%s%N)" > "$MPT_NODES_TMP/rc.$RANK"
exit $rc
SH
chmod +x "$tmp/rank.sh"

# One node's torchrun agent: agent.sh NODE_RANK COMMAND...
cat > "$tmp/agent.sh" <<'SH'
node=$1; shift
if [ "$MPT_NODES_LAUNCHER" = env ]; then  # torchrun's variables by hand; exit: the first failure
  for l in 0 1; do
    RANK=$((2 * node + l)) WORLD_SIZE=4 LOCAL_RANK=$l LOCAL_WORLD_SIZE=2 GROUP_RANK=$node MASTER_ADDR=10.77.0.1 \
      MASTER_PORT=29500 "$MPT_NODES_TMP/rank.sh" "$@" & pids[$l]=$!
  done
  wait ${pids[0]}; c0=$?; wait ${pids[1]}; c1=$?
  [ $c0 != 0 ] && exit $c0; exit $c1
fi
exec "$PYTHON" -m torch.distributed.run --nnodes 2 --nproc_per_node 2 --node_rank $node --master_addr 10.77.0.1 \
  --master_port 29500 --monitor_interval 0.2 --no_python "$MPT_NODES_TMP/rank.sh" "$@"
SH

# The two nodes. Runs as PID 1 of the new PID namespace, root of the new user namespace.
cat > "$tmp/nodes.sh" <<'SH'
set -u
tmp=$1; shift
step() { echo "STEP: $*" > "$tmp/step"; }
hostname node0 && ip link set lo up || { step "hostname/lo in node 0's namespaces"; exit 77; }
unshare -nu sleep 600 & holder=$!   # node 1's network and UTS namespaces
for i in $(seq 100); do
  [ "$(readlink /proc/$holder/ns/net)" != "$(readlink /proc/self/ns/net)" ] && break; sleep 0.01
done
ip link add veth0 type veth peer name veth1 || { step "ip link add veth0 type veth peer name veth1"; exit 77; }
ip link set veth1 netns $holder || { step "ip link set veth1 netns (node 1)"; exit 77; }
ip addr add 10.77.0.1/24 dev veth0 && ip link set veth0 up || { step "ip addr/link on veth0"; exit 77; }
nsenter -t $holder -n -u sh -c 'hostname node1 && ip link set lo up && ip addr add 10.77.0.2/24 dev veth1 &&
  ip link set veth1 up' || { step "nsenter into node 1: hostname, lo, veth1"; exit 77; }
export MPT_NODES_TMP=$tmp
date +%s%N > "$tmp/start"
GLOO_SOCKET_IFNAME=veth0 bash "$tmp/agent.sh" 0 "$@" > "$tmp/node0.log" 2>&1 & a0=$!
nsenter -t $holder -n -u bash "$tmp/agent.sh" 1 "$@" > "$tmp/node1.log" 2>&1 & a1=$!
wait $a0; c0=$?; wait $a1; c1=$?
date +%s%N > "$tmp/end"
echo "$c0 $c1" > "$tmp/agents"
# Before the namespaces go: is any process of the run still there?
sleep 0.3
ps -eo pid=,args= | grep -v -e "sleep 600" -e "ps -eo" -e grep -e "nodes.sh" | grep -F -- "$tmp" > "$tmp/left"
kill $holder
exit 0
SH

start=$(date +%s)
MPT_NODES_LAUNCHER=$launcher PYTHON=$py timeout -s KILL 90 unshare -rmnupf --kill-child --mount-proc bash "$tmp/nodes.sh" "$tmp" \
  "$mpt" "${args[@]}" --out "$tmp/two.json"
code=$?
took=$(( $(date +%s) - start ))
[ $code = 77 ] && skip "$(cat "$tmp/step" 2>/dev/null)"
[ $code = 0 ] || fail "the namespace script ended with $code after $took s"
read -r c0 c1 < "$tmp/agents"
[ -s "$tmp/left" ] && fail "processes left in the namespaces after both agents ended: $(cat "$tmp/left")"
ran_ms=$(( ($(cat "$tmp/end") - $(cat "$tmp/start")) / 1000000 ))
echo "two nodes ($launcher): node launchers exited $c0 and $c1 after $ran_ms ms"

if [ "$mode" = fault ]; then
  [ "$c0" != 0 ] && [ "$c1" != 0 ] || fail "the node launchers ($launcher) exited $c0 (node 0) and $c1 (node 1): expected both non-zero"
  t0=$(cat "$tmp/start")
  for r in 0 1 2 3; do
    [ -f "$tmp/rc.$r" ] || fail "rank $r left no exit code (killed without its wrapper seeing it end?)"
    read -r rc t < "$tmp/rc.$r"
    echo "rank $r: exit $rc after $(( (t - t0) / 1000000 )) ms"
    [ "$rc" != 0 ] || fail "rank $r exited 0"
  done
  read -r rc3 t3 < "$tmp/rc.3"
  [ "$rc3" = 86 ] || fail "rank 3 exited $rc3, expected 86 (the injected fault)"
  # Bound on each rank's end after rank 3's: the collective timeout (3 s) + the wait for the
  # peers' failure reports (1 s: max(1, 0.25 x timeout), core/dist/group's monitor window) + 2 s
  # for LibTorch's teardown and the agent's SIGTERM on a loaded 2-core machine.
  for r in 0 1 2; do
    read -r _ t < "$tmp/rc.$r"
    [ $(( (t - t3) / 1000000 )) -le $(( (timeout_s + 1 + 2) * 1000 )) ] \
      || fail "rank $r ended $(( (t - t3) / 1000000 )) ms after rank 3 (bound $(( timeout_s + 3 )) s)"
  done
  # Node 0's ranks (a remote node's failure) name rank 3 among the ranks that did not answer. Without
  # torchrun's agent (env) rank 0 hosts the store and may exit before rank 1 reads it ("cannot tell
  # which rank (the store did not answer)"); rank 0 names rank 3 (and maybe rank 1, gone too) then.
  # Under torchrun the agent ends a node's other ranks (SIGTERM: exit 143) as soon as one of them
  # exits: a rank it stopped before its own report says nothing (CI, stop 31: rank 0 reported at
  # 5.3 s, the agent stopped rank 1 at 5.4 s, within rank 1's 1 s wait for the peers' reports).
  # Every rank of node 0 that ended on its own names rank 3, and at least one does.
  named=(0 1); [ "$launcher" = env ] && named=(0)
  said=0
  for r in "${named[@]}"; do
    read -r rc _ < "$tmp/rc.$r"
    if [ "$launcher" = torchrun ] && [ "$rc" = 143 ]; then echo "rank $r: stopped by the torchrun agent"; continue; fi
    grep -E "failed on rank $r of 4: .*rank ([0-9], )*3(, [0-9])* did not answer" "$tmp/node0.log" > "$tmp/named" \
      || fail "rank $r's error does not name rank 3"
    sed 's/: \[.*GLHF[^;]*;/: [...];/' "$tmp/named" | head -1
    said=$((said + 1))
  done
  [ "$said" -ge 1 ] || fail "no rank of node 0 named rank 3 (each was stopped by the agent)"
  [ ! -e "$tmp/two.json" ] || fail "a result file was written"
else
  [ "$c0" = 0 ] && [ "$c1" = 0 ] || fail "the node launchers ($launcher) exited $c0 (node 0) and $c1 (node 1)"
  [ -f "$tmp/two.json" ] || fail "the two-node run wrote no result"
  "$mpt" "${args[@]}" --nproc 4 -q --out "$tmp/one.json" > "$tmp/one.log" 2>&1 || { cat "$tmp/one.log"; fail "the one-node --nproc 4 run failed"; }
  /usr/bin/python3 -c 'import json,sys; json.dump(json.load(open(sys.argv[1]))["results"], open(sys.argv[2], "w"))' \
    "$tmp/one.json" "$tmp/one.results.json"
  # compare.py (the parity tests' bitwise comparison) with the one-node run's results as the reference
  /usr/bin/python3 tests/parity/compare.py "$tmp/two.json" "$tmp/one.results.json" > "$tmp/compare" 2>&1; cmp=$?
  sed 's/the PyTorch-Python reference/the one-node run/; s/from PyTorch-Python/from the one-node run/' "$tmp/compare"
  [ $cmp = 0 ] || fail "results differ between two nodes and one node"
  /usr/bin/python3 - "$tmp/two.json" "$tmp/one.json" <<'PY' || fail "env or checks"
import json, sys
two, one = (json.load(open(p)) for p in sys.argv[1:])
assert two["results"] == one["results"], "results differ (keys or values)"
assert two["checks"] == one["checks"], "checks differ"
assert all(c["ok"] for c in two["checks"]) if isinstance(two["checks"], list) else True
l2, l1 = two["env"]["launch"], one["env"]["launch"]
assert l2["launcher"] == "torchrun" and l2["world_size"] == 4 and l2["nodes"] == 2, l2
assert l2["master_addr"] == "10.77.0.1", l2
where = [(r["rank"], r["host"], r["node_rank"], r["local_rank"], r["local_world_size"]) for r in l2["ranks"]]
assert where == [(0, "node0", 0, 0, 2), (1, "node0", 0, 1, 2), (2, "node1", 1, 0, 2), (3, "node1", 1, 1, 2)], where
assert l1["launcher"] == "mpt" and l1["nodes"] == 1 and [r["local_world_size"] for r in l1["ranks"]] == [4] * 4, l1
assert two["env"]["threads_policy"]["local_processes"] == 2, two["env"]["threads_policy"]
print(f"ok: two nodes x 2 ranks == one node x 4 ranks ({len(json.dumps(two['results']))} bytes of results, "
      f"{len(two['checks'])} checks); env.launch: {where}")
PY
fi
sleep 0.2
left=$(pgrep -f -- "$tmp")
[ -z "$left" ] || fail "processes left behind: $(ps -o pid=,args= -p "$(echo $left | tr ' ' ,)")"
echo "ok: $mode across two nodes in $took s, no process left"
