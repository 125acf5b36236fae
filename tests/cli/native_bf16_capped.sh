#!/usr/bin/env bash
# Native bf16 training under oneDNN's AVX2 cap (ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA set by
# ctest). What must happen depends on the LibTorch and the CPU, read from `mpt env --json`:
#  - LibTorch 1.13 on a CPU with AVX-512 BW/VL/DQ: its bf16 GEMM goes to oneDNN, which has no
#    bf16 matmul below avx512_core and would abort the process (std::terminate, uncatchable):
#    mpt must refuse `compute=native` with exit 3 and say why, and never run the kernel;
#  - anywhere else the kernels run (LibTorch 2.x falls back to its own GEMM under the cap;
#    1.13 without AVX-512 uses its generic bf16 GEMM): native must train, exit 0.
#   native_bf16_capped.sh MPT ARGS...
set -u
mpt=$1; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$mpt" env --json > "$tmp/env.json" || { echo "FAIL: mpt env exited $?"; exit 1; }
expect=$(/usr/bin/python3 - "$tmp/env.json" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
old = e["torch"].startswith("1.")
flags = set()
for line in open("/proc/cpuinfo"):
    if line.startswith("flags"):
        flags = set(line.split(":", 1)[1].split())
        break
avx512 = {"avx512bw", "avx512vl", "avx512dq"} <= flags
capped = e["hardware"]["onednn"]["isa"] in ("default", "sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2")
print("refuse" if old and avx512 and capped else "train")
PY
)
"$mpt" lossscale "$@" --device cpu --set gpt.enabled=false --set train.compute=native --set 'train.recipes=["bf16"]' --out "$tmp/r.json" \
  > "$tmp/out.txt" 2>&1
code=$?
if [ "$expect" = refuse ]; then
  if [ $code -ne 3 ] || ! grep -q "would abort the process" "$tmp/out.txt" || [ -e "$tmp/r.json" ]; then
    echo "FAIL: expected exit 3 naming the abort (LibTorch 1.13, AVX-512 CPU, oneDNN capped), got $code:"
    cat "$tmp/out.txt"; exit 1
  fi
  grep -q "bf16_compute_reason.*would abort" <("$mpt" env) || { echo "FAIL: mpt env does not give the reason"; exit 1; }
else
  if [ $code -ne 0 ] || [ ! -s "$tmp/r.json" ]; then echo "FAIL: expected native bf16 to train (exit 0), got $code:"; cat "$tmp/out.txt"; exit 1; fi
fi
echo "ok: $expect (exit $code)"
