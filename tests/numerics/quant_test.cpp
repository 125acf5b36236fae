// Quantizers (core/numerics/quant) against PyTorch's casts and torchao, through the tables under tests/quant/
// (made by tests/quant/make_tables.py with torch 2.15 and torchao 0.18.0), so Debian's LibTorch 1.13
// (no float8 dtypes) is checked against the same references.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>
#include <fmt/format.h>

#include "catch.hpp"
#include "core/runtime/compat.hpp"
#include "core/numerics/quant.hpp"

using namespace mpt::quant;

namespace {

std::string table_path(const std::string& name) { return fmt::format("{}/tests/quant/{}", MPT_SOURCE_DIR, name); }

float f32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t u32(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// The 65536 codes of a run-length table ("START CODE" lines).
std::vector<int> read_rle(const std::string& name) {
  std::ifstream in(table_path(name));
  REQUIRE(in.good());
  std::vector<std::pair<int, int>> runs;
  std::string a, b;
  while (in >> a >> b) runs.emplace_back(std::stoi(a, nullptr, 16), std::stoi(b, nullptr, 16));
  std::vector<int> out(65536);
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const int end = r + 1 < runs.size() ? runs[r + 1].first : 65536;
    for (int i = runs[r].first; i < end; ++i) out[static_cast<std::size_t>(i)] = runs[r].second;
  }
  return out;
}

torch::Tensor bf16_patterns_as_fp32() {
  auto t = torch::arange(65536, torch::kInt).bitwise_left_shift(16);
  return t.view(torch::kFloat);
}

/// Mismatches of encode(x, e) against `expected`; NaN inputs skipped for formats without NaN
/// (torchao's sub-byte casts give them an arbitrary code).
std::int64_t mismatches(const torch::Tensor& x, Element e, const std::vector<int>& expected, std::string* first) {
  auto codes = encode(x, e);
  const auto* c = codes.data_ptr<std::uint8_t>();
  const auto* xv = x.data_ptr<float>();
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    if (!element_info(e).has_nan && std::isnan(xv[i])) continue;
    if (c[i] != expected[static_cast<std::size_t>(i)]) {
      if (bad++ == 0 && first)
        *first = "input bits " + std::to_string(u32(xv[i])) + ": mpt " + std::to_string(c[i]) + ", reference " +
                 std::to_string(expected[static_cast<std::size_t>(i)]);
    }
  }
  return bad;
}

const std::vector<std::pair<std::string, Element>> kTableFormats = {
    {"e4m3fn", Element::E4M3}, {"e5m2", Element::E5M2}, {"e8m0fnu", Element::E8M0},
    {"e2m3", Element::E2M3},   {"e3m2", Element::E3M2}, {"e2m1", Element::E2M1}};

/// FNV-1a 64 over the bytes of fp32 tensor t, every NaN counted as 0x7FC00000 (as make_tables.py does).
std::uint64_t fnv1a64(const torch::Tensor& t) {
  auto c = torch::where(torch::isnan(t), torch::full_like(t, std::numeric_limits<float>::quiet_NaN()), t).contiguous();
  const auto* p = reinterpret_cast<const unsigned char*>(c.data_ptr<float>());
  std::uint64_t h = 0xCBF29CE484222325ULL;
  for (std::int64_t i = 0; i < c.numel() * 4; ++i) h = (h ^ p[i]) * 0x100000001B3ULL;
  return h;
}

}  // namespace

// ───────────────────────────── element casts ─────────────────────────────

TEST_CASE("all 2^16 bf16 patterns: encode equals torch's casts and torchao's sub-byte casts", "[quant]") {
  auto x = bf16_patterns_as_fp32();
  for (const auto& [name, e] : kTableFormats) {
    INFO("format " << name);
    std::string first;
    const auto expected = read_rle("bf16_" + name + ".rle");
    const auto bad = mismatches(x, e, expected, &first);
    INFO(first);
    CHECK(bad == 0);
  }
}

TEST_CASE("random fp32, ties, subnormals, overflow, inf and NaN: encode equals the references", "[quant]") {
  std::ifstream in(table_path("fp32_cases.txt"));
  REQUIRE(in.good());
  std::string line;
  std::vector<float> xs;
  std::vector<std::vector<int>> cols(kTableFormats.size());
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string b;
    ls >> b;
    xs.push_back(f32(static_cast<std::uint32_t>(std::stoul(b, nullptr, 16))));
    for (auto& c : cols) {
      ls >> b;
      c.push_back(std::stoi(b, nullptr, 16));
    }
  }
  REQUIRE(xs.size() > 2500);
  auto x = torch::from_blob(xs.data(), {static_cast<std::int64_t>(xs.size())}, torch::kFloat).clone();
  for (std::size_t k = 0; k < kTableFormats.size(); ++k) {
    INFO("format " << kTableFormats[k].first);
    std::string first;
    const auto bad = mismatches(x, kTableFormats[k].second, cols[k], &first);
    INFO(first);
    CHECK(bad == 0);
  }
}

