// Format facts and rounding (core/numerics/precision).
#include <cmath>
#include <limits>

#include "catch.hpp"
#include "core/runtime/compat.hpp"
#include "core/numerics/precision.hpp"

using namespace mpt;

static double r(double x, Format f) { return round_scalar(x, f); }

TEST_CASE("fp16 facts equal IEEE 754 binary16", "[precision]") {
  const auto& h = format_info(Format::FP16);
  CHECK(h.max == 65504.0);
  CHECK(h.min_normal == 6.103515625e-05);
  CHECK(h.min_subnormal == std::ldexp(1.0, -24));
  CHECK(h.min_subnormal == Approx(5.96e-08).epsilon(1e-3));
  CHECK(h.eps == std::ldexp(1.0, -10));
  CHECK(h.exponent_bits == 5);
  CHECK(h.mantissa_bits == 10);
}

TEST_CASE("fp16 rounding: overflow, ties to even, subnormals", "[precision]") {
  CHECK(std::isinf(r(65520.0, Format::FP16)));  // halfway to the next binade rounds up to inf
  CHECK(r(65519.0, Format::FP16) == 65504.0);
  CHECK(r(2049.0, Format::FP16) == 2048.0);     // tie between 2048 and 2050 -> even
  CHECK(r(2051.0, Format::FP16) == 2052.0);
  CHECK(r(1e-8, Format::FP16) == 0.0);          // below half the smallest subnormal
  CHECK(r(1e-7, Format::FP16) == std::ldexp(2.0, -24));  // 1e-7 rounds to 2 * 2^-24 ~ 1.19e-7
  CHECK(classify(r(1e-7, Format::FP16), Format::FP16) == "subnormal");
  CHECK(classify(r(1e-3, Format::FP16), Format::FP16) == "normal");
  CHECK(classify(r(1e-9, Format::FP16), Format::FP16) == "zero");
  CHECK(classify(r(1e6, Format::FP16), Format::FP16) == "inf");
  // classify_cast: E4M3 has no inf, its cast clamps to 448 what OCP's non-saturating rule makes NaN
  CHECK(classify_cast(1e6, Format::FP16) == "inf");
  CHECK(classify_cast(1e-7, Format::FP16) == "subnormal");
  CHECK(classify_cast(1000.0, Format::FP8_E4M3) == "saturated");
  CHECK(classify_cast(-1000.0, Format::FP8_E4M3) == "saturated");
  CHECK(classify_cast(std::numeric_limits<double>::infinity(), Format::FP8_E4M3) == "saturated");
  CHECK(classify_cast(449.0, Format::FP8_E4M3) == "normal");  // rounds to 448: within range
  CHECK(classify_cast(448.0, Format::FP8_E4M3) == "normal");
  CHECK(classify_cast(1e6, Format::FP8_E5M2) == "inf");        // E5M2 keeps IEEE overflow
  CHECK(classify_cast(std::nan(""), Format::FP8_E4M3) == "nan");
}

TEST_CASE("bf16 keeps fp32's range with 8 bits of precision", "[precision]") {
  CHECK(r(257.0, Format::BF16) == 256.0);  // 257 needs 9 significant bits; tie -> even
  CHECK(r(1e-9, Format::BF16) != 0.0);
  CHECK(format_info(Format::BF16).min_normal == format_info(Format::FP32).min_normal);
  CHECK(format_info(Format::BF16).eps == std::ldexp(1.0, -7));
}

TEST_CASE("fp8 emulation: E4M3 and E5M2 grids", "[precision]") {
  const auto& e4 = format_info(Format::FP8_E4M3);
  CHECK(e4.max == 448.0);
  CHECK(e4.min_normal == std::ldexp(1.0, -6));
  CHECK(e4.min_subnormal == std::ldexp(1.0, -9));
  CHECK(r(448.0, Format::FP8_E4M3) == 448.0);
  CHECK(r(17.0, Format::FP8_E4M3) == 16.0);   // grid spacing 2 in [16,32): tie -> even (16)
  CHECK(r(19.0, Format::FP8_E4M3) == 20.0);   // tie between 18 and 20 -> even mantissa (20)
  CHECK(r(1000.0, Format::FP8_E4M3) == 448.0);  // no inf in E4M3: LibTorch 2.x's cast saturates
  CHECK(r(-INFINITY, Format::FP8_E4M3) == -448.0);
  CHECK(std::isnan(r(NAN, Format::FP8_E4M3)));
  CHECK(r(460.0, Format::FP8_E4M3) == 448.0);  // below the midpoint 464 to the next binade step
  auto big = torch::tensor({100.0f, 460.0f, 470.0f, 1e6f});
  CHECK(cast_stats(big, Format::FP8_E4M3).overflow == 2);  // 470 and 1e6 round past 448: saturated
  CHECK(cast_stats(big, Format::FP8_E5M2).overflow == 1);  // 1e6 -> inf
  CHECK(cast_stats(torch::tensor({6e4f, 1e6f}), Format::FP8_E5M2).overflow == 1);
  CHECK(r(std::ldexp(1.0, -10), Format::FP8_E4M3) == 0.0);  // half the smallest subnormal: tie to 0
  CHECK(r(std::ldexp(3.0, -11), Format::FP8_E4M3) == std::ldexp(1.0, -9));
  const auto& e5 = format_info(Format::FP8_E5M2);
  CHECK(e5.max == 57344.0);
  CHECK(std::isinf(r(1e6, Format::FP8_E5M2)));
  CHECK(r(-3.5, Format::FP8_E5M2) == -3.5);
  CHECK(r(-3.4, Format::FP8_E5M2) == -3.5);
}

