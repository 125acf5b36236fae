#!/usr/bin/env bash
# One CUDA test: run_cuda.sh COMMAND... — runs the command (an mpt run on --device cuda, or a
# script that makes such runs) and passes its exit code through, except when the run says that
# no CUDA device is available: then it prints "SKIPPED: ..." and exits 77, which ctest reports
# as skipped (SKIP_RETURN_CODE), so a build without a GPU shows the skip instead of hiding it.
# The same for a multi-process (NCCL) case on a machine with fewer GPUs than processes.
set -u
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" > "$log" 2>&1
rc=$?
cat "$log"
if [ $rc -ne 0 ] && grep -q -e "no CUDA device is available" -e "SKIPPED: no CUDA" "$log"; then
  echo "SKIPPED: no CUDA device on this machine (this test runs on a GPU: scripts/gpu-check.sh)"
  exit 77
fi
# NCCL needs one GPU per process: a multi-process case on a machine with fewer GPUs is skipped, by name.
if [ $rc -ne 0 ] && grep -q -e "has no GPU of its own" "$log"; then
  echo "SKIPPED: this case runs one process per GPU and the machine has too few GPUs (see the message above)"
  exit 77
fi
exit $rc