TEST_CASE("element facts and decode: max, smallest subnormal, every code round-trips", "[quant]") {
  struct F { Element e; double max, min_sub; int codes; };
  for (const F& f : {F{Element::E4M3, 448, std::ldexp(1.0, -9), 256}, F{Element::E5M2, 57344, std::ldexp(1.0, -16), 256},
                     F{Element::E2M3, 7.5, 0.125, 64}, F{Element::E3M2, 28, 0.0625, 64}, F{Element::E2M1, 6, 0.5, 16}}) {
    const auto& fi = element_info(f.e);
    INFO(fi.name);
    CHECK(fi.max == f.max);
    CHECK(fi.min_subnormal == f.min_sub);
    CHECK(decode_value(1, f.e) == f.min_sub);
    double largest = 0;
    for (int c = 0; c < f.codes; ++c) {
      const float v = decode_value(static_cast<std::uint8_t>(c), f.e);
      if (std::isnan(v)) continue;
      if (std::isfinite(v)) largest = std::max(largest, static_cast<double>(std::fabs(v)));
      CHECK(encode_value(v, f.e) == c);  // −0 keeps its sign bit
    }
    CHECK(largest == f.max);
  }
  const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) CHECK(decode_value(static_cast<std::uint8_t>(c), Element::E2M1) == e2m1[c]);
  CHECK(decode_value(0, Element::E8M0) == std::ldexp(1.0f, -127));
  CHECK(std::isnan(decode_value(0xFF, Element::E8M0)));
}

TEST_CASE("overflow rules: PyTorch's default, OCP's non-saturating mode, saturation", "[quant]") {
  const float inf = std::numeric_limits<float>::infinity();
  // PyTorch 2.15: E4M3 saturates (inf too), E5M2 does not.
  CHECK(encode_value(480.0f, Element::E4M3) == 0x7E);
  CHECK(encode_value(inf, Element::E4M3) == 0x7E);
  CHECK(encode_value(-1e30f, Element::E4M3) == 0xFE);
  CHECK(encode_value(61440.0f, Element::E5M2) == 0x7C);  // tie between 57344 and 65536 -> even -> inf
  CHECK(encode_value(61439.0f, Element::E5M2) == 0x7B);
  const CastOptions nonsat{Rounding::NearestEven, Overflow::NonSaturating, 0};
  const CastOptions sat{Rounding::NearestEven, Overflow::Saturate, 0};
  CHECK(encode_value(464.0f, Element::E4M3, nonsat) == 0x7E);  // tie 448 | 480 -> 448 (even), in range
  CHECK(encode_value(465.0f, Element::E4M3, nonsat) == 0x7F);  // rounds to 480: NaN
  CHECK(encode_value(inf, Element::E4M3, nonsat) == 0x7F);
  CHECK(encode_value(1e9f, Element::E5M2, sat) == 0x7B);
  CHECK(encode_value(inf, Element::E5M2, sat) == 0x7C);  // inf is representable: kept
  CHECK(encode_value(100.0f, Element::E2M1) == 0x7);
  CHECK_THROWS_AS(encode_value(100.0f, Element::E2M1, nonsat), std::invalid_argument);
  CHECK_THROWS_AS(encode(torch::ones({2}), Element::FP32), std::invalid_argument);
}

TEST_CASE("stochastic rounding: reproducible, only the two neighbours, unbiased", "[quant]") {
  const std::int64_t n = 100000;
  // 1 + 0.3 * 2^-3 lies between the E4M3 neighbours 1 and 1.125 at 0.3 of the gap. It is not exactly
  // representable in fp32, so p = (x - 1) / 0.125 is computed from the fp32 value.
  const float x = 1.0f + 0.3f * 0.125f;
  const double p = (static_cast<double>(x) - 1.0) / 0.125;
  auto t = torch::full({n}, x);
  const CastOptions sr{Rounding::Stochastic, std::nullopt, 42};
  auto a = cast(t, Element::E4M3, sr), b = cast(t, Element::E4M3, sr);
  CHECK(torch::equal(a, b));
  CHECK_FALSE(torch::equal(a, cast(t, Element::E4M3, CastOptions{Rounding::Stochastic, std::nullopt, 43})));
  CHECK(((a == 1.0f) | (a == 1.125f)).all().item<bool>());
  const double up = (a == 1.125f).to(torch::kDouble).mean().item<double>();
  // Binomial(n, p): the frequency's standard deviation is sqrt(p(1−p)/n) ≈ 0.00145; 5 of them.
  CHECK(std::fabs(up - p) < 5.0 * std::sqrt(p * (1 - p) / static_cast<double>(n)));
  // A representable value never moves; nor does a subnormal grid point.
  CHECK(torch::equal(cast(torch::full({1000}, 1.125f), Element::E4M3, sr), torch::full({1000}, 1.125f)));
  CHECK(torch::equal(cast(torch::full({1000}, std::ldexp(3.0f, -9)), Element::E4M3, sr), torch::full({1000}, std::ldexp(3.0f, -9))));
}

// ───────────────────────────── block quantizers vs torchao ─────────────────────────────

