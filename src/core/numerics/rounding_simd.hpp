// Vector loops for the fp32 → fp16 → fp32 and fp32 → bf16 → fp32 roundings of core/numerics/precision
// (emulated fp16 / bf16 storage on fp32 tensors), in three implementations chosen once at run time:
//   baseline  the element roundings of precision.hpp (detail::round_fp16_element /
//             round_bf16_element) in a plain loop — GCC vectorises it with the x86-64 baseline's SSE2;
//   avx2      AVX2 + F16C: fp16 through vcvtps2ph (_mm256_cvtps_ph, round to nearest even) and
//             vcvtph2ps (_mm256_cvtph_ps); bf16 on the bits in 256-bit integer lanes;
//   avx512    AVX-512F: _mm512_cvtps_ph / _mm512_cvtph_ps, bf16 in 512-bit lanes with mask registers.
// Every level returns the baseline's values bit for bit on every fp32 input: ties to even,
// subnormals, overflow to ±inf, and NaN quieted with its sign and top payload bits kept
// (tests/numerics/precision_test.cpp compares each level the CPU has with the baseline). The vector code is
// compiled with function-level target attributes, so the binary runs on any x86-64 CPU; on other
// architectures only the baseline exists. The level: the best the CPU has (CPUID through
// __builtin_cpu_supports), or the one the environment variable MPT_SIMD names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mpt::simd {

/// An implementation of the rounding loops.
enum class Level { Baseline, Avx2, Avx512 };

/// "baseline" | "avx2" | "avx512".
const char* level_name(Level l);

/// Parses "baseline" | "avx2" | "avx512"; throws ConfigError (exit 2) naming `what` (e.g. "MPT_SIMD")
/// and the accepted values for anything else.
Level parse_level(const std::string& name, const std::string& what = "MPT_SIMD");

/// Whether this CPU (and this build: x86-64 only for avx2 / avx512) can run `l`: avx2 needs the
/// CPUID flags avx2 and f16c, avx512 needs avx512f (and the OS's support for their registers, which
/// __builtin_cpu_supports checks).
bool cpu_supports(Level l);

/// The levels this CPU can run, baseline first.
std::vector<Level> supported_levels();

/// The level the rounding loops use, decided on the first call and kept: MPT_SIMD when set
/// (throws ConfigError — exit 2 — for an unknown value or a level this CPU lacks, naming MPT_SIMD,
/// the accepted values and what the CPU supports), else the best supported level. A throwing
/// first call is repeated by the next call (nothing is kept).
Level active_level();

/// The two 16-bit formats of the vector loops.
enum class Half { FP16, BF16 };

/// One pass over n contiguous fp32 values at level `l`: out[i] = R(in[i]), R the rounding to `h`
/// and back to fp32 (round_element's values); in == out is allowed (in place); out == nullptr
/// writes nothing (count only). Returns, when `count`, how many in[i] are nonzero (NaN counts as
/// nonzero, as `x != 0` does) and have R(in[i]) == 0 — the gradient-underflow count of
/// Micikevicius et al. 2017, §3.2; 0 otherwise. `l` must be supported (cpu_supports), else
/// std::invalid_argument.
int64_t round_span(Half h, const float* in, float* out, int64_t n, bool count, Level l);

/// round_span at active_level().
inline int64_t round_span(Half h, const float* in, float* out, int64_t n, bool count) {
  return round_span(h, in, out, n, count, active_level());
}

}  // namespace mpt::simd
