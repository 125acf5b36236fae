// GradScaler traces (hand-computed from torch.cuda.amp.GradScaler / _amp_update_scale_),
// state round trip, hysteresis and min_scale (Megatron/DeepSpeed), emulated storage.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "catch.hpp"
#include "core/train/amp.hpp"
#include "core/numerics/quant.hpp"
#include "core/errors.hpp"
#include "core/runtime/runtime.hpp"

using namespace mpt;

namespace {

GradScaler::Options opts(int64_t interval, int64_t hysteresis = 1) {
  GradScaler::Options o;
  o.growth_interval = interval;
  o.hysteresis = hysteresis;
  return o;
}

// One iteration with a parameter whose gradient is finite or inf; returns whether the step ran.
bool iteration(GradScaler& s, bool overflow, int* steps_run) {
  auto p = torch::ones({3}, torch::requires_grad());
  auto g = torch::full({3}, 4.0f);
  if (overflow) g[1] = INFINITY;
  p.mutable_grad() = g;
  bool ran = s.step({p}, [&] { ++*steps_run; });
  s.update();
  return ran;
}

}  // namespace

TEST_CASE("GradScaler defaults are PyTorch's", "[amp]") {
  GradScaler s;
  CHECK(s.get_scale() == 65536.0f);
  CHECK(s.options().growth_factor == 2.0);
  CHECK(s.options().backoff_factor == 0.5);
  CHECK(s.options().growth_interval == 2000);
  CHECK(s.growth_tracker() == 0);
  auto sd = s.state_dict();
  CHECK(sd["scale"].get<double>() == 65536.0);
  CHECK(sd["_growth_tracker"].get<int64_t>() == 0);
}

TEST_CASE("GradScaler trace: interval 3, overflow pattern 0,0,0,1,0,0,0 from 2^16", "[amp]") {
  GradScaler s(opts(3));
  const std::vector<int> pattern = {0, 0, 0, 1, 0, 0, 0};
  // After each update (worked by hand from _amp_update_scale_):
  const std::vector<float> scale = {65536, 65536, 131072, 65536, 65536, 65536, 131072};
  const std::vector<int64_t> tracker = {1, 2, 0, 0, 1, 2, 0};
  const std::vector<bool> ran = {true, true, true, false, true, true, true};
  int steps = 0;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    INFO("iteration " << i + 1);
    CHECK(iteration(s, pattern[i], &steps) == ran[i]);
    CHECK(s.get_scale() == scale[i]);
    CHECK(s.growth_tracker() == tracker[i]);
  }
  CHECK(steps == 6);
}

TEST_CASE("GradScaler state saved mid-interval continues exactly in a fresh scaler", "[amp]") {
  const std::vector<int> pattern = {0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0};
  GradScaler ref(opts(4));
  int steps = 0;
  std::vector<float> ref_scales;
  std::vector<int64_t> ref_trackers;
  for (int o : pattern) {
    iteration(ref, o, &steps);
    ref_scales.push_back(ref.get_scale());
    ref_trackers.push_back(ref.growth_tracker());
  }
  for (std::size_t cut = 1; cut < pattern.size(); ++cut) {
    INFO("saved after iteration " << cut);
    GradScaler a(opts(4));
    for (std::size_t i = 0; i < cut; ++i) iteration(a, pattern[i], &steps);
    const json saved = a.state_dict();
    GradScaler b;  // fresh, PyTorch defaults: everything must come from the dict
    b.load_state_dict(json::parse(saved.dump()));
    CHECK(b.state_dict() == saved);
    for (std::size_t i = cut; i < pattern.size(); ++i) {
      iteration(b, pattern[i], &steps);
      CHECK(b.get_scale() == ref_scales[i]);
      CHECK(b.growth_tracker() == ref_trackers[i]);
    }
  }
  // a concrete mid-interval save: tracker 2 of 4 survives the round trip
  GradScaler a(opts(4));
  iteration(a, 0, &steps);
  iteration(a, 0, &steps);
  GradScaler b;
  b.load_state_dict(a.state_dict());
  CHECK(b.growth_tracker() == 2);
  iteration(b, 0, &steps);
  iteration(b, 0, &steps);
  CHECK(b.get_scale() == 131072.0f);
  CHECK(b.growth_tracker() == 0);
}

TEST_CASE("GradScaler state_dict round trip of an odd scale is exact", "[amp]") {
  GradScaler::Options o;
  o.init_scale = 3.0e-7;  // not a power of two: stored as the nearest fp32
  o.growth_factor = 3.0;
  o.backoff_factor = 0.3;
  o.growth_interval = 5;
  GradScaler a(o);
  a.update_with(false);
  a.update_with(true);
  a.update_with(false);
  GradScaler b;
  b.load_state_dict(json::parse(a.state_dict().dump()));
  CHECK(b.get_scale() == a.get_scale());
  CHECK(b.state_dict() == a.state_dict());
  CHECK(a.get_scale() == static_cast<float>(static_cast<double>(static_cast<float>(3.0e-7)) * 0.3));
}

