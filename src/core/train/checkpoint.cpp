// Gradient checkpointing as a custom autograd Function. See checkpoint.hpp.
#include "core/train/checkpoint.hpp"

#include "core/runtime/runtime.hpp"

#include <mutex>
#include <stdexcept>

#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

namespace mpt {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward pass needs besides the saved input: the segment itself, the tensors
// to differentiate, and the RNG state at entry. Held by the autograd context through an
// IValue capsule (saved_data holds IValues only).
struct Segment : torch::CustomClassHolder {
  SegmentFn fn;
  std::vector<torch::Tensor> params;
  bool preserve_rng = true;
  bool input_requires_grad = false;
  std::vector<at::Generator> gens;    // generators whose state is saved
  std::vector<torch::Tensor> states;  // their states at the segment's entry
};

// The generators a segment on `device` may draw from: the CPU one always (PyTorch saves
// torch.get_rng_state() unconditionally), plus the device's own for an accelerator.
std::vector<at::Generator> generators_for(const torch::Device& device) {
  std::vector<at::Generator> gens{at::globalContext().defaultGenerator(torch::kCPU)};
  if (!device.is_cpu()) gens.push_back(at::globalContext().defaultGenerator(device));
  return gens;
}

// Runs the recomputation with the entry RNG state and puts the current state back
// afterwards (torch.random.fork_rng), so checkpointing leaves the generator where the
// plain run would.
class ForkedRng {
 public:
  explicit ForkedRng(Segment& s) : seg_(s) {
    if (!seg_.preserve_rng) return;
    for (auto& g : seg_.gens) now_.push_back(generator_state(g));
    for (std::size_t i = 0; i < seg_.gens.size(); ++i) set_generator_state(seg_.gens[i], seg_.states[i]);
  }
  ~ForkedRng() {
    for (std::size_t i = 0; i < now_.size(); ++i) set_generator_state(seg_.gens[i], now_[i]);
  }
  ForkedRng(const ForkedRng&) = delete;
  ForkedRng& operator=(const ForkedRng&) = delete;

 private:
  Segment& seg_;
  std::vector<torch::Tensor> now_;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // Inputs as autograd sees them: [segment capsule (not a tensor), input, params...].
  // `params` are inputs only so that autograd routes their gradients (backward returns them);
  // forward reads them through the segment's function.
  static variable_list forward(AutogradContext* ctx, c10::IValue capsule, const torch::Tensor& input,
                               at::TensorList /*params*/) {
    // Autograd is off here (Function::apply runs forward under AutoGradMode(false)):
    // the segment's intermediate tensors die as soon as they are consumed.
    auto holder = capsule.toCapsule();  // keeps the Segment alive while `seg` is used
    auto* seg = static_cast<Segment*>(holder.get());
    if (seg->preserve_rng) {
      seg->gens = generators_for(input.device());
      for (auto& g : seg->gens) seg->states.push_back(generator_state(g));
    }
    ctx->saved_data["segment"] = capsule;
    ctx->save_for_backward({input});
    return {seg->fn(input)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto holder = ctx->saved_data["segment"].toCapsule();
    auto* seg = static_cast<Segment*>(holder.get());
    auto saved = ctx->get_saved_variables();
    const std::size_t np = seg->params.size();
    variable_list grads(2 + np);  // undefined = no gradient (capsule; unused inputs)

    torch::Tensor x = saved.at(0).detach();
    x.requires_grad_(seg->input_requires_grad);
    torch::Tensor y;
    {
      ForkedRng rng(*seg);
      torch::AutoGradMode enable(true);
      y = seg->fn(x);
    }
    if (!y.requires_grad()) return grads;

    std::vector<torch::Tensor> wrt;
    std::vector<std::size_t> slot;  // position of each wrt tensor in `grads`
    if (seg->input_requires_grad) {
      wrt.push_back(x);
      slot.push_back(1);
    }
    for (std::size_t i = 0; i < np; ++i)
      if (seg->params[i].requires_grad()) {
        wrt.push_back(seg->params[i]);
        slot.push_back(2 + i);
      }
    if (wrt.empty()) return grads;
    auto g = torch::autograd::grad({y}, wrt, {grad_outputs.at(0)}, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    for (std::size_t i = 0; i < g.size(); ++i) grads[slot[i]] = g[i];
    return grads;
  }
};

}  // namespace

torch::Tensor checkpoint(const SegmentFn& fn, const torch::Tensor& input, const std::vector<torch::Tensor>& params,
                         const CheckpointOptions& opts) {
  if (!fn) throw std::invalid_argument("checkpoint: empty segment function");
  if (!input.defined()) throw std::invalid_argument("checkpoint: undefined input tensor");
  bool any_grad = input.requires_grad();
  for (const auto& p : params) any_grad = any_grad || p.requires_grad();
  if (!torch::GradMode::is_enabled() || !any_grad) return fn(input);  // nothing to save for

  auto seg = c10::make_intrusive<Segment>();
  seg->fn = fn;
  seg->params = params;
  seg->preserve_rng = opts.preserve_rng_state;
  seg->input_requires_grad = input.requires_grad();
  auto capsule = c10::IValue::make_capsule(seg);
  auto out = CheckpointFunction::apply(capsule, input, at::TensorList(params));
  return out.at(0);
}

std::vector<std::pair<int64_t, int64_t>> sequential_segments(int64_t n, int64_t segments) {
  if (segments < 1 || segments > n)
    throw std::invalid_argument("checkpoint_sequential: segments must be between 1 and the number of modules (" +
                                std::to_string(n) + "), got " + std::to_string(segments));
  const int64_t size = n / segments;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t s = 0; s < segments - 1; ++s) ranges.emplace_back(s * size, (s + 1) * size);
  ranges.emplace_back((segments - 1) * size, n);
  return ranges;
}

int64_t recomputed_modules(int64_t n, int64_t segments) {
  auto r = sequential_segments(n, segments);
  return r.back().first;  // everything before the last (plain) segment
}

torch::Tensor checkpoint_sequential(const torch::nn::Sequential& net, int64_t segments, const torch::Tensor& input,
                                    const CheckpointOptions& opts) {
  const int64_t n = static_cast<int64_t>(net->size());
  auto ranges = sequential_segments(n, segments);
  std::shared_ptr<torch::nn::SequentialImpl> impl = net.ptr();
  auto run = [impl](int64_t b, int64_t e) {
    return [impl, b, e](const torch::Tensor& x) {
      torch::Tensor h = x;
      for (int64_t i = b; i < e; ++i) h = (impl->begin() + i)->forward(h);
      return h;
    };
  };
  torch::Tensor h = input;
  for (std::size_t s = 0; s < ranges.size(); ++s) {
    auto [b, e] = ranges[s];
    if (s + 1 == ranges.size()) {
      h = run(b, e)(h);  // the last segment: kept, as PyTorch does
    } else {
      std::vector<torch::Tensor> params;
      for (int64_t i = b; i < e; ++i)
        for (const auto& p : (impl->begin() + i)->ptr()->parameters()) params.push_back(p);
      h = checkpoint(run(b, e), h, params, opts);
    }
  }
  return h;
}

}  // namespace mpt
