// Training an MLP with quantized Linear layers: see quant_train.hpp.
#include "core/train/quant_train.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "core/train/amp.hpp"
#include "core/models/mlp.hpp"
#include "core/runtime/runtime.hpp"

namespace mpt::quant {

QuantMlp make_quant_mlp(const std::vector<torch::Tensor>& init, const std::vector<QuantRecipe>& recipes) {
  if (init.size() != 2 * recipes.size())
    throw std::invalid_argument(fmt::format("make_quant_mlp: {} parameters for {} recipes (expected W and b per layer)", init.size(),
                                            recipes.size()));
  QuantMlp n;
  for (const auto& p : init) n.params.push_back(p.detach().clone().requires_grad_(true));
  for (const auto& r : recipes) {
    QuantLinear ql(1, 1, r, /*bias=*/false);
    ql->keep_ledger = false;
    n.layers.push_back(ql);
  }
  return n;
}

torch::Tensor forward(QuantMlp& n, const torch::Tensor& images, std::vector<torch::Tensor>* outputs) {
  auto h = images.reshape({images.size(0), -1});
  const std::size_t L = n.layers.size();
  for (std::size_t l = 0; l < L; ++l) {
    auto z = quantized_linear(h, n.params[2 * l], n.params[2 * l + 1], *n.layers[l]);
    if (outputs) outputs->push_back(z);
    h = l + 1 < L ? torch::relu(z) : z;
  }
  return h;
}

Evaluation evaluate(QuantMlp& n, const Dataset& d, std::int64_t chunk) {
  torch::NoGradGuard ng;
  for (auto& l : n.layers) l->eval();
  double loss = 0, correct = 0;
  for (std::int64_t i = 0; i < d.size(); i += chunk) {
    const std::int64_t c = std::min(chunk, d.size() - i);
    auto logits = forward(n, d.images.narrow(0, i, c));
    auto y = d.labels.narrow(0, i, c);
    loss += torch::nn::functional::cross_entropy(logits, y).item<double>() * static_cast<double>(c);
    correct += (logits.argmax(1) == y).sum().item<double>();
  }
  for (auto& l : n.layers) l->train();
  return {loss / static_cast<double>(d.size()), correct / static_cast<double>(d.size())};
}

bool diverged(const TrainRun& r) {
  return std::any_of(r.loss.begin(), r.loss.end(), [](double v) { return !std::isfinite(v); }) ||
         !std::isfinite(r.test.loss);
}

TrainRun train(QuantMlp& n, const Dataset& train_set, const Dataset& test_set, const TrainPlan& plan, bool tty,
               const std::string& progress_label) {
  const std::int64_t batch = std::min<std::int64_t>(plan.batch, train_set.size());
  const std::int64_t per_epoch = train_set.size() / batch;
  const float lr = static_cast<float>(plan.lr);
  TrainRun run;
  run.ledger.resize(n.layers.size());
  Progress progress(tty, progress_label, plan.steps, "steps");
  torch::Tensor perm;
  std::int64_t perm_epoch = -1;
  const double t0 = now_seconds();
  for (std::int64_t step = 0; step < plan.steps; ++step) {
    const bool record = std::find(plan.ledger_steps.begin(), plan.ledger_steps.end(), step) != plan.ledger_steps.end();
    for (auto& l : n.layers) l->keep_ledger = record;
    const std::int64_t epoch = step / per_epoch;
    if (epoch != perm_epoch) {
      perm = shuffled_indices(train_set.size(), plan.seed + 1000003ULL * static_cast<std::uint64_t>(epoch + 1));
      perm_epoch = epoch;
    }
    auto idx = perm.narrow(0, (step % per_epoch) * batch, batch);
    auto x = train_set.images.index_select(0, idx);
    auto y = train_set.labels.index_select(0, idx);
    if (step == plan.outlier_step) x = x * static_cast<float>(plan.outlier_factor);
    clear_grads(n.params);
    std::vector<torch::Tensor> outs;
    const bool capture = step == plan.capture_step;
    auto loss = torch::nn::functional::cross_entropy(forward(n, x, capture ? &outs : nullptr), y);
    if (capture)
      for (auto& z : outs) z.retain_grad();
    loss.backward();
    if (capture) {
      auto h = x.reshape({x.size(0), -1});
      for (std::size_t l = 0; l < outs.size(); ++l) {
        run.captured.x.push_back(h.detach().clone());
        run.captured.w.push_back(n.params[2 * l].detach().clone());
        run.captured.dy.push_back(outs[l].grad().detach().clone());
        h = torch::relu(outs[l]).detach();
      }
    }
    if (!(step == plan.outlier_step && plan.skip_outlier_update)) {
      torch::NoGradGuard ng;
      for (auto& p : n.params) p.add_(p.grad(), -lr);
    }
    for (auto& l : n.layers) l->update_scales();
    run.loss.push_back(loss.item<double>());
    progress.update(step + 1, fmt::format("loss {:.4f}", run.loss.back()));
  }
  run.step_s = (now_seconds() - t0) / static_cast<double>(std::max<std::int64_t>(plan.steps, 1));
  progress.finish();
  for (std::size_t l = 0; l < n.layers.size(); ++l) {
    run.ledger[l] = n.layers[l]->ledger();
    n.layers[l]->keep_ledger = false;
  }
  if (plan.evaluate) run.test = evaluate(n, test_set);
  return run;
}

const GemmLedger* find_gemm(const std::vector<GemmLedger>& v, std::int64_t step, const std::string& gemm) {
  for (const auto& g : v)
    if (g.step == step && g.gemm == gemm) return &g;
  return nullptr;
}

// ───────────────────────────── the tiny GPT ─────────────────────────────

std::vector<GptLinearShape> gpt_linear_shapes(const GptConfig& c) {
  std::vector<GptLinearShape> v;
  const std::int64_t C = c.width, H = c.mlp_ratio * c.width;
  for (std::int64_t i = 0; i < c.layers; ++i) {
    const std::string h = "h" + std::to_string(i) + ".";
    v.push_back({h + "c_attn", C, 3 * C});
    v.push_back({h + "attn_proj", C, C});
    v.push_back({h + "c_fc", C, H});
    v.push_back({h + "mlp_proj", H, C});
  }
  return v;
}

QuantGptLinears make_quant_gpt_linears(const GptConfig& c, const QuantRecipe& r, const DelayedScaling* delayed) {
  QuantGptLinears q;
  for (const auto& s : gpt_linear_shapes(c)) {
    QuantLinear ql(1, 1, r, /*bias=*/false);
    ql->keep_ledger = false;
    if (delayed) ql->set_delayed_scaling(*delayed);
    q.names.push_back(s.name);
    q.layers.emplace(s.name, ql);
  }
  return q;
}

QuantGptLinears make_quant_gpt_linears(const GptConfig& c, const std::vector<QuantRecipe>& recipes) {
  const auto shapes = gpt_linear_shapes(c);
  if (recipes.size() != shapes.size())
    throw std::invalid_argument("make_quant_gpt_linears: " + std::to_string(recipes.size()) + " recipes for " +
                                std::to_string(shapes.size()) + " block Linears");
  QuantGptLinears q;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    QuantLinear ql(1, 1, recipes[i], /*bias=*/false);
    ql->keep_ledger = false;
    q.names.push_back(shapes[i].name);
    q.layers.emplace(shapes[i].name, ql);
  }
  return q;
}