TEST_CASE("emulated rounding matches LibTorch's casts for fp16 and bf16", "[precision]") {
  // The generic fp8 path must agree with LibTorch's own fp16 cast on fp16's grid; this
  // validates round_emulated against an independent implementation.
  torch::manual_seed(3);
  auto x = torch::randn({4096}) * torch::exp2(torch::randint(-30, 20, {4096}).to(torch::kFloat));
  auto native = x.to(torch::kHalf).to(torch::kFloat);
  CHECK(torch::equal(round_to(x, Format::FP16), native));
}

TEST_CASE("cast_stats counts underflow, subnormals and overflow", "[precision]") {
  auto x = torch::tensor({0.0f, 1e-9f, 1e-6f, 1.0f, 1e5f});
  auto s = cast_stats(x, Format::FP16);
  CHECK(s.numel == 5);
  CHECK(s.zero_before == 1);
  CHECK(s.underflow == 1);
  CHECK(s.subnormal == 1);
  CHECK(s.overflow == 1);
}

TEST_CASE("parse_format rejects unknown names", "[precision]") {
  CHECK(parse_format("bf16") == Format::BF16);
  CHECK_THROWS_AS(parse_format("fp12"), std::invalid_argument);
}

TEST_CASE("round_to fp8 equals LibTorch 2.x's float8 casts on every bf16 bit pattern", "[precision]") {
#if TORCH_VERSION_MAJOR >= 2
  auto bits = torch::arange(0, 1 << 16, torch::kInt).to(torch::kShort);  // all 2^16 patterns (wraps to int16)
  auto x = bits.view(torch::kBFloat16).to(torch::kFloat);
  for (const auto& [f, dtype] : {std::pair{Format::FP8_E4M3, torch::kFloat8_e4m3fn}, std::pair{Format::FP8_E5M2, torch::kFloat8_e5m2}}) {
    auto mine = round_to(x, f);
    auto torch_cast = x.to(dtype).to(torch::kFloat);
    const auto both_nan = torch::isnan(mine) & torch::isnan(torch_cast);
    const auto same = (mine == torch_cast) | both_nan;
    INFO(format_name(f));
    CHECK(same.all().item<bool>());
  }
#else
  WARN("LibTorch " << compat::torch_version() << " has no float8 dtypes: checked on the 2.x route (and tests/quant/ tables)");
#endif
}