TEST_CASE("MX, NVFP4 and float8 block quantizers equal torchao 0.18 on random, adversarial, NaN and inf blocks", "[quant]") {
  std::ifstream in(table_path("blocks.txt"));
  REQUIRE(in.good());
  std::string tok;
  std::int64_t R = 0, C = 0;
  torch::Tensor x;
  int cases = 0, inputs = 0;
  while (in >> tok) {
    if (tok == "input") {  // the tensor the following cases quantize
      in >> R >> C;
      std::vector<float> xs(static_cast<std::size_t>(R * C));
      for (auto& v : xs) {
        in >> tok;
        v = f32(static_cast<std::uint32_t>(std::stoul(tok, nullptr, 16)));
      }
      x = torch::from_blob(xs.data(), {R, C}, torch::kFloat).clone();
      ++inputs;
      continue;
    }
    REQUIRE(tok == "case");
    std::string name, elem, scale, rule;
    std::int64_t br, bc, rows;
    int ts, pow2;
    in >> name >> elem >> scale >> rule >> br >> bc >> ts >> pow2 >> rows;
    QuantSpec s;
    s.element = parse_element(elem);
    s.block = {br, bc};
    s.scale = scale == "E8M0" ? ScaleFormat::E8M0 : scale == "UE4M3" ? ScaleFormat::UE4M3 : ScaleFormat::FP32;
    s.rule = rule == "CEIL" ? E8M0Rule::CEIL : rule == "EVEN" ? E8M0Rule::EVEN : rule == "RCEIL" ? E8M0Rule::RCEIL : E8M0Rule::FLOOR;
    s.tensor_scale = ts != 0;
    s.pow2_scale = pow2 != 0;
    auto q = quantize(x.narrow(0, 0, rows).contiguous(), s);
    INFO("case " << name);
    in >> tok;
    REQUIRE(tok == "codes");
    // A NaN that arithmetic produces has no specified sign or payload (IEEE 754-2019 §6.3; torch's CPU
    // max reduction returns 0xFFFFFFFF for a NaN amax): two NaN codes, or two NaN scales, are equal here.
    // The casts' own NaN rule (the sign is kept) is checked exactly by the element tables.
    const auto* c = q.codes.data_ptr<std::uint8_t>();
    std::int64_t bad_codes = 0;
    for (std::int64_t i = 0; i < rows * C; ++i) {
      in >> tok;
      const auto ref = static_cast<std::uint8_t>(std::stoi(tok, nullptr, 16));
      bad_codes += c[i] != ref && !(std::isnan(decode_value(c[i], s.element)) && std::isnan(decode_value(ref, s.element)));
    }
    CHECK(bad_codes == 0);
    in >> tok;
    REQUIRE(tok == "scales");
    std::int64_t bad_scales = 0;
    const std::int64_t nscales = q.scale.numel();
    for (std::int64_t i = 0; i < nscales; ++i) {
      in >> tok;
      if (s.scale == ScaleFormat::FP32) {
        const float mine = q.scale.data_ptr<float>()[i], ref = f32(static_cast<std::uint32_t>(std::stoul(tok, nullptr, 16)));
        bad_scales += u32(mine) != u32(ref) && !(std::isnan(mine) && std::isnan(ref));
      } else
        bad_scales += q.scale_codes.data_ptr<std::uint8_t>()[i] != std::stoi(tok, nullptr, 16);
    }
    CHECK(bad_scales == 0);
    in >> tok;
    REQUIRE(tok == "values_fnv1a64");
    in >> tok;
    CHECK(fnv1a64(q.values) == std::stoull(tok, nullptr, 16));
    if (s.rule == E8M0Rule::RCEIL && inputs == 1) {
      // The exact ceiling differs from torchao's eager fp32 log2 only where amax / elem_max lies just
      // above a power of two: row 14 (amax 448 · 2^−10 · (1 + 2^−23): E4M3, E5M2 and E3M2, whose maxima
      // 448, 57344, 28 are all 1.75 · 2^k) and row 16 (6 · 2^20 · (1 + 2^−22), for
      // E2M1); there it is one binade higher, everywhere else equal (E2M3's 7.5 meets no such row).
      QuantSpec ex = s;
      ex.rule = E8M0Rule::RCEIL_EXACT;
      auto qe = quantize(x, ex);
      auto diff = (qe.scale_codes.to(torch::kInt) - q.scale_codes.to(torch::kInt));
      const std::int64_t row = elem == "e2m1" ? 16 : 14;
      const bool boundary_row = elem != "e2m3";
      CHECK((diff.ne(0).sum().item<std::int64_t>()) == (boundary_row ? 2 : 0));
      if (boundary_row) CHECK(torch::equal(diff[row], torch::ones({2}, torch::kInt)));
    }
    ++cases;
  }
  CHECK(cases == 29);  // 19 on the random and adversarial rows, 10 fp8 cases on the NaN / ±inf rows
  CHECK(inputs == 2);
}

TEST_CASE("block shapes: 2-D blocks equal 1-D blocks when every row of a block has its amax, bad shapes throw", "[quant]") {
  // Rows 16g..16g+15 are permutations, within each 16-column block, of one base row: every 1x16 block
  // of a row has the amax of its 16x16 block, so the two granularities quantize identically.
  torch::manual_seed(3);
  auto base = torch::randn({2, 64}) * torch::exp2(torch::randint(-8, 8, {2, 64}).to(torch::kFloat));
  std::vector<torch::Tensor> rows;
  for (int g = 0; g < 2; ++g)
    for (int r = 0; r < 16; ++r) {
      auto row = base[g].view({4, 16});
      rows.push_back(row.index_select(1, torch::randperm(16)).reshape({64}));
    }
  auto x = torch::stack(rows);
  for (ScaleFormat sf : {ScaleFormat::FP32, ScaleFormat::E8M0, ScaleFormat::UE4M3}) {
    QuantSpec one;
    one.element = sf == ScaleFormat::UE4M3 ? Element::E2M1 : Element::E4M3;
    one.scale = sf;
    one.block = {1, 16};
    QuantSpec two = one;
    two.block = {16, 16};
    CHECK(torch::equal(quantize(x, one).values, quantize(x, two).values));
  }
  QuantSpec t;
  t.element = Element::E4M3;
  QuantSpec whole = t;
  whole.block = {32, 64};
  CHECK(torch::equal(quantize(x, t).values, quantize(x, whole).values));  // {0,0} is the whole tensor

  QuantSpec mx;
  mx.element = Element::E4M3;
  mx.scale = ScaleFormat::E8M0;
  mx.block = {1, 32};
  CHECK_THROWS_WITH(quantize(torch::ones({3, 48}), mx), Catch::Contains("block 1x32 does not divide") && Catch::Contains("multiple of 32"));
  mx.block = {16, 16};
  CHECK_THROWS_AS(quantize(torch::ones({8, 16}), mx), std::invalid_argument);
  CHECK_THROWS_AS(rht16(torch::ones({2, 24}), 1), std::invalid_argument);
}

