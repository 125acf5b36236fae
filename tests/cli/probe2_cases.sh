#!/usr/bin/env bash
# Cases from the second new-user probe (issue 15) that run_case.sh cannot express (compare takes
# no --out; an empty argument): each must exit 2 at once with a message naming what is wrong.
# Usage: probe2_cases.sh MPT
set -u
mpt=$1
g=tests/golden/underflow.json
fails=0
check() {  # check NAME REGEX CMD...: exit 2 within 10 s, stderr matches REGEX (extended)
  local name=$1 regex=$2; shift 2
  local start=$SECONDS
  timeout 60 "$@" > /tmp/probe2.$$.out 2> /tmp/probe2.$$.err; local rc=$?
  local took=$((SECONDS - start))
  if [ $rc = 2 ] && [ $took -le 10 ] && grep -Eq -- "$regex" /tmp/probe2.$$.err; then echo "ok: $name"
  else echo "FAIL: $name: exit $rc in $took s, stderr: $(head -c 300 /tmp/probe2.$$.err)"; fails=$((fails + 1)); fi
}
check "--config ''" "--config: expected a file path, got an empty string" "$mpt" underflow --config ""
check "--tol with three values" "--tol '/results/\*=1,2,3': expected PATTERN=RTOL\[,ATOL\]" \
  "$mpt" compare "$g" "$g" --tol '/results/*=1,2,3'
check "--tol-file /dev/zero (read no further than 1 MiB)" "/dev/zero: the tolerance file is larger than 1 MiB" \
  "$mpt" compare "$g" "$g" --tol-file /dev/zero
check "--tol-file a directory" "tests: is a directory, not a tolerance file" "$mpt" compare "$g" "$g" --tol-file tests
check "--tol-file with a NUL byte (escaped in the message)" 'nul.tol:1: pattern "\\0/a": expected a path glob' \
  "$mpt" compare "$g" "$g" --tol-file tests/cli/bad/nul.tol
# A data folder without Fashion-MNIST is bad input, refused once by the launcher before any rank
# starts (it was exit 3, printed by every rank without the key): exit 2, the key, one message.
once() {  # once NAME REGEX CMD...: as check, and stderr holds exactly one "error" line
  check "$@"
  local n; n=$(grep -c "error" /tmp/probe2.$$.err)
  [ "$n" = 1 ] && echo "ok: $1: one error line" || { echo "FAIL: $1: $n error lines"; fails=$((fails + 1)); }
}
once "dataparallel, 2 ranks, data.dir missing" \
  "/data/dir: expected a folder with Fashion-MNIST's IDX .gz files .*got '/nonexistent/fmnist': train-images-idx3-ubyte.gz: cannot open \(No such file or directory\)" \
  "$mpt" dataparallel --config configs/dataparallel_quick.json --nproc 2 --set data.dir=/nonexistent/fmnist
once "shard, 2 ranks, data.dir a file" "/data/dir: .*got 'README.md': train-images-idx3-ubyte.gz: cannot open \(Not a directory\)" \
  "$mpt" shard --nproc 2 --set data.dir=README.md
# A cross-key error names the --set that gave the key its value, as single-key errors do.
once "lossscale, train.data_dir missing" "config error: --set 'train.data_dir=/nonexistent/fmnist': /train/data_dir: expected a folder with Fashion-MNIST" \
  "$mpt" lossscale --set train.data_dir=/nonexistent/fmnist
# Train files only: the test split is named (fp8 evaluates on it).
mkdir -p /tmp/probe2.$$.data
cp /usr/share/datasets/fashion-mnist/train-* /tmp/probe2.$$.data/ 2>/dev/null
once "fp8, no test split" "/data/dir: .*t10k-images-idx3-ubyte.gz: cannot open" \
  "$mpt" fp8 --set data.dir=/tmp/probe2.$$.data
rm -rf /tmp/probe2.$$.data
rm -f /tmp/probe2.$$.out /tmp/probe2.$$.err
[ $fails = 0 ] && echo "all ok" || { echo "$fails failed"; exit 1; }