TEST_CASE("GradScaler hysteresis 2, growth window 3, pattern 0,1,0,1,1,0,0,0", "[amp]") {
  // Megatron / DeepSpeed default: the hysteresis refills only when the scale grows.
  GradScaler s(opts(3, 2));
  const std::vector<int> pattern = {0, 1, 0, 1, 1, 0, 0, 0};
  const std::vector<float> scale = {65536, 65536, 65536, 32768, 16384, 16384, 16384, 32768};
  const std::vector<int64_t> hyst = {2, 1, 1, 0, 0, 0, 0, 2};
  const std::vector<int64_t> tracker = {1, 0, 1, 0, 0, 1, 2, 0};
  int steps = 0;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    INFO("iteration " << i + 1);
    CHECK(iteration(s, pattern[i], &steps) == (pattern[i] == 0));  // overflowing steps skip either way
    CHECK(s.get_scale() == scale[i]);
    CHECK(s.hysteresis_tracker() == hyst[i]);
    CHECK(s.growth_tracker() == tracker[i]);
  }
}

TEST_CASE("GradScaler consecutive_hysteresis refills on every finite step", "[amp]") {
  auto o = opts(3, 2);
  o.consecutive_hysteresis = true;
  GradScaler s(o);
  const std::vector<int> pattern = {0, 1, 0, 1, 1, 0, 0, 0};
  const std::vector<float> scale = {65536, 65536, 65536, 65536, 32768, 32768, 32768, 65536};
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    INFO("iteration " << i + 1);
    s.update_with(pattern[i]);
    CHECK(s.get_scale() == scale[i]);
  }
}

namespace {

// The two sources' update rules, transcribed line for line (scale as a double, as their Python
// holds it), for the replays below.
// DeepSpeed, deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler.update_scale (scale_factor
// for both directions, as there).
struct DeepSpeedLossScaler {
  double cur_scale, scale_factor, min_scale;
  int64_t scale_window, delayed_shift, cur_hysteresis, cur_iter = 0, last_overflow_iter = -1;
  bool consecutive_hysteresis;
  void update_scale(bool overflow) {
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        cur_scale = std::max(cur_scale / scale_factor, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive_hysteresis) cur_hysteresis = delayed_shift;
      const int64_t stable_interval = (cur_iter - last_overflow_iter) - 1;
      if (stable_interval > 0 && stable_interval % scale_window == 0) {
        if (!consecutive_hysteresis) cur_hysteresis = delayed_shift;
        cur_scale *= scale_factor;
      }
    }
    cur_iter += 1;
  }
};

// Megatron-LM, megatron/core/optimizer/grad_scaler.py, DynamicGradScaler.update (no
// consecutive_hysteresis there).
struct MegatronGradScaler {
  double scale, growth_factor, backoff_factor, min_scale;
  int64_t growth_interval, hysteresis, growth_tracker = 0, hysteresis_tracker;
  void update(bool found_inf) {
    if (found_inf) {
      growth_tracker = 0;
      hysteresis_tracker -= 1;
      if (hysteresis_tracker <= 0) scale = std::max(scale * backoff_factor, min_scale);
    } else {
      growth_tracker += 1;
      if (growth_tracker == growth_interval) {
        growth_tracker = 0;
        hysteresis_tracker = hysteresis;
        scale = scale * growth_factor;
      }
    }
  }
};

GradScaler::Options rule_opts(ScaleRule rule, int64_t window, int64_t hysteresis, bool consecutive) {
  auto o = opts(window, hysteresis);
  o.rule = rule;
  o.consecutive_hysteresis = consecutive;
  o.min_scale = 1.0;
  return o;
}

}  // namespace

TEST_CASE("GradScaler rule deepspeed: the issue's trace, log2 scales step by step", "[amp]") {
  // Overflows 0,0,0,0,1,1,1,0,0,0,0, hysteresis 2, window 4, from 2^16: the scale each step runs at.
  const std::vector<int> pattern = {0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0};
  const std::vector<int> deepspeed = {16, 16, 16, 16, 16, 16, 15, 14, 14, 14, 14};
  const std::vector<int> megatron = {16, 16, 16, 16, 17, 17, 16, 15, 15, 15, 15};
  GradScaler ds(rule_opts(ScaleRule::DeepSpeed, 4, 2, false)), mg(rule_opts(ScaleRule::Megatron, 4, 2, false));
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    INFO("step " << i);
    CHECK(std::log2(ds.get_scale()) == deepspeed[i]);
    CHECK(std::log2(mg.get_scale()) == megatron[i]);
    ds.update_with(pattern[i]);
    mg.update_with(pattern[i]);
  }
}

