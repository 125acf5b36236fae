// Mixed-precision machinery: dynamic loss scaling (GradScaler) and emulated
// low-precision compute.
//
// GradScaler mirrors torch.cuda.amp.GradScaler (PyTorch 1.13 / 2.x) exactly:
//   scale(loss)   loss × S, S held as an fp32 value (init_scale 2^16)
//   unscale_(ps)  found_inf = any non-finite value among the *scaled* gradients; then every
//                 gradient × inv_scale, inv_scale = float(1 / double(S)) ("reciprocal in double",
//                 as GradScaler._unscale_grads_ computes self._scale.double().reciprocal().float())
//   step(ps, fn)  calls unscale_ unless already done; runs fn (the optimizer step) only when
//                 nothing was non-finite
//   update()      the arithmetic of ATen's _amp_update_scale_ (AmpKernels.cu):
//                 inf  → S = float(S × backoff_factor), growth tracker = 0
//                 else → tracker + 1; when it reaches growth_interval: S = float(S × growth_factor)
//                        unless that is inf in fp32, and tracker = 0
// Options beyond PyTorch, named as DeepSpeed (runtime/fp16/loss_scaler.py) and Megatron-LM
// (optimizer/grad_scaler.py DynamicGradScaler) name them:
//   rule                when the scale grows, each equal to its source step for step:
//                       "megatron" (Megatron's DynamicGradScaler; PyTorch's rule at hysteresis 1):
//                         grow after growth_interval consecutive finite steps, counted from the
//                         start, the last overflow or the last growth;
//                       "deepspeed" (DeepSpeed's DynamicLossScaler.update_scale): grow at a finite
//                         step when s = (finite steps before it since the start or the last
//                         overflow) is > 0 and a multiple of growth_interval (its scale_window) —
//                         after window + 1 finite steps, then every window steps.
//   hysteresis          overflows tolerated before backing off (1 = PyTorch). The hysteresis
//                       tracker starts at `hysteresis`, loses one per overflow, backs off when it
//                       reaches 0 (megatron; deepspeed keeps it at 1 and backs off there: the same
//                       decisions), and is refilled when the scale grows — or on every finite step
//                       when `consecutive_hysteresis` is set (DeepSpeed's option of that name).
//   min_scale, policy   the floor: "clamp" keeps S ≥ min_scale (Megatron); "error" throws
//                       LossScaleError when S is at the floor and must back off again (DeepSpeed's
//                       raise_error_at_min_scale). The scale is never 0.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "core/numerics/precision.hpp"

namespace mpt {

using json = nlohmann::json;

/// The loss scale cannot back off any further (min_scale policy "error").
struct LossScaleError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What a GradScaler does at its floor.
enum class MinScalePolicy { Clamp, Error };
/// Parses "clamp" | "error"; throws std::invalid_argument.
MinScalePolicy parse_min_scale_policy(const std::string& s);

/// When the scale grows (see the file comment): Megatron's DynamicGradScaler (PyTorch's rule at
/// hysteresis 1) or DeepSpeed's DynamicLossScaler.
enum class ScaleRule { Megatron, DeepSpeed };
/// Parses "megatron" | "deepspeed"; throws std::invalid_argument.
ScaleRule parse_scale_rule(const std::string& s);
/// "megatron" | "deepspeed".
const char* scale_rule_name(ScaleRule r);

/// Dynamic loss scaler with torch.cuda.amp.GradScaler's semantics (see the file comment).
class GradScaler {
 public:
  struct Options {
    double init_scale = 65536.0;     ///< 2^16, PyTorch's default
    double growth_factor = 2.0;      ///< > 1
    double backoff_factor = 0.5;     ///< in (0, 1)
    int64_t growth_interval = 2000;  ///< finite steps between growths, >= 1 (DeepSpeed: scale_window)
    ScaleRule rule = ScaleRule::Megatron;  ///< when the scale grows
    int64_t hysteresis = 1;          ///< >= 1; 1 = PyTorch
    bool consecutive_hysteresis = false;  ///< refill the hysteresis on every finite step
    double min_scale = 1.4012984643248171e-45;  ///< > 0; default the smallest fp32 subnormal
    MinScalePolicy min_scale_policy = MinScalePolicy::Clamp;
  };

  /// Validates the options: init_scale > 0 and finite in fp32, growth_factor > 1,
  /// 0 < backoff_factor < 1, growth_interval >= 1, hysteresis >= 1, 0 < min_scale <= init_scale.
  /// Throws std::invalid_argument naming the option.
  explicit GradScaler(Options o);
  /// PyTorch's defaults.
  GradScaler();

  /// loss × scale (same dtype as loss; the scale is the fp32 value).
  torch::Tensor scale(const torch::Tensor& loss) const;