TEST_CASE("1x128 tiles are row scaling of each 128-column slice, stochastic block rounding is seeded", "[quant]") {
  torch::manual_seed(4);
  auto x = torch::randn({4, 256}) * torch::exp2(torch::randint(-6, 6, {4, 256}).to(torch::kFloat));
  QuantSpec tile;
  tile.element = Element::E4M3;
  tile.block = {1, 128};
  QuantSpec row = tile;
  row.block = {1, 0};
  auto left = quantize(x.narrow(1, 0, 128).contiguous(), row).values, right = quantize(x.narrow(1, 128, 128).contiguous(), row).values;
  CHECK(torch::equal(quantize(x, tile).values, torch::cat({left, right}, 1)));
  QuantSpec sr;
  sr.element = Element::E2M1;
  sr.scale = ScaleFormat::UE4M3;
  sr.block = {1, 16};
  sr.rounding = Rounding::Stochastic;
  sr.seed = 5;
  CHECK(torch::equal(quantize(x, sr).values, quantize(x, sr).values));
  QuantSpec sr2 = sr;
  sr2.seed = 6;
  CHECK_FALSE(torch::equal(quantize(x, sr).values, quantize(x, sr2).values));
}

TEST_CASE("amax = 0: every scale rule gives zeros and a finite scale (torchao's guards)", "[quant]") {
  auto z = torch::zeros({4, 32});
  std::vector<QuantSpec> specs(6);
  specs[0].element = Element::E4M3;                                             // fp32: 448 / 1e-12
  specs[1].element = Element::E4M3, specs[1].scale = ScaleFormat::E8M0, specs[1].block = {1, 32};
  specs[2] = specs[1], specs[2].rule = E8M0Rule::RCEIL;
  specs[3].element = Element::E2M1, specs[3].scale = ScaleFormat::UE4M3, specs[3].block = {1, 16};
  specs[4] = specs[3], specs[4].tensor_scale = true;
  specs[5] = specs[0], specs[5].block = {1, 0}, specs[5].pow2_scale = true;
  for (const auto& s : specs) {
    auto q = quantize(z, s);
    CHECK(torch::equal(q.values, z));
    CHECK(torch::isfinite(q.scale).all().item<bool>());
    CHECK(q.flushed == 0);
  }
  CHECK(quantize(z, specs[0]).scale.item<float>() == 1.0f / static_cast<float>(448.0 / 1e-12));
  CHECK(quantize(z, specs[3]).scale[0][0].item<float>() == std::ldexp(1.0f, -6));  // clamp at finfo(e4m3).tiny
}

TEST_CASE("ledger counts on a hand-made tensor are exact", "[quant]") {
  // E8M0 FLOOR on one 1x8 block with amax 500: 2^(floor(log2 500) − 8) = 1, so 500 and −460 clip at
  // 448 (FLOOR's known clipping), and 2^−10 (a tie with 0), 2^−11, 2^−12 are below half of E4M3's
  // smallest subnormal 2^−9 or at it: flushed.
  const std::vector<float> v = {500.0f, std::ldexp(1.0f, -11), std::ldexp(1.0f, -12), 1.0f, 0.0f, -460.0f, 3.0f, std::ldexp(1.0f, -10)};
  auto a = torch::tensor(v).view({1, 8});
  GemmRecipe r;
  r.a.element = Element::E4M3;
  r.a.scale = ScaleFormat::E8M0;
  r.a.block = {1, 8};
  GemmLedger lg;
  auto c = quantized_gemm(a, torch::ones({1, 8}), r, 0, &lg);
  CHECK(lg.a.amax == 500.0);
  CHECK(lg.a.scale_min == 1.0);
  CHECK(lg.a.scale_max == 1.0);
  CHECK(lg.a.saturated_frac == 2.0 / 8.0);
  CHECK(lg.a.flushed_frac == 3.0 / 8.0);
  CHECK(lg.b.saturated_frac == 0.0);
  CHECK(c.item<float>() == 448.0f + 1.0f - 448.0f + 3.0f);
  const float ref = torch::tensor(v).sum().item<float>();
  // The fp32 reference is one dot product of 8 terms: its relative rounding error is below 8 · 2^−24 < 1e−6.
  CHECK(lg.rel_error == Approx(std::fabs(4.0 - ref) / ref).epsilon(1e-6));
}

// ───────────────────────────── RHT, accumulation, the linear layer ─────────────────────────────

