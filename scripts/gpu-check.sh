#!/usr/bin/env bash
# The one script to run on a machine with an NVIDIA GPU (docs/gpu.md says what to bring).
# Builds mpt against the CUDA LibTorch found there, runs the CUDA tests, then every experiment
# once on --device cuda (small configs), and writes a short report.
#
#   scripts/gpu-check.sh                       # torch from $MPT_TORCH_DIR, else .venv-torch2, else python3
#   MPT_TORCH_DIR=/path/to/libtorch scripts/gpu-check.sh
#   MPT_DATA_DIR=/path/to/fashion-mnist scripts/gpu-check.sh   # if not in /usr/share/datasets/fashion-mnist
#
# Output: gpu-report/report.json and gpu-report/report.md (device name, per-experiment pass/fail
# with exit codes, fp32/fp16/bf16 step times of the lossscale recipes), plus every result file and
# log. Exit 0 when every step passed, 1 otherwise. Needs no network.
set -uo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "gpu-check: unknown argument '$1' (it takes none; see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
out=${MPT_REPORT_DIR:-gpu-report}
build=${MPT_BUILD_DIR:-build-gpu}
data=${MPT_DATA_DIR:-/usr/share/datasets/fashion-mnist}
mkdir -p "$out"
log() { echo "gpu-check: $*" >&2; }

# ---- find LibTorch -----------------------------------------------------------
tdir=${MPT_TORCH_DIR:-}
if [ -z "$tdir" ]; then
  for py in .venv-torch2/bin/python python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null 2>&1 || [ -x "$py" ]; then
      tdir=$("$py" -W ignore -c 'import os, torch; assert torch.version.cuda; print(os.path.dirname(torch.__file__))' 2>/dev/null) && break
    fi
  done
fi
[ -n "$tdir" ] && [ -d "$tdir/share/cmake/Torch" ] || {
  log "no CUDA LibTorch found: set MPT_TORCH_DIR to a LibTorch folder (with share/cmake/Torch), or install the torch wheel (scripts/setup.sh --torch pip)"
  exit 2
}
log "LibTorch at $tdir"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}"
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
log "GPU: ${gpu:-none visible to nvidia-smi}"

# ---- build ---------------------------------------------------------------------
steps=()   # "name|exit code|seconds|log"
step() {   # step NAME COMMAND...: runs, records the exit code and time
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  steps+=("$name|$rc|$((SECONDS - t0))")
  log "$name: exit $rc ($((SECONDS - t0)) s)"
  return $rc
}
step configure cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_PREFIX_PATH=$tdir;$tdir/share/cmake" \
  -DMPT_REF_PYTHON="${MPT_REF_PYTHON:-$(command -v python3 || echo /usr/bin/python3)}" || { cat "$out/configure.log"; exit 1; }
step build cmake --build "$build" -j "${MPT_JOBS:-$(nproc)}" || { tail -40 "$out/build.log"; exit 1; }
mpt="$build/mpt"

# ---- CUDA tests (ctest label "cuda") --------------------------------------------
step cuda-tests ctest --test-dir "$build" -L cuda --output-on-failure --timeout 600

# ---- every experiment once on the GPU --------------------------------------------
run() {  # run NAME ARGS...
  local name=$1; shift
  step "exp-$name" "$mpt" "$@" --device cuda --out "$out/$name.json"
}
run underflow underflow
run lossscale lossscale --set /train/data_dir="\"$data\"" --set /train/compute='"native"' --set /sweep/compute='"native"'
run lossscale-emulated lossscale --set /train/data_dir="\"$data\"" --set /train/compute='"emulated"' --set /train/steps=200
run dataparallel dataparallel --config configs/dataparallel_quick.json --set /data/dir="\"$data\""
run pipeline pipeline
run accumulate accumulate
run checkpoint checkpoint

# ---- report ----------------------------------------------------------------------
python3 - "$out" "$gpu" "${steps[@]}" <<'PY'
import json, sys, os
out, gpu, steps = sys.argv[1], sys.argv[2], sys.argv[3:]
rep = {"gpu": gpu or None, "steps": [], "lossscale_step_ms": {}}
for s in steps:
    name, rc, secs = s.split("|")
    rep["steps"].append({"name": name, "exit": int(rc), "seconds": int(secs), "ok": rc == "0"})
for variant in ("lossscale", "lossscale-emulated"):
    try:
        doc = json.load(open(os.path.join(out, variant + ".json")))
        rep["lossscale_step_ms"][variant] = {k: round(v["step_time_s"] * 1e3, 3) for k, v in doc["timings"]["recipes"].items()}
        rep.setdefault("env", doc["env"])
    except (OSError, KeyError, ValueError):
        pass
rep["ok"] = all(s["ok"] for s in rep["steps"])
json.dump(rep, open(os.path.join(out, "report.json"), "w"), indent=2)
lines = [f"# mpt GPU check", "", f"GPU: {gpu or 'none visible'}", "", "| step | exit | s |", "|---|---|---|"]
lines += [f"| {s['name']} | {s['exit']} | {s['seconds']} |" for s in rep["steps"]]
for variant, t in rep["lossscale_step_ms"].items():
    lines += ["", f"{variant} step times (ms): " + ", ".join(f"{k} {v}" for k, v in t.items())]
lines += ["", "overall: " + ("PASS" if rep["ok"] else "FAIL")]
open(os.path.join(out, "report.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if rep["ok"] else 1)
PY