  /// Unscales the gradients of `params` in place (params without a gradient are skipped) and
  /// records whether any scaled gradient was inf/NaN. Returns that flag.
  /// Throws std::logic_error when called twice before update(), or after step().
  bool unscale_(const std::vector<torch::Tensor>& params);

  /// unscale_ (unless already done since the last update), then `optimizer_step()` when
  /// every gradient was finite. Returns true when the step ran, false when it was skipped.
  /// Throws std::logic_error when called twice before update().
  bool step(const std::vector<torch::Tensor>& params, const std::function<void()>& optimizer_step);

  /// Updates the scale from the recorded inf check (see the file comment).
  /// Throws std::logic_error when no unscale_/step was recorded since the last update,
  /// LossScaleError when the floor is hit under policy "error".
  void update();

  /// Same as update() with the inf check given directly (for replaying traces and for
  /// callers that check gradients themselves).
  void update_with(bool found_inf);

  float get_scale() const { return scale_; }
  /// megatron: finite steps since the start, the last overflow or the last growth (< growth_interval);
  /// deepspeed: finite steps since the start or the last overflow (DeepSpeed's
  /// cur_iter - last_overflow_iter - 1 before the next update).
  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t hysteresis_tracker() const { return hysteresis_tracker_; }
  /// The inf check of the last unscale_ (false before any).
  bool found_inf() const { return found_inf_; }
  const Options& options() const { return opt_; }

  /// {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} as
  /// GradScaler.state_dict(), plus "rule", "hysteresis", "_hysteresis_tracker", "consecutive_hysteresis",
  /// "min_scale", "min_scale_policy". Doubles hold the fp32 scale exactly.
  json state_dict() const;
  /// Restores everything state_dict() saved, exactly (tracker included, nothing reset).
  /// Keys beyond PyTorch's are optional. Throws std::invalid_argument for a malformed dict.
  /// Must be called between iterations (not between unscale_ and update): throws std::logic_error.
  void load_state_dict(const json& s);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  Options opt_;
  float scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_;
  bool found_inf_ = false;
  Stage stage_ = Stage::Ready;