TEST_CASE("GradScaler rules replay their sources' update step for step", "[amp]") {
  // Random overflow patterns of several densities (bursts included), every window and hysteresis
  // from 1 to 4, consecutive_hysteresis on and off (DeepSpeed only): scale, hysteresis and, for
  // DeepSpeed, the stable interval must equal the transcribed source after every step. Runs of 100
  // steps from 2^16 grow at most to 2^116: inside fp32's range, where mpt stops growing (as PyTorch)
  // and the sources would not.
  std::mt19937 rng(38);
  for (double density : {0.05, 0.3, 0.7}) {
    for (int64_t window = 1; window <= 4; ++window) {
      for (int64_t hyst = 1; hyst <= 4; ++hyst) {
        for (int run = 0; run < 8; ++run)
        for (bool consecutive : {false, true}) {
          INFO("density " << density << " window " << window << " hysteresis " << hyst << " consecutive " << consecutive);
          GradScaler ds(rule_opts(ScaleRule::DeepSpeed, window, hyst, consecutive));
          DeepSpeedLossScaler ref{65536.0, 2.0, 1.0, window, hyst, hyst, 0, -1, consecutive};
          GradScaler mg(rule_opts(ScaleRule::Megatron, window, hyst, false));
          MegatronGradScaler mref{65536.0, 2.0, 0.5, 1.0, window, hyst, 0, hyst};
          std::bernoulli_distribution overflow(density);
          for (int step = 0; step < 100; ++step) {
            const bool inf = overflow(rng);
            ds.update_with(inf);
            ref.update_scale(inf);
            REQUIRE(static_cast<double>(ds.get_scale()) == ref.cur_scale);
            REQUIRE(ds.hysteresis_tracker() == ref.cur_hysteresis);
            REQUIRE(ds.growth_tracker() == ref.cur_iter - ref.last_overflow_iter - 1);
            if (consecutive) continue;  // Megatron has no consecutive_hysteresis
            mg.update_with(inf);
            mref.update(inf);
            REQUIRE(static_cast<double>(mg.get_scale()) == mref.scale);
            REQUIRE(mg.hysteresis_tracker() == std::max<int64_t>(mref.hysteresis_tracker, 0));
            REQUIRE(mg.growth_tracker() == mref.growth_tracker);
          }
        }
      }
    }
  }
}

TEST_CASE("GradScaler rule deepspeed: state saved after every step continues exactly", "[amp]") {
  const std::vector<int> pattern = {0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0};
  GradScaler ref(rule_opts(ScaleRule::DeepSpeed, 3, 2, false));
  for (std::size_t cut = 0; cut < pattern.size(); ++cut) {
    GradScaler a(rule_opts(ScaleRule::DeepSpeed, 3, 2, false));
    for (std::size_t i = 0; i < cut; ++i) a.update_with(pattern[i]);
    GradScaler b;  // fresh, PyTorch defaults: the rule must come from the dict
    b.load_state_dict(json::parse(a.state_dict().dump()));
    CHECK(b.options().rule == ScaleRule::DeepSpeed);
    for (std::size_t i = cut; i < pattern.size(); ++i) {
      a.update_with(pattern[i]);
      b.update_with(pattern[i]);
      CHECK(b.get_scale() == a.get_scale());
      CHECK(b.state_dict() == a.state_dict());
    }
  }
  CHECK(parse_scale_rule("deepspeed") == ScaleRule::DeepSpeed);
  CHECK(parse_scale_rule("megatron") == ScaleRule::Megatron);
  CHECK_THROWS_AS(parse_scale_rule("DeepSpeed"), std::invalid_argument);
}

TEST_CASE("GradScaler unscale_: reciprocal in double, inf check on scaled values", "[amp]") {
  GradScaler::Options o;
  o.init_scale = 3.0;
  GradScaler s(o);
  auto p = torch::zeros({2}, torch::requires_grad());
  p.mutable_grad() = torch::tensor({3.0f, 1.0f});
  CHECK_FALSE(s.unscale_({p}));
  const float inv = static_cast<float>(1.0 / 3.0);
  CHECK(p.grad()[0].item<float>() == 3.0f * inv);
  CHECK(p.grad()[1].item<float>() == inv);
  CHECK_THROWS_AS(s.unscale_({p}), std::logic_error);  // twice before update()
  int ran = 0;
  CHECK(s.step({p}, [&] { ++ran; }));  // step after an explicit unscale_ does not unscale again
  CHECK(p.grad()[1].item<float>() == inv);
  CHECK(ran == 1);
  CHECK_THROWS_AS(s.step({p}, [&] { ++ran; }), std::logic_error);
  s.update();
  CHECK_THROWS_AS(s.update(), std::logic_error);  // no inf check recorded since
  p.mutable_grad() = torch::tensor({NAN, 1.0f});
  CHECK(s.unscale_({p}));
  CHECK_FALSE(s.step({p}, [&] { ++ran; }));
  CHECK(ran == 1);
  s.update();
  CHECK(s.get_scale() == 1.5f);
}

