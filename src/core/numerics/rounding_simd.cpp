// Vector loops for the fp16 / bf16 roundings. See rounding_simd.hpp.
//
// Compiled with -ffp-contract=off (CMakeLists.txt): no multiply-add may be contracted in the
// rounding arithmetic (there is none today; the flag keeps it so).
#include "core/numerics/rounding_simd.hpp"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

#include "core/errors.hpp"
#include "core/numerics/precision.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
// GCC 12's avx512fintrin.h builds _mm512_cvtps_ph's operand from _mm512_undefined_*, which
// -Wmaybe-uninitialized reports once inlined (a false positive of the header, not of this code).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

namespace mpt::simd {

namespace {

// ---------------------------------------------------------------------------------------------
// Baseline: precision.hpp's element roundings in a loop (vectorised by GCC with SSE2 at -O3
// without -ftrapping-math: MPT_ROUNDING_PUSH, the options the inline element functions carry).
// ---------------------------------------------------------------------------------------------
MPT_ROUNDING_PUSH
template <bool Fp16, bool Count, bool Write>
int64_t span_baseline(const float* in, float* out, int64_t n) {
  int64_t under = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = in[i];
    const float r = Fp16 ? detail::round_fp16_element(x) : detail::round_bf16_element(x);
    if (Count) under += static_cast<int64_t>((x != 0.0f) & (r == 0.0f));
    if (Write) out[i] = r;
  }
  return under;
}
MPT_ROUNDING_POP

#if defined(__x86_64__)
// vcvtps2ph's rounding immediate: round to nearest, ties to even (not MXCSR.RC), no exceptions.
constexpr int kNearestEven = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// ---------------------------------------------------------------------------------------------
// AVX2 + F16C: 8 lanes. fp16: vcvtps2ph / vcvtph2ps are IEEE 754 conversions — round to nearest
// even on the significand, fp16 subnormals kept, beyond 65504 + half an ulp → ±inf, NaN quieted
// with its top 10 payload bits — exactly round_fp16_element's values. bf16: round_bf16_element's
// integer arithmetic lane by lane: (u + 0x7FFF + lsb) & 0xFFFF0000, NaN → (u | 0x00400000) &
// 0xFFFF0000. The last n mod 8 elements take the baseline loop.
// ---------------------------------------------------------------------------------------------
template <bool Fp16>
__attribute__((target("avx2,f16c"))) inline __m256 round8(__m256 x) {
  if (Fp16) return _mm256_cvtph_ps(_mm256_cvtps_ph(x, kNearestEven));
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), hi);
  // |u| > 0x7F800000 as signed 32-bit integers: both sides are below 2^31
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  const __m256i q = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), hi);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(r, q, nan));
}

template <bool Fp16, bool Count, bool Write>
__attribute__((target("avx2,f16c,popcnt"))) int64_t span_avx2(const float* in, float* out, int64_t n) {
  int64_t under = 0, i = 0;
  const __m256 zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    const __m256 r = round8<Fp16>(x);
    if (Count) {
      // x != 0 is true for NaN (unordered), as the baseline's `x != 0.0f`
      const __m256 m = _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_NEQ_UQ), _mm256_cmp_ps(r, zero, _CMP_EQ_OQ));
      under += __builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(m)));
    }
    if (Write) _mm256_storeu_ps(out + i, r);
  }
  return under + span_baseline<Fp16, Count, Write>(in + i, Write ? out + i : out, n - i);
}

// ---------------------------------------------------------------------------------------------
// AVX-512F: 16 lanes, the same arithmetic with mask registers (_mm512_cvtps_ph / _mm512_cvtph_ps
// for fp16). The last n mod 16 elements take the baseline loop.
// ---------------------------------------------------------------------------------------------
template <bool Fp16>
__attribute__((target("avx512f"))) inline __m512 round16(__m512 x) {
  if (Fp16) return _mm512_cvtph_ps(_mm512_cvtps_ph(x, kNearestEven));
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), hi);
  const __mmask16 nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  const __m512i q = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), hi);
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(nan, r, q));
}

