// The mixed-precision recipe engine: see core/train/amp_recipe.hpp.
#include "core/train/amp_recipe.hpp"

#include <algorithm>

#include "core/errors.hpp"
#include "core/runtime/memory.hpp"
#include "core/models/mlp.hpp"
#include "core/numerics/quant.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/timing.hpp"

namespace mpt {

PrecisionRecipe parse_precision_recipe(const std::string& n) {
  PrecisionRecipe r;
  r.name = n;
  r.format = n.rfind("bf16", 0) == 0 ? Format::BF16 : n.rfind("fp16", 0) == 0 ? Format::FP16 : Format::FP32;
  r.master = n.find("+master") != std::string::npos;
  if (n.find("+static") != std::string::npos) r.scaling = LossScaling::Static;
  if (n.find("+dynamic") != std::string::npos) r.scaling = LossScaling::Dynamic;
  if (n.find("+sr") != std::string::npos) r.update = UpdateRounding::Stochastic;
  if (n.find("+kahan") != std::string::npos) r.update = UpdateRounding::Kahan;
  return r;
}

// The MLP 784 → width × depth → 10, built as nn.Linear layers in order so a seed fixes it.
std::vector<torch::Tensor> init_recipe_mlp(int64_t depth, int64_t width) {
  std::vector<torch::Tensor> ps;
  int64_t d = 28 * 28;
  for (int64_t i = 0; i <= depth; ++i) {
    const int64_t out = i == depth ? 10 : width;
    torch::nn::Linear lin(d, out);
    ps.push_back(lin->weight.detach().clone());
    ps.push_back(lin->bias.detach().clone());
    d = out;
  }
  return ps;
}

namespace {

struct Mlp {
  std::vector<torch::Tensor> params;  // W1, b1, W2, b2, ... (leaves)
  std::string activation;
};

// Counts gradients that underflow in `f`: g is a gradient computed in fp32 math, before it is
// stored in `f`.
// ((g != 0) & (round_to(g, f) == 0)).sum(), fused into one pass (core/numerics/precision).
void count_underflow(GradCounter* counter, const torch::Tensor& g, Format f) {
  counter->underflow += mpt::count_underflow(g, f);
  counter->total += g.numel();
}

// Forward in the recipe's format: the working copy of every parameter, each layer's output
// and each activation are stored in `f` (store_as: emulated — fp32 math, rounded storage — or
// native — tensors of f's dtype); in backward the gradient entering each of them is stored in
// `f`. Returns the logits [N, 10] in f (an fp32 tensor holding f's values when emulated).
// When `counter` is given, counts parameter gradients that underflow in `f`, in both modes
// from the same quantity: the parameter gradient in fp32 math before it is stored.
torch::Tensor mlp_forward(const Mlp& m, const torch::Tensor& images, Format f, Compute c, GradCounter* counter) {
  auto h = store_as(images.reshape({images.size(0), -1}), f, c);
  const std::size_t layers = m.params.size() / 2;
  for (std::size_t i = 0; i < layers; ++i) {
    const bool count = counter && f != Format::FP32 && m.params[2 * i].requires_grad();
    torch::Tensor w, b;
    if (count && c == Compute::Emulated) {
      // emulate_storage's backward gets the fp32 gradient before rounding it: counted there, in
      // the pass that rounds it (what a hook on w and b counting it would see)
      w = emulate_storage_counting(m.params[2 * i], f, &counter->underflow, &counter->total);
      b = emulate_storage_counting(m.params[2 * i + 1], f, &counter->underflow, &counter->total);
    } else {
      w = store_as(m.params[2 * i], f, c);
      b = store_as(m.params[2 * i + 1], f, c);
    }
    auto z = torch::linear(h, w, b);
    if (count && c == Compute::Native) {
      // Native kernels round the parameter gradient inside the matmul; recompute it in fp32
      // from the same f-valued operands (dW = dzᵀ·h, db = Σ dz) to see what rounding lost.
      auto input = h.detach();
      z.register_hook([counter, f, input](torch::Tensor dz) {
        auto d32 = dz.to(torch::kFloat);
        count_underflow(counter, d32.t().mm(input.to(torch::kFloat)), f);
        count_underflow(counter, d32.sum(0), f);
      });
    }
    h = store_as(z, f, c);
    if (i + 1 < layers) {
      // Emulated relu of a stored h: relu(h) holds f's values already, so rounding it again would
      // change nothing in forward; in backward, rounding the incoming gradient before relu's mask
      // or after it (h's own rounding, just below) gives the same bits (the mask only zeroes):
      // two rounding passes per layer saved, every value the same.
      const bool stored_relu = c == Compute::Emulated && f != Format::FP32 && m.activation == "relu";
      h = stored_relu ? torch::relu(h) : activation_as(h, m.activation, f, c);
    }
  }
  return h;
}

// Cross-entropy; like autocast, log-softmax and the loss run in fp32 unless `low` is set.
torch::Tensor loss_fn(const torch::Tensor& logits, const torch::Tensor& labels, Format f, Compute c, bool low) {
  if (!low) return torch::nn::functional::cross_entropy(logits.to(torch::kFloat), labels);
  auto logp = store_as(torch::log_softmax(logits, 1), f, c);
  return store_as(torch::nll_loss(logp, labels), f, c).to(torch::kFloat);
}

struct Evaluation {
  double loss, accuracy;
};

Evaluation evaluate(const Mlp& m, const Dataset& d, Format f, Compute c, bool low, torch::Device dev) {
  torch::NoGradGuard ng;
  double loss = 0, correct = 0;
  const int64_t chunk = 2000;
  for (int64_t i = 0; i < d.size(); i += chunk) {
    const int64_t n = std::min(chunk, d.size() - i);
    auto x = d.images.narrow(0, i, n).to(dev);
    auto y = d.labels.narrow(0, i, n).to(dev);
    auto logits = mlp_forward(m, x, f, c, nullptr);
    loss += loss_fn(logits, y, f, c, low).item<double>() * static_cast<double>(n);
    correct += (logits.argmax(1) == y).sum().item<double>();
  }
  return {loss / static_cast<double>(d.size()), correct / static_cast<double>(d.size())};
}

}  // namespace

RecipeRun train_recipe(const PrecisionRecipe& r, Compute c, const std::vector<torch::Tensor>& init,
                       const Dataset& train, const Dataset& test, const RecipeTraining& opt) {
  const int64_t steps = opt.steps;
  const int64_t batch = std::min<int64_t>(opt.batch, train.size());
  const int64_t per_epoch = train.size() / batch;
  const float lr = opt.lr;
  const bool low = opt.loss_in_low_precision;
  const auto seed = opt.seed;
  const float static_scale = opt.static_scale;
  const torch::Device device = opt.device;
  // Pure low-precision recipes store their weights in the format; master recipes keep fp32.
  const Format stored = r.master ? Format::FP32 : r.format;

  RecipeRun run;
  PeakScope scope(device);
  Mlp m{{}, opt.activation};
  // Native pure recipes hold their weights as tensors of the format's dtype; emulated ones as
  // fp32 tensors holding the format's values (the same numbers: both casts round to nearest even).
  for (const auto& p : init)
    m.params.push_back((c == Compute::Native && !r.master ? p.to(device, storage_dtype(stored))
                                                           : round_to(p, stored).to(device))
                           .clone()
                           .requires_grad_(true));
  GradScaler scaler(opt.scaler);
  torch::Tensor perm;
  int64_t perm_epoch = -1;
  // bf16+kahan: one bf16 compensation buffer per parameter, zeros at the start (optimi's kahan_comp).
  std::vector<torch::Tensor> comp;
  if (r.update == UpdateRounding::Kahan)
    for (const auto& p : m.params) comp.push_back(torch::zeros_like(p));
  int64_t update_no = 0;  // optimizer steps taken (seeds stochastic rounding)

  auto apply_update = [&] {
    torch::NoGradGuard ng;
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      auto& p = m.params[i];
      auto g = p.grad();
      if (!g.defined()) continue;
      // SGD: w − lr·g in fp32 math, stored in the weights' format (one rounding, as
      // PyTorch's fp16 kernels compute in fp32 and round the result) — the same arithmetic
      // for native and emulated weights; lost updates counted in the same pass. Without a
      // master copy, bf16+sr rounds that result stochastically and bf16+kahan carries what
      // rounding dropped in a compensation buffer (core/train/amp).
      const UpdateCounts c =
          r.update == UpdateRounding::Stochastic
              ? sgd_update_stochastic(p, g, lr, quant::derive_seed(seed, static_cast<std::uint64_t>(update_no) * 1024 + i))
          : r.update == UpdateRounding::Kahan ? sgd_update_kahan(p, comp[i], g, lr)
                                      : sgd_update_counting_lost(p, g, lr, stored);
      run.lost += c.lost;
      run.updates += c.updates;
    }
    ++update_no;
  };