TEST_CASE("GradScaler scale(loss) multiplies by the fp32 scale", "[amp]") {
  GradScaler s;
  auto loss = torch::tensor(0.25f);
  CHECK(s.scale(loss).item<float>() == 16384.0f);
}

TEST_CASE("GradScaler never grows to inf and never backs off to 0", "[amp]") {
  GradScaler::Options o;
  o.init_scale = std::ldexp(1.0, 127);
  o.growth_interval = 1;
  GradScaler s(o);
  s.update_with(false);
  CHECK(s.get_scale() == std::ldexp(1.0f, 127));  // 2^128 is inf in fp32: kept
  CHECK(s.growth_tracker() == 0);

  GradScaler::Options c;
  c.init_scale = 1.0;
  c.min_scale = 0.25;
  GradScaler clamp(c);
  for (int i = 0; i < 5; ++i) clamp.update_with(true);
  CHECK(clamp.get_scale() == 0.25f);

  GradScaler dflt;  // PyTorch defaults: the floor is fp32's smallest subnormal, not 0
  for (int i = 0; i < 400; ++i) dflt.update_with(true);
  CHECK(dflt.get_scale() == std::numeric_limits<float>::denorm_min());

  c.min_scale_policy = MinScalePolicy::Error;
  GradScaler err(c);
  err.update_with(true);
  err.update_with(true);
  CHECK(err.get_scale() == 0.25f);
  CHECK_THROWS_AS(err.update_with(true), LossScaleError);
}

TEST_CASE("GradScaler rejects bad options", "[amp]") {
  auto with = [](auto f) { GradScaler::Options o; f(o); return o; };
  CHECK_THROWS_AS(GradScaler(with([](auto& o) { o.init_scale = -1; })), std::invalid_argument);
  CHECK_THROWS_AS(GradScaler(with([](auto& o) { o.init_scale = 0; })), std::invalid_argument);
  CHECK_THROWS_AS(GradScaler(with([](auto& o) { o.init_scale = 1e39; })), std::invalid_argument);
  CHECK_THROWS_AS(GradScaler(with([](auto& o) { o.growth_factor = 1.0; })), std::invalid_argument);
  CHECK_THROWS_AS(GradScaler(with([](auto& o) { o.backoff_factor = 1.0; })), std::invalid_argument);
  CHECK_THROWS_AS(GradScaler(with([](auto& o) { o.backoff_factor = 0.0; })), std::invalid_argument);
  CHECK_THROWS_AS(GradScaler(with([](auto& o) { o.growth_interval = 0; })), std::invalid_argument);
  CHECK_THROWS_AS(GradScaler(with([](auto& o) { o.hysteresis = 0; })), std::invalid_argument);
  CHECK_THROWS_AS(GradScaler(with([](auto& o) { o.min_scale = 0; })), std::invalid_argument);
  GradScaler s;
  CHECK_THROWS_AS(s.load_state_dict(json{{"scale", 1.0}}), std::invalid_argument);
  auto sd = s.state_dict();
  sd["_growth_tracker"] = 2000;
  CHECK_THROWS_AS(s.load_state_dict(sd), std::invalid_argument);
}

TEST_CASE("emulate_storage rounds forward values and backward gradients", "[amp]") {
  auto x = torch::tensor({1.0f + std::ldexp(1.0f, -12), 1e-8f}, torch::requires_grad());
  auto y = emulate_storage(x, Format::FP16);
  CHECK(y[0].item<float>() == 1.0f);
  CHECK(y[1].item<float>() == 0.0f);
  (y * torch::tensor({1e-8f, 3.0f})).sum().backward();
  CHECK(x.grad()[0].item<float>() == 0.0f);  // 1e-8 underflows in fp16
  CHECK(x.grad()[1].item<float>() == 3.0f);
  auto z = torch::ones({2}, torch::requires_grad());
  CHECK(emulate_storage(z, Format::FP32).is_same(z));
}