GptLinear gpt_linear(QuantGptLinears& q) {
  return [&q](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, const std::string& name) {
    return quantized_linear(x, w, b, *q.layers.at(name));
  };
}

GptTrainRun train_gpt(TinyGpt& model, QuantGptLinears& q, const TextCorpus& corpus, const GptTrainPlan& plan, bool tty,
                      const std::string& progress_label) {
  const std::int64_t T = model->cfg.context;
  auto params = model->parameters();
  SgdMomentum opt(params, plan.lr, plan.momentum);
  const GptLinear lin = gpt_linear(q);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(plan.seed);
  GptTrainRun run;
  Progress progress(tty, progress_label, plan.steps, "steps");
  const double t0 = now_seconds();
  for (std::int64_t step = 0; step < plan.steps; ++step) {
    for (auto& kv : q.layers) kv.second->keep_ledger = step == plan.ledger_step;
    auto [x, y] = text_batch(corpus.train, plan.batch, T, gen);
    auto loss = gpt_loss(model->forward(x, {}, lin), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    for (auto& kv : q.layers) kv.second->update_scales();
    run.loss.push_back(loss.item<double>());
    progress.update(step + 1, fmt::format("loss {:.4f}", run.loss.back()));
  }
  run.step_s = (now_seconds() - t0) / static_cast<double>(std::max<std::int64_t>(plan.steps, 1));
  progress.finish();
  for (auto& [name, l] : q.layers) {
    run.ledger[name] = l->ledger();
    l->keep_ledger = false;
    l->eval();  // validation: delayed scaling records no amax
  }
  torch::NoGradGuard ng;
  auto vgen = at::make_generator<at::CPUGeneratorImpl>(plan.seed + 1);
  double sum = 0;
  for (std::int64_t b = 0; b < plan.eval_batches; ++b) {
    auto [x, y] = text_batch(corpus.val, plan.batch, T, vgen);
    sum += gpt_loss(model->forward(x, {}, lin), y).item<double>();
  }
  run.val_loss = sum / static_cast<double>(std::max<std::int64_t>(plan.eval_batches, 1));
  for (auto& kv : q.layers) kv.second->train();
  return run;
}

GptTrainPlan gpt_train_plan_at(const Config& cfg, const std::string& prefix, std::uint64_t seed) {
  GptTrainPlan plan;
  plan.steps = cfg.integer(prefix + "/steps");
  plan.batch = cfg.integer(prefix + "/batch");
  plan.lr = cfg.number(prefix + "/lr");
  plan.momentum = cfg.number(prefix + "/momentum");
  plan.seed = seed;
  plan.ledger_step = cfg.integer(prefix + "/ledger_step");
  plan.eval_batches = cfg.integer(prefix + "/eval_batches");
  return plan;
}

}  // namespace mpt::quant