// ---------------------------------------------------------------------------------------------
// The fused fp16 / bf16 rounding (round_to's CPU fast path, round_to_, count_underflow,
// round_to_counting_underflow, round_element) against ATen's casts x.to(dtype).to(float)
// ---------------------------------------------------------------------------------------------
namespace {

// ATen's unfused rounding, which the fused kernels must equal.
torch::Tensor aten_round(const torch::Tensor& x, Format f) {
  return x.to(f == Format::FP16 ? torch::kHalf : torch::kBFloat16).to(torch::kFloat);
}
// Elements where a and b differ: bit patterns for non-NaN (so −0 ≠ +0), NaN-ness for NaN.
int64_t bit_mismatches(const torch::Tensor& a, const torch::Tensor& b) {
  const auto nan_a = torch::isnan(a), nan_b = torch::isnan(b);
  const auto same_bits = a.contiguous().view(torch::kInt) == b.contiguous().view(torch::kInt);
  return (~((nan_a & nan_b) | (~nan_a & ~nan_b & same_bits))).sum().item<int64_t>();
}
// Every fused entry point on x (contiguous fp32) against ATen, bit for bit, and the counts.
void check_fused(const torch::Tensor& x, Format f) {
  INFO(format_name(f) << ", " << x.numel() << " elements");
  const auto ref = aten_round(x, f);
  CHECK(bit_mismatches(round_to(x, f), ref) == 0);
  auto y = x.clone();
  round_to_(y, f);
  CHECK(bit_mismatches(y, ref) == 0);
  const int64_t ref_under = ((x != 0) & (ref == 0)).sum().item<int64_t>();
  CHECK(count_underflow(x, f) == ref_under);
  int64_t under = 7;  // adds to what is there
  CHECK(bit_mismatches(round_to_counting_underflow(x, f, &under), ref) == 0);
  CHECK(under == 7 + ref_under);
  // the scalar path, element by element
  auto scalar = x.clone();
  float* p = scalar.data_ptr<float>();
  for (int64_t i = 0; i < scalar.numel(); ++i) p[i] = round_element(p[i], f);
  CHECK(bit_mismatches(scalar, ref) == 0);
}

// fp32 values around every pattern of a 16-bit format: each pattern, the midpoint to the next
// pattern (exact in fp32: at most 12 significant bits), and the fp32 neighbours of both.
torch::Tensor around_every_pattern(torch::ScalarType dt16) {
  auto bits = torch::arange(0, 1 << 16, torch::kInt).to(torch::kShort);
  auto v = bits.view(dt16).to(torch::kFloat);                       // all 2^16 patterns, NaNs included
  auto next = (bits + 1).view(dt16).to(torch::kFloat);              // the next pattern up in magnitude
  auto mid = ((v.to(torch::kDouble) + next.to(torch::kDouble)) / 2).to(torch::kFloat);  // exact
  const float inf = std::numeric_limits<float>::infinity();
  auto up = [&](const torch::Tensor& t) { return torch::nextafter(t, torch::full_like(t, inf)); };
  auto down = [&](const torch::Tensor& t) { return torch::nextafter(t, torch::full_like(t, -inf)); };
  return torch::cat({v, up(v), down(v), mid, up(mid), down(mid)});
}

}  // namespace

TEST_CASE("fused fp16 rounding equals ATen's cast around all 2^16 fp16 patterns, their midpoints and neighbours",
          "[precision]") {
  auto x = around_every_pattern(torch::kHalf);
  check_fused(x, Format::FP16);
  // the ties really are there: 2049 (between 2048 and 2050) and the smallest subnormal's half
  CHECK(round_element(2049.0f, Format::FP16) == 2048.0f);
  CHECK(round_element(2051.0f, Format::FP16) == 2052.0f);
  CHECK(round_element(std::ldexp(1.0f, -25), Format::FP16) == 0.0f);
  CHECK(round_element(std::nextafter(std::ldexp(1.0f, -25), 1.0f), Format::FP16) == std::ldexp(1.0f, -24));
  CHECK(std::isinf(round_element(65520.0f, Format::FP16)));
  CHECK(round_element(std::nextafter(65520.0f, 0.0f), Format::FP16) == 65504.0f);
  CHECK(std::signbit(round_element(-1e-9f, Format::FP16)));
}

TEST_CASE("fused bf16 rounding equals ATen's cast around all 2^16 bf16 patterns, their midpoints and neighbours",
          "[precision]") {
  check_fused(around_every_pattern(torch::kBFloat16), Format::BF16);
  CHECK(round_element(257.0f, Format::BF16) == 256.0f);
  CHECK(round_element(259.0f, Format::BF16) == 260.0f);
  CHECK(std::isinf(round_element(std::numeric_limits<float>::max(), Format::BF16)));
}

TEST_CASE("fused fp16 / bf16 rounding equals ATen's cast on a stride through all 2^32 fp32 patterns and random inputs",
          "[precision]") {
  // Stride 4093 (prime) through the 2^32 patterns, from two offsets: ~2.1M values of every
  // exponent, sign and NaN payload; then random values over 50 binades with exact zeros, and a
  // size that is not a multiple of the parallel chunk (32768).
  auto stride = torch::arange(0, (int64_t{1} << 32), 4093, torch::kLong);
  auto patterns = torch::cat({stride, stride + 1777}).remainder(int64_t{1} << 32);
  auto x_bits = torch::where(patterns >= (int64_t{1} << 31), patterns - (int64_t{1} << 32), patterns).to(torch::kInt);
  auto x = x_bits.view(torch::kFloat);
  torch::manual_seed(11);
  auto r = torch::randn({100003}) * torch::exp2(torch::randint(-40, 20, {100003}).to(torch::kFloat)) *
           (torch::rand({100003}) > 0.05).to(torch::kFloat);
  for (Format f : {Format::FP16, Format::BF16}) {
    check_fused(x, f);
    check_fused(r, f);
    check_fused(r.narrow(0, 0, 1000), f);  // below one chunk: the serial path
  }
}