TEST_CASE("store_as: native and emulated store the same values and pass gradients back", "[amp]") {
  auto x = torch::tensor({1.0f + 1.0f / 4096, 3.0e-8f, 70000.0f, -2.5e-6f}).requires_grad_(true);
  for (Format f : {Format::FP16, Format::BF16}) {
    auto emu = store_as(x, f, Compute::Emulated);
    auto nat = store_as(x, f, Compute::Native);
    CHECK(emu.scalar_type() == torch::kFloat);
    CHECK(nat.scalar_type() == storage_dtype(f));
    // Both round to nearest even: the same stored values (inf for 70000 in fp16 included).
    CHECK(torch::equal(emu, nat.to(torch::kFloat)));
    // The gradient flows back through the cast: d(sum 3·y)/dx = 3 in the format, cast up to fp32.
    (nat.to(torch::kFloat) * 3).sum().backward();
    REQUIRE(x.grad().defined());
    CHECK(x.grad().scalar_type() == torch::kFloat);
    CHECK(torch::equal(x.grad(), torch::full({4}, 3.0f)));
    x.mutable_grad() = torch::Tensor();
  }
  // Already in the format: native storing is a no-op (the same tensor).
  auto h = torch::ones({2}, torch::kBFloat16);
  CHECK(store_as(h, Format::BF16, Compute::Native).is_same(h));
  CHECK_THROWS_AS(store_as(x, Format::FP8_E4M3, Compute::Native), std::invalid_argument);
}

TEST_CASE("resolve_compute: auto follows the device's kernels, native is refused without them", "[amp]") {
  const torch::Device cpu(torch::kCPU);
  CHECK(resolve_compute("auto", Format::FP32, cpu) == Compute::Native);
  CHECK(resolve_compute("emulated", Format::FP16, cpu) == Compute::Emulated);
  CHECK(resolve_compute("auto", Format::FP8_E5M2, cpu) == Compute::Emulated);
  CHECK_THROWS_AS(resolve_compute("fast", Format::FP16, cpu), std::invalid_argument);
  for (Format f : {Format::FP16, Format::BF16}) {
    const KernelProbe p = probe_kernels(cpu, storage_dtype(f));
    CHECK(resolve_compute("auto", f, cpu) == (p.native() ? Compute::Native : Compute::Emulated));
    // native as asked wherever the kernels run (warned when they accumulate in the low format)
    if (p.runs) CHECK(resolve_compute("native", f, cpu) == Compute::Native);
    else CHECK_THROWS_AS(resolve_compute("native", f, cpu), RuntimeFailure);
  }
}

TEST_CASE("activation_as: emulated sigmoid/tanh equal the native kernels, backward included", "[amp]") {
  torch::manual_seed(3);
  auto x = torch::randn({64, 32}) * 4;
  auto g = torch::randn({64, 32}) * 1e-3;
  const torch::Device cpu(torch::kCPU);
  for (Format f : {Format::BF16, Format::FP16}) {
    if (!native_matmul(cpu, storage_dtype(f))) continue;  // Debian's 1.13: no CPU fp16 kernels
    for (std::string kind : {"sigmoid", "tanh", "relu"}) {
      auto xe = round_to(x, f).requires_grad_(true);
      auto ye = activation_as(xe, kind, f, Compute::Emulated);
      ye.backward(g);
      auto xn = x.to(storage_dtype(f)).requires_grad_(true);
      auto yn = activation_as(xn, kind, f, Compute::Native);
      yn.backward(g.to(storage_dtype(f)));
      INFO(format_name(f) << " " << kind);
      CHECK(torch::equal(ye, yn.to(torch::kFloat)));
      if (f == Format::FP16 && kind == "sigmoid") {
        // The one known difference (docs/gpu.md): ATen's CPU sigmoid_backward for Half computes in
        // half, rounding g·(1−y) before multiplying by y; emulation (and CUDA) round once.
        auto gh = g.to(torch::kHalf), yh = yn.detach();
        CHECK(torch::equal(xn.grad(), gh * (1 - yh) * yh));
        auto y32 = ye.detach();
        CHECK(torch::equal(xe.grad(), round_to(round_to(g, f) * (1 - y32) * y32, f)));
        continue;
      }
      // the stored gradient: the emulated one rounded as it would be stored
      CHECK(torch::equal(round_to(xe.grad(), f), xn.grad().to(torch::kFloat)));
    }
  }
  CHECK_THROWS_AS(activation_as(x, "gelu", Format::FP16, Compute::Emulated), std::invalid_argument);
}

namespace {
// ATen's casts, unfused (round_to's CPU fast path for fp16 / bf16 is what is under test elsewhere).
torch::Tensor aten_cast_round(const torch::Tensor& x, Format f) {
  if (f == Format::FP16) return x.to(torch::kFloat).to(torch::kHalf).to(torch::kFloat);
  if (f == Format::BF16) return x.to(torch::kFloat).to(torch::kBFloat16).to(torch::kFloat);
  return round_to(x, f);
}
// The unfused ATen expression sgd_update_counting_lost must equal, bit for bit.
UpdateCounts reference_sgd(torch::Tensor& w, const torch::Tensor& g, float lr, Format stored) {
  torch::NoGradGuard ng;
  auto u = g.to(torch::kFloat) * lr;
  auto next32 = w.to(torch::kFloat) - u;
  auto next = w.scalar_type() == torch::kFloat ? aten_cast_round(next32, stored) : next32.to(w.scalar_type());
  auto intended = u != 0;
  UpdateCounts c;
  c.lost = (intended & (next == w)).sum().item<int64_t>();
  c.updates = intended.sum().item<int64_t>();
  w.copy_(next);
  return c;
}
}  // namespace