TEST_CASE("16x16 random Hadamard transform is orthogonal and leaves A·Bᵀ unchanged", "[quant]") {
  auto t = rht16_matrix(7);
  CHECK(torch::equal(t.mm(t.t()), torch::eye(16)));  // entries ±1/4: every product and sum is exact
  CHECK_FALSE(torch::equal(t, rht16_matrix(8)));
  // Small integers: every transformed value is a multiple of 1/4 below 2^10, the products exact.
  torch::manual_seed(1);
  auto a = torch::randint(-8, 8, {8, 64}).to(torch::kFloat), b = torch::randint(-8, 8, {5, 64}).to(torch::kFloat);
  CHECK(torch::equal(rht16(a, 7).mm(rht16(b, 7).t()), a.mm(b.t())));
}

TEST_CASE("limited-precision accumulation: the error at K=4096 and promotion every 128", "[quant]") {
  CHECK(truncate_significand(torch::tensor({1.0f + std::ldexp(1.0f, -10)}), 10).item<float>() == 1.0f);
  CHECK(truncate_significand(torch::tensor({-(1.0f + std::ldexp(1.0f, -9) + std::ldexp(1.0f, -10))}), 10).item<float>() ==
        -(1.0f + std::ldexp(1.0f, -9)));
  // A, B uniform on [0,1): products have mean 1/4, the partial sums grow like j·c/4. Truncating a sum a
  // to p = 14 significant bits loses a fraction of ulp(a) ∈ (a·2^−14, a·2^−13], uniformly, so half of
  // it on average. Over the K/c additions of c = 4 products the expected loss, relative to the total,
  // is Σ_j (j·c/4)·[2^−15, 2^−14] / (K/4) ≈ K/(2c) · [2^−15, 2^−14] = [1/64, 1/32] for K = 4096
  // (DeepSeek-V3 reports about 2% on H800). With promotion every N_C = 128 each segment starts from
  // zero: N_C/(2c) · [2^−15, 2^−14]. The fluctuation of 512 uniform losses is ~1/sqrt(3·512) ≈ 3% of
  // their mean, well inside these factor-2 intervals.
  torch::manual_seed(11);
  const std::int64_t K = 4096, c = 4, nc = 128;
  auto a = torch::rand({16, K}), b = torch::rand({16, K});
  auto ref = a.to(torch::kDouble).mm(b.to(torch::kDouble).t());
  auto rel = [&](const Accumulator& acc) {
    return (gemm(a, b, acc).to(torch::kDouble) - ref).norm().item<double>() / ref.norm().item<double>();
  };
  const double e_limited = rel({14, static_cast<int>(c), 0});
  const double e_promoted = rel({14, static_cast<int>(c), static_cast<int>(nc)});
  const double e_fp32 = rel({});
  const double lo = static_cast<double>(K) / (2 * c) * std::ldexp(1.0, -15);
  CHECK(e_limited > lo);
  CHECK(e_limited <= 2 * lo);
  const double lo_p = static_cast<double>(nc) / (2 * c) * std::ldexp(1.0, -15);
  CHECK(e_promoted > lo_p);
  CHECK(e_promoted <= 2 * lo_p);
  CHECK(e_fp32 < e_promoted);
  WARN("K=4096, 14-bit accumulator, chunk 4: relative error " << e_limited << " without promotion, " << e_promoted
       << " with promotion every 128, " << e_fp32 << " fp32");
  CHECK_THROWS_AS(gemm(a, b, {14, 4, 130}), std::invalid_argument);
}

TEST_CASE("QuantLinear with the fp32 recipe equals torch::linear bit for bit, forward and backward", "[quant]") {
  torch::manual_seed(5);
  for (bool with_bias : {true, false}) {
    QuantLinear layer(24, 10, recipe("fp32"), with_bias);
    auto x = torch::randn({3, 7, 24}, torch::requires_grad());
    auto x_ref = x.detach().clone().requires_grad_(true);
    auto w_ref = layer->weight.detach().clone().requires_grad_(true);
    torch::Tensor b_ref = with_bias ? layer->bias.detach().clone().requires_grad_(true) : torch::Tensor();
    auto y = layer->forward(x);
    auto y_ref = torch::linear(x_ref, w_ref, b_ref);
    CHECK(torch::equal(y, y_ref));
    auto g = torch::randn_like(y);
    y.backward(g);
    y_ref.backward(g);
    CHECK(torch::equal(x.grad(), x_ref.grad()));
    CHECK(torch::equal(layer->weight.grad(), w_ref.grad()));
    if (with_bias) CHECK(torch::equal(layer->bias.grad(), b_ref.grad()));
    REQUIRE(layer->ledger().size() == 3);
    CHECK(layer->ledger()[0].gemm == "out");
    CHECK(layer->ledger()[1].gemm == "dgrad");
    CHECK(layer->ledger()[2].gemm == "wgrad");
    for (const auto& l : layer->ledger()) CHECK(l.rel_error == 0.0);
  }
}

