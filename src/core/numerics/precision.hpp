// Number formats and rounding: fp32, fp16, bf16 through LibTorch casts (IEEE 754
// round-to-nearest-even, subnormals kept, overflow to inf), and fp8 E4M3 / E5M2
// emulated in fp32 by core/numerics/quant (OCP 8-bit floating point spec, 2023: E4M3 max 448 with no
// inf, E5M2 max 57344; overflow as LibTorch 2.x's casts: E4M3 saturates to ±448 — PyTorch ≤ 2.11
// gave NaN — and E5M2 goes to ±inf).
//
// Emulated compute ("fp16 storage with fp32 math", what CUDA's half kernels and
// Tensor Cores do): arithmetic in fp32, every stored tensor rounded with round_to().
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace mpt {

/// The formats mpt knows.
enum class Format { FP32, FP16, BF16, FP8_E4M3, FP8_E5M2 };

/// How arithmetic in a low-precision format is carried out (design notes §5):
/// Native   tensors of the format's dtype, LibTorch's kernels for it (where the device has them;
///          on CPU and CUDA these accumulate in fp32 and round each result once)
/// Emulated fp32 tensors and fp32 arithmetic; every stored tensor (parameters, each layer's
///          output, the gradient entering each layer) rounded to the format — fp16 storage with
///          fp32 math, what CUDA's half kernels and Tensor Cores do.
enum class Compute { Emulated, Native };
/// "emulated" | "native".
inline const char* compute_name(Compute c) { return c == Compute::Native ? "native" : "emulated"; }

/// Facts about a format; the values equal torch.finfo's (bits, eps, max, tiny) and the
/// smallest subnormal is 2^(emin − mantissa_bits).
struct FormatInfo {
  Format format;
  std::string name;      ///< "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"
  int bits;              ///< total bits
  int exponent_bits;
  int mantissa_bits;     ///< explicitly stored fraction bits
  int emin;              ///< exponent of the smallest normal (e.g. −14 for fp16)
  int emax;              ///< exponent of the largest finite value (e.g. 15 for fp16)
  double max;            ///< largest finite value
  double min_normal;     ///< smallest positive normal (torch.finfo.tiny)
  double min_subnormal;  ///< smallest positive subnormal
  double eps;            ///< machine epsilon: 2^−mantissa_bits (torch.finfo.eps)
  bool has_inf;          ///< false for E4M3 (its cast saturates at ±448 instead)
};

/// Facts about `f`.
const FormatInfo& format_info(Format f);
/// Parses "fp32" | "fp16" | "bf16" | "fp8_e4m3" | "fp8_e5m2"; throws std::invalid_argument.
Format parse_format(const std::string& name);
/// The format's name.
inline const std::string& format_name(Format f) { return format_info(f).name; }
/// The LibTorch dtype that stores `f` natively (Float, Half, BFloat16), or Float for fp8
/// (stored rounded in fp32 where LibTorch has no such dtype).
torch::ScalarType storage_dtype(Format f);

/// Rounds a floating tensor to format `f` and returns it as fp32 (same shape):
/// the value the format would store. Round to nearest, ties to even. fp8 follows LibTorch 2.x's
/// casts to float8_e4m3fn / float8_e5m2 (core/numerics/quant's cast, on every route): E4M3 saturates at
/// ±448 (inf too), E5M2 overflows to ±inf; NaN stays NaN.
torch::Tensor round_to(const torch::Tensor& x, Format f);

/// round_to(x, f) written into `x` itself: x must be an fp32 tensor; afterwards it holds f's values.
/// CPU, contiguous, f ∈ {fp16, bf16}: one pass over memory, no allocation (round_element's
/// arithmetic); otherwise x.copy_(round_to(x, f)). FP32 leaves x unchanged. Throws
/// std::invalid_argument for a non-fp32 x.
void round_to_(torch::Tensor& x, Format f);

/// How many elements of `g` (any shape, fp32 values — a gradient in fp32 math) are nonzero but
/// round to zero in `f`: ((g != 0) & (round_to(g, f) == 0)).sum(), the gradient-underflow count
/// of Micikevicius et al. 2017, §3.2. Fused (one pass, no temporaries, no host sync beyond the
/// result) for contiguous fp32 CPU tensors and f ∈ {fp16, bf16}; ATen's expression otherwise.
/// FP32 counts 0.
int64_t count_underflow(const torch::Tensor& g, Format f);

/// round_to(x, f) and count_underflow(x, f) from one pass over x (the fused path as above; ATen's
/// operators otherwise): returns the rounded fp32 tensor and adds the count to `*underflow`.
torch::Tensor round_to_counting_underflow(const torch::Tensor& x, Format f, int64_t* underflow);

/// One fp32 value rounded to fp16 or bf16 and widened back (f ∈ {FP16, BF16}; anything else is
/// returned unchanged): IEEE 754 round to nearest, ties to even, on the bits — bf16 keeps the
/// top 16 bits, fp16 rounds the significand to 10 bits (to the 2^−24 grid below 2^−14:
/// subnormals), beyond 65504 + half an ulp → ±inf; NaN stays NaN (quieted). The values of
/// `x.to(kHalf / kBFloat16).to(kFloat)` for every non-NaN input (tests/numerics/precision_test.cpp checks
/// every fp16 / bf16 pattern, their midpoints and a stride through all 2^32 fp32 patterns); NaN
/// payloads are not kept (ATen's vector and scalar casts differ there too).
float round_element(float x, Format f);

// The element roundings of round_element, inline for the fused loops of core/numerics/precision and
// core/train/amp. GCC vectorises those loops only at -O3 and without -ftrapping-math; both change no
// result (no-trapping-math lets a select evaluate both float arms; contraction and reassociation
// stay off, so (|x| + 0.5) − 0.5 is computed as written). The functions here and the loops that
// inline them sit between MPT_ROUNDING_PUSH / MPT_ROUNDING_POP so that their options agree (GCC
// does not inline across differing optimize options).
#if defined(__GNUC__) && !defined(__clang__)
#define MPT_ROUNDING_PUSH _Pragma("GCC push_options") _Pragma("GCC optimize(\"O3\", \"no-trapping-math\")")
#define MPT_ROUNDING_POP _Pragma("GCC pop_options")
#else
#define MPT_ROUNDING_PUSH
#define MPT_ROUNDING_POP
#endif

namespace detail {
MPT_ROUNDING_PUSH
inline std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
/// round_element(x, BF16): keep the top 16 bits, rounding the dropped 16 to nearest, ties to even
/// (the carry may run into the exponent: up a binade, or to inf past bf16's max) — c10::BFloat16's
/// round_to_nearest_even. NaN: quieted, sign and top payload bits kept.
inline float round_bf16_element(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return float_of(nan ? ((u | 0x00400000u) & 0xFFFF0000u) : r);
}
/// round_element(x, FP16): |x| ≥ 2^−14 (fp16's normals): the significand rounded to 10 bits on the
/// bits as above, 13 dropped bits; |x| < 2^−14: rounded to the subnormals' grid 2^−24 by fp32
/// arithmetic — |x| + 0.5 has ulp 2^−24, so the fp32 addition rounds |x| to nearest, ties to even,
/// on that grid, and subtracting 0.5 is exact. What rounds past 65504 → inf. Sign restored; NaN
/// quieted with its top payload bits (the values of F16C's vcvtps2ph, checked on all 2^32 inputs).
inline float round_fp16_element(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint32_t sign = u & 0x80000000u, a = u ^ sign;
  const std::uint32_t normal = (a + 0x0FFFu + ((a >> 13) & 1u)) & 0xFFFFE000u;
  const std::uint32_t sub = bits_of((float_of(a) + 0.5f) - 0.5f);
  std::uint32_t r = a < 0x38800000u ? sub : normal;
  r = r > 0x477FE000u ? 0x7F800000u : r;                        // 65504 = 0x477FE000
  r = a > 0x7F800000u ? ((a | 0x00400000u) & 0xFFFFE000u) : r;  // NaN
  return float_of(r | sign);
}
MPT_ROUNDING_POP
}  // namespace detail

/// Rounds one double through fp32 and then to `f` (the path of a Python float
/// stored into a torch tensor of that dtype).
double round_scalar(double x, Format f);

/// Where a stored value falls: "zero", "subnormal", "normal", "inf", "nan".
std::string classify(double stored, Format f);
/// Where `original` (a double, rounded through fp32 first as round_scalar does) falls once cast
/// to `f`: classify's classes, plus "saturated" for a value (±inf included) beyond the range of a format
/// whose cast saturates instead of overflowing — E4M3 (no inf: PyTorch 2.15's float8_e4m3fn cast
/// clamps to ±448 what its non-saturating cast, OCP's overflow rule, turns into NaN).
std::string classify_cast(double original, Format f);

/// Element counts of a gradient cast to `f` (shape-agnostic; counts over all elements).
struct CastStats {
  long long numel = 0;
  long long zero_before = 0;   ///< exactly zero already in fp32
  long long underflow = 0;     ///< nonzero in fp32, zero after the cast
  long long subnormal = 0;     ///< nonzero and below the smallest normal after the cast
  long long overflow = 0;      ///< finite in fp32, beyond the range after rounding: inf (for E4M3,
                               ///< which saturates, the values its non-saturating cast makes NaN)
};
/// Counts what casting fp32 tensor `x` to `f` does to its elements.
CastStats cast_stats(const torch::Tensor& x, Format f);

/// ||approx − ref||₂ / ||ref||₂ over all elements (any shape, the same for both; any floating dtype),
/// the error statistic of every "rel err" column. Computed in float64: an fp32 norm overflows once
/// the squares sum past 3.4e38 (elements near 1e18 already) and reads 0 (finite / inf) or NaN
/// (inf / inf); in float64 the squares of any finite fp32 value (≤ 1.2e77) sum without overflow
/// and the difference of two fp32 values is exact. 0 when both are zero, +inf when only `ref` is;
/// NaN or inf when an input holds NaN or inf. Throws c10::Error when the shapes differ.
double relative_error(const torch::Tensor& approx, const torch::Tensor& ref);

}  // namespace mpt
