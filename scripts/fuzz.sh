#!/usr/bin/env bash
# Builds mpt's libFuzzer targets with clang (ASan + UBSan) into build-fuzz/, replays the
# regression inputs of tests/fuzz/regressions/, then fuzzes each target for SECONDS.
# Fails (exit 1) on any crash, leak, timeout, out-of-memory or sanitizer report.
#
#   scripts/fuzz.sh            # 60 s per target (what CI runs)
#   scripts/fuzz.sh 600        # 10 minutes per target
#   scripts/fuzz.sh 0          # build and replay the regressions only
#   FUZZ_TARGETS=config scripts/fuzz.sh 60    # one target (config, compare)
#
# Targets (tests/fuzz/): fuzz_config (the --config text and --set strings through
# resolve_config) and fuzz_compare (two result files through `mpt compare`'s reader and
# comparison). They compile from src/core/io/{config,config_json,compare,results}.cpp alone (no LibTorch).
# New inputs go to build-fuzz/corpus/<target>/ (tests/fuzz/corpus/<target>/ is the seed, read
# only); a crashing input is saved as build-fuzz/artifacts/<target>-crash-*: fix the bug, then
# add the input to tests/fuzz/regressions/<target>/ so it is replayed from then on.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
case "$seconds" in ''|*[!0-9]*) echo "fuzz: SECONDS must be a whole number, got '$seconds'" >&2; exit 2 ;; esac
targets=${FUZZ_TARGETS:-"config compare"}
cxx=${FUZZ_CXX:-}
if [ -z "$cxx" ]; then
  for c in clang++-14 clang++; do command -v "$c" > /dev/null && { cxx=$c; break; }; done
fi
if [ -z "$cxx" ] || ! dpkg-query -W -f='${Status}' libclang-rt-14-dev 2>/dev/null | grep -q "install ok installed" \
   || ! dpkg-query -W -f='${Status}' nlohmann-json3-dev 2>/dev/null | grep -q "install ok installed"; then
  # A fresh machine: install Debian's clang with its sanitizer and libFuzzer runtimes (as setup.sh does).
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo > /dev/null || { echo "fuzz: need root or sudo to install clang-14 libclang-rt-14-dev" >&2; exit 2; }
    sudo=(sudo)
  fi
  echo "fuzz: installing clang-14 libclang-rt-14-dev nlohmann-json3-dev libfmt-dev" >&2
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
    clang-14 libclang-rt-14-dev nlohmann-json3-dev libfmt-dev > /dev/null
  [ -n "$cxx" ] || cxx=clang++-14
fi
out=build-fuzz
mkdir -p "$out/artifacts"
flags=(-std=c++17 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=all -Isrc -Itests/fuzz)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
lib_srcs=(src/core/io/config.cpp src/core/io/config_json.cpp src/core/io/compare.cpp src/core/io/results.cpp)
# The library objects once, then one link per target (only when a source is newer).
for s in "${lib_srcs[@]}"; do
  o="$out/$(basename "${s%.cpp}").o"
  if [ ! -f "$o" ] || [ -n "$(find src/core -newer "$o" -name '*.[ch]pp' | head -1)" ]; then
    echo "fuzz: compiling $s"
    "$cxx" "${flags[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" -c "$s" -o "$o"
  fi
done
# One target: build, replay its regressions, fuzz. Returns 1 on any finding.
fuzz_target() {
  local t=$1
  local bin="$out/fuzz_$t"
  local src="tests/fuzz/fuzz_$t.cpp"
  echo "fuzz: building $bin"
  "$cxx" "${flags[@]}" "$src" "$out"/{config,config_json,compare,results}.o -lfmt -o "$bin"
  local common=(-rss_limit_mb=2048 -timeout=10 -max_len=16384 -dict=tests/fuzz/json.dict
                "-artifact_prefix=$out/artifacts/$t-")
  local regs=(tests/fuzz/regressions/"$t"/*)
  if [ -e "${regs[0]}" ]; then
    echo "fuzz: $t: replaying ${#regs[@]} regression inputs"
    if ! "$bin" "${common[@]}" -runs=1 "${regs[@]}" > "$out/$t-regressions.log" 2>&1; then
      echo "fuzz: $t: a regression input fails; see $out/$t-regressions.log"
      tail -30 "$out/$t-regressions.log"
      return 1
    fi
  fi
  if [ "$seconds" -gt 0 ]; then
    mkdir -p "$out/corpus/$t"
    echo "fuzz: $t: fuzzing for $seconds s (log: $out/$t.log)"
    if "$bin" "${common[@]}" -max_total_time="$seconds" -print_final_stats=1 \
         "$out/corpus/$t" "tests/fuzz/corpus/$t" > "$out/$t.log" 2>&1; then
      grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$out/$t.log" | sed "s/^/fuzz: $t: /"
    else
      echo "fuzz: $t: FAILED; see $out/$t.log and $out/artifacts/"
      grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$out/$t.log" | head -20
      return 1
    fi
  fi
}
for t in $targets; do
  [ -f "tests/fuzz/fuzz_$t.cpp" ] || { echo "fuzz: no target '$t' (tests/fuzz/fuzz_$t.cpp)" >&2; exit 2; }
done
# The targets are independent and each fuzzer runs on one core: with two cores or more they run
# side by side (CI's wall time is one target's, not the sum); their reports print in order.
status=0
pids=()
for t in $targets; do
  if [ "$(nproc)" -ge 2 ]; then
    fuzz_target "$t" > "$out/$t.report" 2>&1 &
    pids+=($!)
  else
    fuzz_target "$t" > "$out/$t.report" 2>&1 || status=1
    pids+=("")
  fi
done
i=0
for t in $targets; do
  if [ -n "${pids[$i]}" ]; then wait "${pids[$i]}" || status=1; fi
  i=$((i + 1))
  cat "$out/$t.report"
done
[ $status = 0 ] && echo "fuzz: OK (targets: $targets; $seconds s each)"
exit $status