TEST_CASE("sgd_update_counting_lost equals ATen's unfused update and counts bit for bit", "[amp]") {
  torch::manual_seed(7);
  // 100003 elements: more than one parallel_for chunk (grain 32768), not a multiple of it. The
  // weights span many binades, a tenth of the gradients are 0, a few are huge, NaN and inf,
  // and lr is small, so that thousands of updates are lost in the narrow formats.
  auto w0 = torch::randn({100003}) * torch::pow(2.0, torch::randint(-20, 20, {100003}));
  auto g0 = torch::randn({100003}) * (torch::rand({100003}) > 0.1).to(torch::kFloat);
  g0[5] = 1e30f;
  g0[6] = std::numeric_limits<float>::infinity();
  g0[7] = std::numeric_limits<float>::quiet_NaN();
  w0[8] = 0.0f;
  w0[9] = -0.0f;
  struct Case {
    torch::ScalarType dtype;
    Format stored;
  };
  for (const Case c : {Case{torch::kFloat, Format::FP32}, Case{torch::kFloat, Format::BF16},
                       Case{torch::kFloat, Format::FP16}, Case{torch::kFloat, Format::FP8_E4M3},
                       Case{torch::kBFloat16, Format::BF16}, Case{torch::kHalf, Format::FP16}}) {
    for (const float lr : {1e-3f, 0.1f}) {
      CAPTURE(c10::toString(c.dtype), format_name(c.stored), lr);
      auto start = c.dtype == torch::kFloat ? aten_cast_round(w0, c.stored) : w0.to(c.dtype);
      auto g = c.dtype == torch::kFloat ? g0 : g0.to(c.dtype);
      auto a = start.clone(), b = start.clone();
      const UpdateCounts fused = sgd_update_counting_lost(a, g, lr, c.stored);
      const UpdateCounts ref = reference_sgd(b, g, lr, c.stored);
      CHECK(fused.updates == ref.updates);
      CHECK(fused.lost == ref.lost);
      CHECK(fused.updates > 80000);
      // Bit for bit: the same finite values, the same infinities and NaNs in the same places.
      auto fa = a.to(torch::kFloat), fb = b.to(torch::kFloat);
      CHECK(torch::equal(torch::isnan(fa), torch::isnan(fb)));
      CHECK(torch::equal(torch::nan_to_num(fa, 0.0), torch::nan_to_num(fb, 0.0)));
      CHECK(torch::equal(torch::signbit(torch::nan_to_num(fa, 0.0)), torch::signbit(torch::nan_to_num(fb, 0.0))));
      if (c.stored != Format::FP32 && lr == 1e-3f) CHECK(fused.lost > 1000);
    }
  }
  // A strided weight takes the ATen path and gives the same.
  auto w = torch::randn({64, 32}).t(), w2 = w.clone();
  auto g = torch::randn({32, 64});
  const UpdateCounts s = sgd_update_counting_lost(w, g, 1e-3f, Format::BF16);
  const UpdateCounts r = reference_sgd(w2, g, 1e-3f, Format::BF16);
  CHECK(s.lost == r.lost);
  CHECK(torch::equal(w, w2));
  auto bad = torch::zeros({3});
  CHECK_THROWS_AS(sgd_update_counting_lost(bad, torch::zeros({4}), 0.1f, Format::FP32), std::invalid_argument);
}