  void update_deepspeed(bool found_inf);
  /// S × backoff_factor, not below min_scale; LossScaleError at the floor under policy "error".
  void back_off();
  /// S × growth_factor unless that is inf in fp32; refills the hysteresis.
  void grow();
};

/// Rounds values to format `f` in forward and the gradient flowing back through it to `f` in
/// backward (a straight-through cast: d(out)/d(x) = 1). This is how emulated low-precision
/// compute stores a layer's output and the gradient entering that layer (fp32 math,
/// fp16/bf16 storage). For f = FP32 it returns x unchanged. Shapes are preserved.
torch::Tensor emulate_storage(const torch::Tensor& x, Format f);

/// emulate_storage(x, f) that also counts, in backward, the incoming fp32 gradient's elements that
/// underflow in `f` (count_underflow, core/numerics/precision) — from the same pass that rounds it — adding
/// them to `*underflow` and the gradient's numel to `*total` (a hook on the result counting
/// ((g != 0) & (round_to(g, f) == 0)).sum() sees the same g: the same counts, one pass instead of
/// six operators). The counters must outlive the backward pass. For f = FP32 it returns x
/// unchanged and counts nothing.
torch::Tensor emulate_storage_counting(const torch::Tensor& x, Format f, long long* underflow, long long* total);

/// Stores `x` in format `f` as compute mode `c` does. Emulated: emulate_storage(x, f) — an
/// fp32 tensor holding f's values, the gradient flowing back rounded to f. Native: x cast to
/// f's dtype (storage_dtype) — a differentiable cast, so the gradient flows back in f and is
/// cast to x's dtype at the boundary (what autocast's weight casts do). A no-op when x already
/// has the target dtype (native) or f is fp32. Shapes are preserved.
torch::Tensor store_as(const torch::Tensor& x, Format f, Compute c);

/// An activation ("sigmoid", "tanh" or "relu") of `x` stored in format `f` as compute mode `c`
/// does it. Native: the activation of x in f's dtype (x cast first if needed). Emulated: fp32
/// math, the output rounded to f — and, as with native kernels, whose saved output for backward
/// is the stored (rounded) one, backward reads the rounded output too: grad_in = round(g·(1−y)·y)
/// for sigmoid, round(g·(1−y²)) for tanh (ATen's sigmoid_backward / tanh_backward), g the incoming
/// gradient rounded to f. Shapes are preserved. Throws std::invalid_argument for another kind.
torch::Tensor activation_as(const torch::Tensor& x, const std::string& kind, Format f, Compute c);

/// What one SGD update did to its weights' stored values.
struct UpdateCounts {
  int64_t updates = 0;  ///< elements with a non-zero intended update lr·g
  int64_t lost = 0;     ///< ... whose stored weight did not change: w − lr·g rounds back to w
};

/// Plain SGD, w ← stored(w − lr·g), counting the updates that rounding swallowed (Micikevicius et
/// al. 2017, §3.1: why fp16 needs fp32 master weights). The arithmetic is ATen's, element for
/// element: u = fp32(g)·lr and w − u in fp32 (one rounding each), then one rounding to the
/// weights' format — `stored` for an fp32 tensor that holds another format's values (emulated
/// storage; Format::FP32 for real fp32 weights and master weights), the tensor's own dtype for
/// bf16 / fp16 tensors (native storage). An update is lost when u ≠ 0 and the stored result
/// equals w (IEEE comparison: NaN ≠ NaN, −0 = +0).
/// Same values, bit for bit, as the unfused ATen expression
///   u = g.to(float)·lr; n = stored(p.to(float) − u); lost = ((u ≠ 0) & (n == p)).sum(); p.copy_(n)
/// but in one pass over memory with no temporaries and no host round trip per count (on CPU for
/// contiguous fp32 / bf16 / fp16 weights with gradients of the same shape; anything else — CUDA,
/// fp8 storage, strided tensors — takes that ATen expression). `w` [any shape] is updated in place;
/// `g` has w's shape. Throws std::invalid_argument when the shapes differ.
UpdateCounts sgd_update_counting_lost(torch::Tensor& w, const torch::Tensor& g, float lr, Format stored);

/// Plain SGD on bf16 weights without a master copy, the update stochastically rounded:
/// w ← SR_bf16(w − u), u = fp32(g)·lr, w − u in fp32, then round_bf16_stochastic (core/numerics/quant) with
/// `seed` — give every (step, tensor) its own seed (derive_seed). Unbiased: E[w_next] = w − u, so
/// updates below half an ulp survive on average (Zamirai et al. 2020, "Revisiting BFloat16
/// Training", §4; torchao's bf16_stochastic_round optimizers). `w`: fp32 holding bf16 values
/// (emulated storage) or a bf16 tensor (native), updated in place; `g` has w's shape. Counts as
/// sgd_update_counting_lost: lost = u ≠ 0 and the stored w did not move this step (with SR such a
/// step is not lost in expectation: the steps that round up a whole ulp carry it). Throws
/// std::invalid_argument for mismatched shapes or a w that is neither fp32 nor bf16.
UpdateCounts sgd_update_stochastic(torch::Tensor& w, const torch::Tensor& g, float lr, std::uint64_t seed);

/// Plain SGD on bf16 weights with Kahan-compensated summation of the updates (Kahan 1965; for pure
/// bf16 training Zamirai et al. 2020, §4; the step of optimi's SGD with kahan_sum): a bf16
/// compensation buffer c (zeros at the start, w's shape and dtype) carries what rounding dropped:
///   c ← bf16(c − u);  w' ← bf16(w + c);  c ← bf16(c + bf16(w − w'));  w ← w'   (u = fp32(g)·lr)
/// each operation in fp32 math rounded once to bf16, as ATen's bf16 operators compute, for
/// emulated (fp32 holding bf16 values) and native (bf16) tensors alike. 2 extra bytes per
/// parameter instead of a 4-byte master copy. lost = u ≠ 0 and neither w nor c moved (the update
/// vanished from the recipe's state). Throws std::invalid_argument when shapes or dtypes of w, c,
/// g disagree or w is neither fp32 nor bf16.
UpdateCounts sgd_update_kahan(torch::Tensor& w, torch::Tensor& comp, const torch::Tensor& g, float lr);

/// SGD with momentum as torch.optim.SGD(params, lr, momentum) steps on the CPU (its single-tensor
/// path; no dampening, weight decay or Nesterov): the first step b = g.clone(), later
/// b.mul_(momentum).add_(g), then p.add_(b, alpha=−lr) — the same ATen operations in the same
/// order as PyTorch-Python, so a twin written with torch.optim.SGD matches bit for bit.
/// Parameters are updated in place (no autograd); those whose grad is undefined are skipped.
class SgdMomentum {
 public:
  /// `params`: leaves whose .grad() the step reads. Throws std::invalid_argument for lr ≤ 0 or
  /// momentum outside [0, 1).
  SgdMomentum(std::vector<torch::Tensor> params, double lr, double momentum);
  /// One step over every parameter with a gradient.
  void step();
  /// Drops every gradient (zero_grad(set_to_none=True)).
  void zero_grad();

 private:
  std::vector<torch::Tensor> params_, buffers_;
  double lr_, momentum_;
};

}  // namespace mpt