template <bool Fp16, bool Count, bool Write>
__attribute__((target("avx512f,popcnt"))) int64_t span_avx512(const float* in, float* out, int64_t n) {
  int64_t under = 0, i = 0;
  const __m512 zero = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(in + i);
    const __m512 r = round16<Fp16>(x);
    if (Count) {
      const __mmask16 m = _mm512_cmp_ps_mask(x, zero, _CMP_NEQ_UQ) & _mm512_cmp_ps_mask(r, zero, _CMP_EQ_OQ);
      under += __builtin_popcount(static_cast<unsigned>(m));
    }
    if (Write) _mm512_storeu_ps(out + i, r);
  }
  return under + span_baseline<Fp16, Count, Write>(in + i, Write ? out + i : out, n - i);
}
#endif  // __x86_64__

template <bool Fp16, bool Count, bool Write>
int64_t span_at(Level l, const float* in, float* out, int64_t n) {
#if defined(__x86_64__)
  if (l == Level::Avx512) return span_avx512<Fp16, Count, Write>(in, out, n);
  if (l == Level::Avx2) return span_avx2<Fp16, Count, Write>(in, out, n);
#endif
  (void)l;
  return span_baseline<Fp16, Count, Write>(in, out, n);
}

template <bool Fp16>
int64_t span_for(Level l, const float* in, float* out, int64_t n, bool count) {
  if (out == nullptr) return count ? span_at<Fp16, true, false>(l, in, out, n) : 0;
  return count ? span_at<Fp16, true, true>(l, in, out, n) : span_at<Fp16, false, true>(l, in, out, n);
}

std::string supported_list() {
  std::string s;
  for (Level l : supported_levels()) s += (s.empty() ? "" : ", ") + std::string(level_name(l));
  return s;
}

Level decide_level() {
  const char* v = std::getenv("MPT_SIMD");
  if (v && *v) {
    const Level l = parse_level(v, "MPT_SIMD");
    if (!cpu_supports(l))
      throw ConfigError(fmt::format("MPT_SIMD={}: this {} cannot run it ({}); it supports {}", v,
#if defined(__x86_64__)
                                    "CPU", l == Level::Avx512 ? "needs the CPUID flag avx512f" : "needs the CPUID flags avx2 and f16c",
#else
                                    "build", "x86-64 only",
#endif
                                    supported_list()));
    return l;
  }
  return supported_levels().back();
}

}  // namespace

const char* level_name(Level l) {
  switch (l) {
    case Level::Avx2: return "avx2";
    case Level::Avx512: return "avx512";
    default: return "baseline";
  }
}

Level parse_level(const std::string& name, const std::string& what) {
  for (Level l : {Level::Baseline, Level::Avx2, Level::Avx512})
    if (name == level_name(l)) return l;
  throw ConfigError(fmt::format("{}=\"{}\": expected baseline, avx2 or avx512 (this CPU supports {})", what,
                                name.size() > 40 ? name.substr(0, 40) + "..." : name, supported_list()));
}

bool cpu_supports(Level l) {
  switch (l) {
    case Level::Baseline: return true;
#if defined(__x86_64__)
    case Level::Avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case Level::Avx512: return __builtin_cpu_supports("avx512f") != 0;
#endif
    default: return false;
  }
}

std::vector<Level> supported_levels() {
  std::vector<Level> out;
  for (Level l : {Level::Baseline, Level::Avx2, Level::Avx512})
    if (cpu_supports(l)) out.push_back(l);
  return out;
}

Level active_level() {
  static std::atomic<int> cached{-1};
  const int c = cached.load(std::memory_order_acquire);
  if (c >= 0) return static_cast<Level>(c);
  const Level l = decide_level();  // throws before anything is kept
  cached.store(static_cast<int>(l), std::memory_order_release);
  return l;
}

int64_t round_span(Half h, const float* in, float* out, int64_t n, bool count, Level l) {
  if (!cpu_supports(l))
    throw std::invalid_argument(fmt::format("simd::round_span: level {} is not supported here (supported: {})",
                                            level_name(l), supported_list()));
  if (n <= 0) return 0;
  return h == Half::FP16 ? span_for<true>(l, in, out, n, count) : span_for<false>(l, in, out, n, count);
}

}  // namespace mpt::simd