TEST_CASE("round_bf16_stochastic: a neighbour of x, unbiased within 6 sigma, bf16 values and inf/NaN unchanged", "[amp]") {
  // x = 1 + f·ulp(1) with ulp(1) = 2^-7 in bf16: SR must give 1 or 1 + 2^-7, the upper one with
  // probability p = (low 16 bits of x) / 2^16. With n = 2^16 draws the count of "up" is
  // Binomial(n, p): |count − np| ≤ 6·sqrt(np(1 − p)) fails with probability < 2e-9 for an unbiased
  // rounder, and the bits are fixed by the seed, so the check is deterministic.
  const int64_t n = 1 << 16;
  const float lo = 1.0f, hi = 1.0f + std::ldexp(1.0f, -7);
  for (const float f : {0.3f, 0.01f, 0.5f, 0.99f}) {
    const float x = 1.0f + f * std::ldexp(1.0f, -7);
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    const double p = static_cast<double>(bits & 0xFFFFu) / 65536.0;
    auto r = quant::round_bf16_stochastic(torch::full({n}, x), 42);
    CHECK(((r == lo) | (r == hi)).all().item<bool>());
    const double up = (r == hi).sum().item<double>();
    CAPTURE(f, p, up);
    CHECK(std::fabs(up - n * p) <= 6 * std::sqrt(n * p * (1 - p)));
    // the same seed, the same draw; another seed, another draw
    CHECK(torch::equal(r, quant::round_bf16_stochastic(torch::full({n}, x), 42)));
    CHECK_FALSE(torch::equal(r, quant::round_bf16_stochastic(torch::full({n}, x), 43)));
  }
  auto special = torch::tensor({1.5f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()});
  CHECK(torch::equal(quant::round_bf16_stochastic(special, 1), special));
  CHECK(std::isnan(quant::round_bf16_stochastic(torch::tensor({NAN}), 1).item<float>()));
  // negative values round away from zero with the same probability (sign-magnitude bits)
  auto neg = quant::round_bf16_stochastic(torch::full({n}, -(1.0f + 0.5f * std::ldexp(1.0f, -7))), 5);
  CHECK(((neg == -lo) | (neg == -hi)).all().item<bool>());
  // quant::cast with Rounding::Stochastic on BF16 is the same rounder
  quant::CastOptions sr;
  sr.rounding = quant::Rounding::Stochastic;
  sr.seed = 9;
  auto v = torch::randn({1000});
  CHECK(torch::equal(quant::cast(v, quant::Element::BF16, sr), quant::round_bf16_stochastic(v, 9)));
}

TEST_CASE("sgd_update_stochastic and sgd_update_kahan: native bf16 equals emulated bit for bit", "[amp]") {
  torch::manual_seed(3);
  auto w0 = torch::randn({4099}).to(torch::kBFloat16).to(torch::kFloat);
  // gradients hold bf16 values, as the recipes' gradients do in both modes
  auto g0 = (torch::randn({4099}) * (torch::rand({4099}) > 0.1).to(torch::kFloat)).to(torch::kBFloat16).to(torch::kFloat);
  for (int step = 0; step < 3; ++step) {
    auto we = w0.clone(), wn = w0.to(torch::kBFloat16);
    const UpdateCounts ce = sgd_update_stochastic(we, g0, 1e-3f, 11 + step);
    const UpdateCounts cn = sgd_update_stochastic(wn, g0.to(torch::kBFloat16), 1e-3f, 11 + step);
    CHECK(torch::equal(we, wn.to(torch::kFloat)));
    CHECK(ce.lost == cn.lost);
    CHECK(ce.updates == cn.updates);
    CHECK(ce.lost > 0);                 // lr·g far below ulp(w) for most elements ...
    CHECK(ce.lost < ce.updates);        // ... yet some round up
  }
  auto we = w0.clone(), wn = w0.to(torch::kBFloat16);
  auto ce = torch::zeros_like(we), cn = torch::zeros_like(wn);
  auto gb = g0;
  for (int step = 0; step < 5; ++step) {
    sgd_update_kahan(we, ce, gb, 1e-3f);
    sgd_update_kahan(wn, cn, gb.to(torch::kBFloat16), 1e-3f);
  }
  CHECK(torch::equal(we, wn.to(torch::kFloat)));
  CHECK(torch::equal(ce, cn.to(torch::kFloat)));
  auto bad = torch::zeros({3}), badc = torch::zeros({4});
  CHECK_THROWS_AS(sgd_update_kahan(bad, badc, torch::zeros({3}), 0.1f), std::invalid_argument);
  CHECK_THROWS_AS(sgd_update_stochastic(bad, torch::zeros({4}), 0.1f, 0), std::invalid_argument);
  auto half = torch::zeros({3}, torch::kHalf);
  CHECK_THROWS_AS(sgd_update_stochastic(half, torch::zeros({3}, torch::kHalf), 0.1f, 0), std::invalid_argument);
}