TEST_CASE("QuantLinear with a limited-precision accumulator: each GEMM is quant::gemm, promotion shrinks the error",
          "[quant]") {
  // The fp32 recipe (no quantization) with DeepSeek-V3's accumulator model on all three GEMMs: the
  // layer's out, dgrad and wgrad must be exactly gemm() of the operands GemmRecipe names (out:
  // x [M,K] · W [N,K]ᵀ; dgrad: dy [M,N] · Wᵀ [K,N]ᵀ; wgrad: dyᵀ [N,M] · xᵀ [K,M]ᵀ), and promotion
  // to fp32 every N_C = 128 must cut the ledger's error of the out GEMM (K = 1024 = 8 N_C).
  const std::int64_t M = 16, K = 1024, N = 8;
  auto run = [&](const Accumulator& acc, torch::Tensor& y, torch::Tensor& gx, torch::Tensor& gw, double& err,
                 QuantLinear& layer) {
    QuantRecipe r = recipe("fp32");
    r.out.acc = r.dgrad.acc = r.wgrad.acc = acc;
    torch::manual_seed(21);  // the same W and b in both runs
    layer = QuantLinear(K, N, r, /*bias=*/true);
    torch::manual_seed(22);
    auto x = torch::rand({M, K}).requires_grad_(true);
    y = layer->forward(x);
    y.backward(torch::ones_like(y) / static_cast<double>(N));
    gx = x.grad();
    gw = layer->weight.grad();
    err = layer->ledger()[0].rel_error;
    return x.detach();
  };
  torch::Tensor y, gx, gw, y2, gx2, gw2;
  double e_limited = 0, e_promoted = 0;
  QuantLinear l1(nullptr), l2(nullptr);
  const Accumulator limited{14, 4, 0}, promoted{14, 4, 128};
  const auto x = run(limited, y, gx, gw, e_limited, l1);
  run(promoted, y2, gx2, gw2, e_promoted, l2);
  const auto w = l1->weight.detach();
  const auto dy = torch::ones({M, N}) / static_cast<double>(N);
  CHECK(torch::equal(y, gemm(x, w, limited) + l1->bias.detach()));
  CHECK(torch::equal(gx, gemm(dy, w.t().contiguous(), limited)));
  CHECK(torch::equal(gw, gemm(dy.t().contiguous(), x.t().contiguous(), limited)));
  // The truncation did something in each GEMM, so the three checks above tell acc from plain fp32.
  CHECK(!torch::equal(y, torch::addmm(l1->bias.detach(), x, w.t())));
  CHECK(!torch::equal(gx, dy.mm(w)));
  CHECK(!torch::equal(gw, dy.t().mm(x)));
  CHECK(e_limited > 0);
  CHECK(e_promoted < e_limited);
  CHECK(torch::equal(l2->weight.detach(), w));
  CHECK(torch::equal(y2, gemm(x, w, promoted) + l1->bias.detach()));
}

TEST_CASE("QuantLinear trains under each named recipe and keeps a ledger per GEMM and step", "[quant]") {
  for (const std::string name : {"tensorwise", "rowwise", "blockwise", "mxfp8", "mxfp8_floor", "nvfp4"}) {
    INFO(name);
    torch::manual_seed(9);
    QuantLinear layer(128, 128, recipe(name));
    auto target = torch::randn({128, 128}) * 0.05;
    auto x = torch::randn({128, 128});
    auto y_star = x.mm(target.t());
    torch::optim::SGD opt(layer->parameters(), torch::optim::SGDOptions(0.5));
    double first = 0, last = 0;
    for (int step = 0; step < 20; ++step) {
      opt.zero_grad();
      auto loss = torch::mse_loss(layer->forward(x), y_star);
      loss.backward();
      opt.step();
      (step == 0 ? first : last) = loss.item<double>();
    }
    CHECK(last < first);
    REQUIRE(layer->ledger().size() == 60);
    CHECK(layer->ledger().back().step == 19);
    CHECK(layer->ledger().back().gemm == "wgrad");
    for (const auto& l : layer->ledger()) {
      CHECK(std::isfinite(l.rel_error));
      CHECK(l.rel_error > 0.0);
    }
  }
  CHECK_THROWS_AS(recipe("fp9"), std::invalid_argument);
}

// ───────────────────────────── issue 18: mpt fp8's additions ─────────────────────────────