TEST_CASE("round_to / round_to_ / count_underflow: non-contiguous, autograd and other formats take ATen's path",
          "[precision]") {
  torch::manual_seed(5);
  auto m = torch::randn({300, 200}) * 1e-5;
  auto t = m.t();  // strided
  CHECK(!t.is_contiguous());
  for (Format f : {Format::FP16, Format::BF16}) {
    CHECK(bit_mismatches(round_to(t, f), aten_round(t, f)) == 0);
    CHECK(count_underflow(t, f) == ((t != 0) & (aten_round(t, f) == 0)).sum().item<int64_t>());
    auto strided = torch::randn({200, 300}).t();
    auto ref = aten_round(strided, f);
    round_to_(strided, f);
    CHECK(bit_mismatches(strided, ref) == 0);
  }
  // a tensor autograd records keeps a differentiable result
  auto leaf = torch::randn({64}).requires_grad_(true);
  auto y = round_to(leaf, Format::FP16);
  CHECK(y.requires_grad());
  y.sum().backward();
  CHECK(torch::equal(leaf.grad(), torch::ones({64})));
  CHECK(count_underflow(m, Format::FP32) == 0);
  auto h = torch::ones({3}, torch::kHalf);
  CHECK_THROWS_AS(round_to_(h, Format::FP16), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// core/numerics/rounding_simd: every vector level equals the baseline loop bit for bit
// ---------------------------------------------------------------------------------------------
#include <cstring>
#include <random>

#include "core/errors.hpp"
#include "core/numerics/rounding_simd.hpp"

namespace {

// Runs `h`'s loop at every supported level on `in` — written out of place, in place and count
// only — and checks each against the baseline: the same bits in every element (memcmp: NaN
// patterns and signed zeros included) and the same underflow count.
void simd_levels_equal(const std::vector<float>& in, simd::Half h) {
  const auto n = static_cast<int64_t>(in.size());
  std::vector<float> base(in.size());
  const int64_t base_count = simd::round_span(h, in.data(), base.data(), n, true, simd::Level::Baseline);
  for (simd::Level l : simd::supported_levels()) {
    INFO("level " << simd::level_name(l) << (h == simd::Half::FP16 ? " fp16" : " bf16") << ", n = " << n);
    std::vector<float> out(in.size());
    CHECK(simd::round_span(h, in.data(), out.data(), n, true, l) == base_count);
    std::vector<float> inplace = in;
    CHECK(simd::round_span(h, inplace.data(), inplace.data(), n, false, l) == 0);  // no count asked
    CHECK(simd::round_span(h, in.data(), nullptr, n, true, l) == base_count);
    bool same = true;
    for (int64_t i = 0; i < n && same; ++i) {
      if (std::memcmp(&out[i], &base[i], 4) != 0 || std::memcmp(&inplace[i], &base[i], 4) != 0) {
        std::uint32_t x, b, o;
        std::memcpy(&x, &in[i], 4), std::memcpy(&b, &base[i], 4), std::memcpy(&o, &out[i], 4);
        FAIL_CHECK("input 0x" << std::hex << x << ": baseline 0x" << b << ", level 0x" << o);
        same = false;
      }
    }
    CHECK(same);
  }
}

float simd_float_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace

TEST_CASE("rounding_simd: every level equals the baseline on all 2^16 upper halves x the rounding-relevant low halves",
          "[precision]") {
  // The low halves decide fp16's (13 dropped bits) and bf16's (16 dropped bits) rounding: zero,
  // the smallest sticky bit, just below / at / above the half-way point of each format (ties),
  // the lsb of the kept part (tie to even vs odd), and all ones; the upper halves sweep every
  // sign, exponent (subnormals, fp16's overflow threshold, inf, NaN) and top mantissa bits.
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2FFF, 0x3000, 0x3001,
                                0x7FFF, 0x8000, 0x8001, 0x9000, 0xBFFF, 0xE000, 0xEFFF, 0xF000, 0xFFFF, 0x5555};
  std::vector<float> in;
  in.reserve(65536 * std::size(lows) + 7);
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : lows) in.push_back(simd_float_bits((hi << 16) | lo));
  in.push_back(simd_float_bits(0x7F800001u));  // signalling NaN with only the lowest payload bit
  in.push_back(simd_float_bits(0xFFBFFFFFu));  // negative signalling NaN, all payload bits
  in.push_back(simd_float_bits(0x7FC00000u));  // the default quiet NaN
  in.push_back(simd_float_bits(0x00000001u));  // fp32's smallest subnormal
  in.push_back(65520.0f);                 // fp16: rounds to inf
  in.push_back(std::nextafter(65520.0f, 0.0f));
  in.push_back(-0.0f);  // n not a multiple of 8 or 16: the tail loops run too
  simd_levels_equal(in, simd::Half::FP16);
  simd_levels_equal(in, simd::Half::BF16);
}

TEST_CASE("rounding_simd: every level equals the baseline on random inputs, every length 0..40 and unaligned starts",
          "[precision]") {
  std::mt19937 rng(7);
  std::vector<float> in(100003);
  for (auto& x : in) x = simd_float_bits(static_cast<std::uint32_t>(rng()));  // random bit patterns: every class
  for (simd::Half h : {simd::Half::FP16, simd::Half::BF16}) {
    simd_levels_equal(in, h);
    for (int start = 0; start < 3; ++start)
      for (int n = 0; n <= 40; ++n)
        simd_levels_equal(std::vector<float>(in.begin() + start * 17 + 1, in.begin() + start * 17 + 1 + n), h);
  }
  // underflow is counted: fp16 flushes 1e-9 to zero; NaN counts as nonzero, never as underflow
  const std::vector<float> small = {1e-9f, -1e-9f, 0.0f, std::nanf(""), 1.0f, 1e-9f, 1e-9f, 1e-9f, 1e-9f, 1e-9f,
                                    1e-9f, 1e-9f, 1e-9f, 1e-9f, 1e-9f, 1e-9f, 1e-9f, 1e-9f};
  for (simd::Level l : simd::supported_levels())
    CHECK(simd::round_span(simd::Half::FP16, small.data(), nullptr, static_cast<int64_t>(small.size()), true, l) == 15);
}

TEST_CASE("rounding_simd: level names, MPT_SIMD's values and the CPU's levels", "[precision]") {
  CHECK(simd::parse_level("baseline") == simd::Level::Baseline);
  CHECK(simd::parse_level("avx2") == simd::Level::Avx2);
  CHECK(simd::parse_level("avx512") == simd::Level::Avx512);
  CHECK_THROWS_AS(simd::parse_level("bogus"), ConfigError);
  CHECK_THROWS_WITH(simd::parse_level("AVX2"), Catch::Contains("MPT_SIMD=\"AVX2\": expected baseline, avx2 or avx512"));
  const auto levels = simd::supported_levels();
  REQUIRE(!levels.empty());
  CHECK(levels.front() == simd::Level::Baseline);
  CHECK(simd::cpu_supports(simd::active_level()));
  for (simd::Level l : {simd::Level::Avx2, simd::Level::Avx512})
    if (!simd::cpu_supports(l)) {
      const float x = 1.0f;
      float y;
      CHECK_THROWS_AS(simd::round_span(simd::Half::FP16, &x, &y, 1, false, l), std::invalid_argument);
    }
}

// Every fp32 bit pattern at every level against the baseline, 2^22 at a time: ctest's
// unit.rounding_exhaustive (label unsanitized). Measured 59 s (ctest, alone; 2 min beside another
// ctest run) for both formats and the three levels on the project's VM under load, ~30 s per
// format: above what unit.precision should cost, so that file's ctest leaves it out
// ([exhaustive]) and runs the sampled cases above.
TEST_CASE("rounding_simd: every level equals the baseline on all 2^32 fp32 patterns", "[exhaustive]") {
  const int64_t chunk = int64_t{1} << 22;
  std::vector<float> in(static_cast<std::size_t>(chunk)), base(in.size()), out(in.size());
  for (simd::Half h : {simd::Half::FP16, simd::Half::BF16})
    for (simd::Level l : simd::supported_levels()) {
      int64_t bad = 0, cb = 0, cl = 0;
      for (std::uint64_t start = 0; start < (std::uint64_t{1} << 32); start += static_cast<std::uint64_t>(chunk)) {
        for (int64_t i = 0; i < chunk; ++i) in[i] = simd_float_bits(static_cast<std::uint32_t>(start + i));
        cb += simd::round_span(h, in.data(), base.data(), chunk, true, simd::Level::Baseline);
        cl += simd::round_span(h, in.data(), out.data(), chunk, true, l);
        bad += std::memcmp(base.data(), out.data(), in.size() * 4) != 0;
      }
      INFO("level " << simd::level_name(l) << (h == simd::Half::FP16 ? " fp16" : " bf16"));
      CHECK(bad == 0);
      CHECK(cb == cl);
    }
}