TEST_CASE("sgd_update_kahan: 1 plus 1000 updates of bf16(1e-3) keeps the sum that round to nearest loses", "[amp]") {
  // Kahan summation of n terms with working precision u has |computed − exact| ≤ 2u|S| +
  // O(n u²) Σ|x_i| (Higham, "Accuracy and Stability", §4.3); here the state w + c is held in bf16
  // (u = 2^-8), n = 1000, S = Σ|x_i| ≈ 2: a bound of 2·2^-8·2 + 1000·2^-16·2 ≈ 0.046. Round to
  // nearest loses every update (1e-3 < ulp(1)/2 = 2^-8): error 1.0.
  const float u = static_cast<float>(c10::BFloat16(1e-3f));
  auto w = torch::ones({1}), c = torch::zeros({1}), nearest = torch::ones({1});
  int64_t lost = 0, lost_nearest = 0;
  for (int i = 0; i < 1000; ++i) {
    lost += sgd_update_kahan(w, c, torch::full({1}, -u), 1.0f).lost;
    lost_nearest += sgd_update_counting_lost(nearest, torch::full({1}, -u), 1.0f, Format::BF16).lost;
  }
  const double exact = 1.0 + 1000.0 * u;
  CHECK(lost_nearest == 1000);
  CHECK(nearest.item<float>() == 1.0f);
  CHECK(lost == 0);
  CHECK(std::fabs(w.item<double>() + c.item<double>() - exact) <= 2 * std::ldexp(1.0, -8) * 2 + 1000 * std::ldexp(1.0, -16) * 2);
  CHECK(w.item<float>() == static_cast<float>(c10::BFloat16(static_cast<float>(exact))));  // w: the bf16 nearest the sum
}

TEST_CASE("SgdMomentum: b = g, then b = m*b + g, p -= lr*b (torch.optim.SGD's single-tensor step)", "[amp]") {
  auto p = torch::ones({2}).requires_grad_(true);
  SgdMomentum opt({p}, /*lr=*/0.5, /*momentum=*/0.5);
  p.mutable_grad() = torch::full({2}, 0.25f);
  opt.step();  // b = 0.25, p = 1 - 0.125
  CHECK(p[0].item<float>() == 0.875f);
  p.mutable_grad() = torch::full({2}, 0.5f);
  opt.step();  // b = 0.5*0.25 + 0.5 = 0.625, p = 0.875 - 0.3125
  CHECK(p[1].item<float>() == 0.5625f);
  opt.zero_grad();
  CHECK_FALSE(p.grad().defined());
  opt.step();  // no gradient: nothing moves
  CHECK(p[0].item<float>() == 0.5625f);
  CHECK_THROWS_AS(SgdMomentum({p}, 0.0, 0.5), std::invalid_argument);
  CHECK_THROWS_AS(SgdMomentum({p}, 0.1, 1.0), std::invalid_argument);
}

TEST_CASE("emulate_storage_counting: the same values and gradients as emulate_storage, and the hook's underflow count",
          "[amp]") {
  // A two-layer net in emulated fp16 / bf16 twice: once with emulate_storage plus a hook on each
  // stored parameter counting ((g != 0) & (cast(g) == 0)).sum() with ATen's casts (what
  // core/train/amp_recipe did before), once with emulate_storage_counting. Small inputs and a scaled
  // loss put a good share of the gradients below fp16's subnormals.
  torch::manual_seed(13);
  auto x = torch::randn({256, 64}) * torch::exp2(torch::randint(-24, 0, {256, 64}).to(torch::kFloat));
  auto w1 = torch::randn({128, 64}) * 0.1, w2 = torch::randn({10, 128}) * 0.1;
  for (Format f : {Format::FP16, Format::BF16}) {
    CAPTURE(format_name(f));
    long long hook_under = 0, hook_total = 0, fused_under = 0, fused_total = 0;
    auto run = [&](bool fused) {
      auto a = aten_cast_round(w1, f).requires_grad_(true), b = aten_cast_round(w2, f).requires_grad_(true);
      torch::Tensor sa, sb;
      if (fused) {
        sa = emulate_storage_counting(a, f, &fused_under, &fused_total);
        sb = emulate_storage_counting(b, f, &fused_under, &fused_total);
      } else {
        sa = emulate_storage(a, f);
        sb = emulate_storage(b, f);
        for (auto* t : {&sa, &sb})
          t->register_hook([&, f](torch::Tensor g) {
            hook_under += ((g != 0) & (aten_cast_round(g, f) == 0)).sum().item<int64_t>();
            hook_total += g.numel();
          });
      }
      auto h = emulate_storage(torch::relu(emulate_storage(torch::linear(emulate_storage(x, f), sa), f)), f);
      auto loss = emulate_storage(torch::linear(h, sb), f).pow(2).mean() * 1e-3;
      loss.backward();
      return std::pair{a.grad(), b.grad()};
    };
    auto [ga, gb] = run(false);
    auto [fa, fb] = run(true);
    CHECK(torch::equal(ga, fa));
    CHECK(torch::equal(gb, fb));
    CHECK(fused_total == hook_total);
    CHECK(fused_total == 128 * 64 + 10 * 128);
    CHECK(fused_under == hook_under);
    if (f == Format::FP16) {  // the count is exercised: some underflow, not all
      CHECK(hook_under > 100);
      CHECK(hook_under < hook_total);
    }
  }
  auto z = torch::ones({2}, torch::requires_grad());
  long long u = 0, t = 0;
  CHECK(emulate_storage_counting(z, Format::FP32, &u, &t).is_same(z));
}