TEST_CASE("delayed scaling follows Transformer Engine's amax history, step by step", "[quant][delayed]") {
  // TE (transformer_engine/pytorch/fp8.py): history[0] = this step's amax; at the step's end
  // amax = max(history) (or history[0]), scale = (fp8_max / amax) / 2^margin where amax > 0 and
  // finite, then torch.roll(history, -1) and history[0] = 0. The scale starts at 1.
  DelayedScaling d;
  d.amax_history_len = 3;
  AmaxHistory h(d, 448.0);
  CHECK(h.scale() == 1.0);
  const double amaxes[] = {2.0, 1.0, 1.0, 1.0, 1.0};
  // An amax of 2 at step 0 keeps the scale at 448/2 for the 3 steps the history holds it (steps 1..3),
  // then 448/1.
  const double expect[] = {224.0, 224.0, 224.0, 448.0, 448.0};
  for (int s = 0; s < 5; ++s) {
    h.record(amaxes[s]);
    h.update();
    INFO("step " << s);
    CHECK(h.scale() == expect[s]);
    CHECK(h.history()[0] == 0.0);
  }
  d.amax_compute_algo = AmaxComputeAlgo::MostRecent;
  d.margin = 1;
  AmaxHistory r(d, 57344.0);
  r.record(4.0);
  r.update();
  CHECK(r.scale() == 57344.0 / 4.0 / 2.0);
  r.record(1.0);
  r.update();
  CHECK(r.scale() == 57344.0 / 2.0);  // the most recent amax only
  // amax 0, inf or NaN keep the previous scale (torch.where(amax > 0 & isfinite(amax), sf, scale)).
  for (double bad : {0.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    r.record(bad);
    r.update();
    CHECK(r.scale() == 57344.0 / 2.0);
  }
  d.amax_history_len = 0;
  CHECK_THROWS_AS(AmaxHistory(d, 448.0), std::invalid_argument);
  CHECK(parse_amax_compute_algo("most_recent") == AmaxComputeAlgo::MostRecent);
  CHECK_THROWS_AS(parse_amax_compute_algo("mean"), std::invalid_argument);
}

TEST_CASE("a static (delayed) scale: x·s cast and clamped, saturation counted, bf16 elements", "[quant][delayed]") {
  QuantSpec s;
  s.element = Element::E4M3;
  s.static_scale = 224.0;  // the scale of amax 2, applied to a tensor of amax 1000
  auto x = torch::tensor({1.0f, 2.0f, 1000.0f, -3.0f});
  const Quantized q = quantize(x, s);
  CHECK(q.saturated == 2);  // 1000·224 and 3·224 > 448
  CHECK(q.saturated_blocks == 1);
  CHECK(q.values[0].item<float>() == 1.0f);
  CHECK(q.values[2].item<float>() == 2.0f);  // 448 / 224
  CHECK(q.values[3].item<float>() == -2.0f);
  s.static_scale = -1;
  CHECK_THROWS_AS(quantize(x, s), std::invalid_argument);
  s.static_scale = 2;
  s.scale = ScaleFormat::E8M0;
  CHECK_THROWS_AS(quantize(x, s), std::invalid_argument);

  QuantSpec b;
  b.element = Element::BF16;
  auto y = torch::tensor({3.4e38f, 1e-45f, 1.0f + 1.0f / 256, 0.0f});
  const Quantized qb = quantize(y, b);
  CHECK(torch::equal(qb.values, y.to(torch::kBFloat16).to(torch::kFloat)));
  CHECK(qb.saturated == 1);  // 3.4e38 rounds above bf16's max: inf
  CHECK(qb.flushed == 1);    // an fp32 subnormal below bf16's
  CHECK(qb.amax == Approx(3.4e38));
  CHECK(torch::equal(cast(y, Element::BF16), qb.values));
  CHECK_THROWS_AS(encode_value(1.0f, Element::BF16), std::invalid_argument);
}

TEST_CASE("saturated blocks: MX FLOOR clips a block whose amax mantissa exceeds 1.75, RCEIL does not", "[quant]") {
  auto x = torch::full({2, 32}, 0.5f);
  x[0][7] = 1.9f;  // FLOOR: 2^(0 - 8) → 1.9·256 = 486.4 > 448
  QuantSpec s;
  s.element = Element::E4M3;
  s.block = {1, 32};
  s.scale = ScaleFormat::E8M0;
  s.rule = E8M0Rule::FLOOR;
  const Quantized f = quantize(x, s);
  CHECK(f.blocks == 2);
  CHECK(f.saturated_blocks == 1);
  CHECK(f.saturated == 1);
  s.rule = E8M0Rule::RCEIL;
  const Quantized r = quantize(x, s);
  CHECK(r.saturated_blocks == 0);
  CHECK(r.saturated == 0);
}

TEST_CASE("recipe options, shape errors and stored bytes", "[quant]") {
  RecipeOptions o;
  o.grad_element = Element::E4M3;
  CHECK(recipe("tensorwise", o).dgrad.a.element == Element::E4M3);
  CHECK(recipe("tensorwise").wgrad.a.element == Element::E5M2);
  o.grad_element = Element::E5M2;
  CHECK(recipe("mxfp8", o).wgrad.a.element == Element::E5M2);
  CHECK(recipe("mxfp8", o).out.a.element == Element::E4M3);
  o.tile = 64;
  o.weight_block = 32;
  const QuantRecipe bw = recipe("blockwise", o);
  CHECK(bw.out.a.block.cols == 64);
  CHECK(bw.out.b.block.rows == 32);
  CHECK(recipe("bf16").out.a.element == Element::BF16);
  CHECK(std::find(recipe_names().begin(), recipe_names().end(), "bf16") != recipe_names().end());
  o.mx_block = 0;
  CHECK_THROWS_AS(recipe("mxfp8", o), std::invalid_argument);

  CHECK(shape_error(recipe("blockwise"), 128, 256, 256).empty());
  CHECK(shape_error(recipe("blockwise"), 128, 784, 256).find("out operand A (x [128, 784])") != std::string::npos);
  CHECK(shape_error(recipe("blockwise"), 128, 256, 10).find("out operand B (W [10, 256])") != std::string::npos);
  CHECK(shape_error(recipe("mxfp8"), 48, 256, 256).find("wgrad operand A (dy^T [256, 48])") != std::string::npos);
  CHECK(shape_error(recipe("tensorwise"), 7, 784, 10).empty());

  // tensorwise, [256, 256], m = 128: fp32 master W, b + one E4M3 copy of W (per tensor: W^T is the same
  // tensor); x kept in E4M3; fp32 gradients; fp32 scales of W and x^T.
  const StoredBytes t = stored_bytes(recipe("tensorwise"), 128, 256, 256);
  CHECK(t.weights == (65536 + 256) * 4 + 65536);
  CHECK(t.activations == 128 * 256);
  CHECK(t.gradients == (65536 + 256) * 4);
  CHECK(t.scales == 8);
  // mxfp8: a row-wise and a column-wise copy of W, each with 256·8 E8M0 scales; x^T [256, 128] 1x32: 1024.
  const StoredBytes m = stored_bytes(recipe("mxfp8"), 128, 256, 256);
  CHECK(m.weights == (65536 + 256) * 4 + 2 * 65536);
  CHECK(m.scales == 2 * 2048 + 1024);
  // nvfp4: one E2M1 copy of W (16x16 blocks serve W and W^T) with 256 UE4M3 block scales + the fp32
  // tensor scale; x^T [256, 128] in 1x16 blocks: 2048 scales + its tensor scale; x at half a byte.
  const StoredBytes n4 = stored_bytes(recipe("nvfp4"), 128, 256, 256);
  CHECK(n4.weights == (65536 + 256) * 4 + 65536 / 2);
  CHECK(n4.activations == 128 * 256 / 2);
  CHECK(n4.scales == (256 + 4) + (2048 + 4));
  // mxfp4: 1x32 blocks differ under transposition: a row-wise and a column-wise copy, E8M0 scales.
  const StoredBytes m4 = stored_bytes(recipe("mxfp4"), 128, 256, 256);
  CHECK(m4.weights == (65536 + 256) * 4 + 2 * 65536 / 2);
  CHECK(m4.scales == 2 * 2048 + 1024);
  const StoredBytes f = stored_bytes(recipe("fp32"), 128, 256, 256);
  CHECK(f.weights == (65536 + 256) * 4);
  CHECK(f.activations == 128 * 256 * 4);
  CHECK(f.scales == 0);
}

TEST_CASE("measured_stored_bytes: tensors in LibTorch's low-bit dtypes take the computed bytes", "[quant][memory]") {
  // The same [256, 256] layer, m = 128 (and an odd-sized one: E2M1's two codes a byte round up).
  for (const auto& [m, k, n] : {std::array<std::int64_t, 3>{128, 256, 256}, std::array<std::int64_t, 3>{32, 96, 32}}) {
    for (const char* name : {"fp32", "bf16", "tensorwise", "rowwise", "mxfp8", "mxfp8_floor", "nvfp4", "mxfp4"}) {
      INFO(name << " m=" << m << " k=" << k << " n=" << n);
      const QuantRecipe r = recipe(name);
      if (!shape_error(r, m, k, n).empty()) continue;
      const StoredBytes c = stored_bytes(r, m, k, n);
      const auto got = measured_stored_bytes(r, m, k, n);
      const bool fp4 = r.out.a.element == Element::E2M1, e8m0 = r.out.a.scale == ScaleFormat::E8M0;
      const bool f8 = r.out.a.element == Element::E4M3 || r.out.a.element == Element::E5M2;
      const bool expect = (!fp4 || mpt::compat::kHasFloat4) && (!(fp4 || f8) || mpt::compat::kHasFloat8) &&
                          (!e8m0 || mpt::compat::kHasFloat8E8M0) && (!(r.out.a.scale == ScaleFormat::UE4M3) || mpt::compat::kHasFloat8);
      REQUIRE(got.has_value() == expect);
      if (!got) continue;
      CHECK(got->weights == c.weights);
      CHECK(got->activations == c.activations);
      CHECK(got->gradients == c.gradients);
      CHECK(got->scales == c.scales);
    }
  }
  // No LibTorch has an FP6 dtype: an E2M3 weight copy is not measurable.
  QuantRecipe six = recipe("mxfp8");
  six.out.b.element = Element::E2M3;
  CHECK_FALSE(measured_stored_bytes(six, 128, 256, 256).has_value());
}

TEST_CASE("QuantLinear with delayed scaling: scale 1 first, then the previous step's amax, saturates on a jump", "[quant][delayed]") {
  torch::manual_seed(4);
  QuantLinear cur(64, 32, recipe("tensorwise"));
  QuantLinear del(64, 32, recipe("tensorwise"));
  del->weight.data().copy_(cur->weight);
  del->bias.data().copy_(cur->bias);
  DelayedScaling d;
  d.amax_history_len = 2;
  del->set_delayed_scaling(d);
  REQUIRE(del->amax_.size() == 3);
  auto x = torch::rand({16, 64}) * 0.5;  // amax < 0.5: scale 1 fits without saturation
  for (auto* l : {&cur, &del}) {
    (*l)->forward(x).sum().backward();
    (*l)->update_scales();
  }
  // The first step quantized x with scale 1 (E4M3 of x itself).
  QuantSpec one;
  one.element = Element::E4M3;
  one.static_scale = 1.0;
  const auto first_out = del->ledger()[0];
  CHECK(first_out.a.scale_max == 1.0);
  CHECK(del->amax_[0].scale() == static_cast<double>(448.0f / static_cast<float>(x.abs().max().item<float>())));
  // A batch 10x larger: current scaling fits it, delayed saturates with the old scale.
  auto big = x * 10;
  cur->forward(big).sum().backward();
  del->forward(big).sum().backward();
  CHECK(cur->ledger()[3].a.saturated_frac <= 1.0 / big.numel());
  CHECK(del->ledger()[3].a.saturated_frac > 0.5);
  // Eval mode records nothing: the history is unchanged by a forward.
  del->update_scales();
  const auto before = del->amax_[0].history();
  del->eval();
  del->forward(x * 1000);
  CHECK(del->amax_[0].history() == before);
  QuantLinear rw(64, 32, recipe("rowwise"));
  CHECK_THROWS_AS(rw->set_delayed_scaling(d), std::invalid_argument);
}