  Progress progress(opt.progress, fmt::format("{}: {} ({})", opt.progress_label, r.name, r.format == Format::FP32 ? "fp32" : compute_name(c)),
                    steps, "steps");
  const double t0 = now_seconds();
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t epoch = step / per_epoch;
    if (epoch != perm_epoch) {
      perm = shuffled_indices(train.size(), seed + 1000003ULL * static_cast<std::uint64_t>(epoch + 1));
      perm_epoch = epoch;
    }
    auto idx = perm.narrow(0, (step % per_epoch) * batch, batch);
    auto x = train.images.index_select(0, idx).to(device);
    auto y = train.labels.index_select(0, idx).to(device);
    clear_grads(m.params);

    auto loss = loss_fn(mlp_forward(m, x, r.format, c, &run.grads), y, r.format, c, low);
    const float s = r.scaling == LossScaling::Static ? static_scale
                    : r.scaling == LossScaling::Dynamic ? scaler.get_scale() : 1.0f;
    run.loss.push_back(loss.item<double>());
    run.scale.push_back(s);
    if (opt.progress) progress.update(step + 1, fmt::format("loss {:.4f}  scale {:g}", run.loss.back(), s));
    switch (r.scaling) {
      case LossScaling::None:
        loss.backward();
        apply_update();
        break;
      case LossScaling::Static: {
        (loss * s).backward();
        // Unscale as GradScaler does (reciprocal in double), skip the step on inf/NaN.
        const float inv = static_cast<float>(1.0 / static_cast<double>(s));
        bool finite = true;
        torch::NoGradGuard ng;
        for (auto& p : m.params) {
          finite = finite && torch::isfinite(p.grad()).all().item<bool>();
          p.grad().mul_(inv);
        }
        if (finite) apply_update();
        else ++run.skipped;
        break;
      }
      case LossScaling::Dynamic: {
        scaler.scale(loss).backward();
        if (!scaler.step(m.params, apply_update)) ++run.skipped;
        try {
          scaler.update();
        } catch (const LossScaleError& e) {
          throw RuntimeFailure(fmt::format("recipe {} at step {}: {}", r.name, step + 1, e.what()));
        }
        break;
      }
    }
  }
  run.step_s = (now_seconds() - t0) / static_cast<double>(steps);
  progress.finish();
  run.peak_bytes = scope.peak_bytes();
  run.final_scale = r.scaling == LossScaling::Dynamic ? scaler.get_scale()
                    : r.scaling == LossScaling::Static ? static_scale : 1.0;
  Evaluation tr = evaluate(m, train, r.format, c, low, device);
  Evaluation te = evaluate(m, test, r.format, c, low, device);
  run.final_loss = tr.loss;
  run.accuracy = te.accuracy;
  return run;
}

}  // namespace mpt
