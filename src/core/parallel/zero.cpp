// core/parallel, sharded data parallelism: ShardedDataParallel, ZeRO stages 0-3 over FSDP2's
// dim-0 shards (the layout and its collectives: zero_shards.cpp). See parallel/zero.hpp.
#include "core/parallel/zero.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include <fmt/format.h>

namespace mpt::dist {

namespace F = torch::nn::functional;

namespace {

int64_t nbytes(const torch::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()) : 0;
}

std::vector<int64_t> with_rows(const torch::Tensor& t, int64_t rows) {
  auto s = t.sizes().vec();
  s[0] = rows;
  return s;
}

}  // namespace

// ----------------------------------------------------------------------------
// ShardedDataParallel
// ----------------------------------------------------------------------------

struct ShardedDataParallel::Param {
  std::vector<int64_t> shape;
  Dim0Split split;
  torch::Tensor compute;  // stages 0-2: the unsharded parameter forward uses (param_dtype, a leaf)
  torch::Tensor master;   // the fp32 leaf the optimizer updates: stage 0 unsharded, stages 1-3 the shard
  bool master_is_compute = false;  // stage 0 in fp32: one tensor
  torch::Tensor unsharded_grad;    // stage 3, reduce after the last micro-batch: the local sum so far
};

struct ShardedDataParallel::Op {
  bool linear = false;
  std::size_t w = 0, b = 0;
  bool has_bias = false;
  torch::nn::AnyModule module;  // parameter-free modules
};

namespace {

std::vector<std::size_t> ids(int64_t w, int64_t b) {
  std::vector<std::size_t> v{static_cast<std::size_t>(w)};
  if (b >= 0) v.push_back(static_cast<std::size_t>(b));
  return v;
}

// Stage 3's Linear: all-gather before forward and before backward, free after each (FSDP2's
// unshard / reshard), reduce-scatter the weight and bias gradients in backward.
struct GatheredLinear : public torch::autograd::Function<GatheredLinear> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w_shard, const torch::Tensor& b_shard, ShardedDataParallel* e,
                               int64_t w, int64_t b) {
    ctx->save_for_backward({x});
    ctx->saved_data["engine"] = static_cast<int64_t>(reinterpret_cast<std::intptr_t>(e));
    ctx->saved_data["w"] = w;
    ctx->saved_data["b"] = b;
    ctx->saved_data["x_grad"] = x.requires_grad();
    (void)w_shard;
    (void)b_shard;  // the shards are inputs so that autograd routes their gradients
    const auto full = e->gather_params(ids(w, b));  // one all-gather for the layer (FSDP2's param group)
    return F::linear(x, full[0], b >= 0 ? full[1] : torch::Tensor());  // freed on return (reshard)
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list gy) {
    auto* e = reinterpret_cast<ShardedDataParallel*>(static_cast<std::intptr_t>(ctx->saved_data["engine"].toInt()));
    const auto w = static_cast<std::size_t>(ctx->saved_data["w"].toInt());
    const int64_t b = ctx->saved_data["b"].toInt();
    const bool x_grad = ctx->saved_data["x_grad"].toBool();
    const auto x = ctx->get_saved_variables()[0];
    // Gather again and run LibTorch's own backward of the same linear on the same values.
    torch::AutoGradMode on(true);
    auto xd = x.detach().requires_grad_(x_grad);
    auto full = e->gather_params(ids(static_cast<int64_t>(w), b));
    auto wd = full[0].requires_grad_(true);
    torch::Tensor bd;
    std::vector<torch::Tensor> inputs{wd};
    if (b >= 0) {
      bd = full[1].requires_grad_(true);
      inputs.push_back(bd);
    }
    if (x_grad) inputs.push_back(xd);
    auto y = F::linear(xd, wd, bd);
    auto g = torch::autograd::grad({y}, inputs, {gy[0]});
    std::vector<torch::Tensor> gs{g[0]};
    if (b >= 0) gs.push_back(g[1]);
    auto red = e->reduce_param_grads(ids(static_cast<int64_t>(w), b), gs);  // one reduce-scatter
    torch::Tensor gw = red[0];
    torch::Tensor gb = b >= 0 ? red[1] : torch::Tensor();
    torch::Tensor gx = x_grad ? g.back() : torch::Tensor();
    return {gx, gw, gb, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Stage 3 of a whole module (FSDP2's fully_shard on the root alone): all-gather every parameter
// before the forward and free them after it; in backward gather again, recompute the forward
// with autograd on and take its gradients (the same operations on the same values), then one
// reduce-scatter of all of them.
struct GatheredModule : public torch::autograd::Function<GatheredModule> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, at::TensorList shards,
                               ShardedDataParallel* e) {
    (void)shards;  // inputs so that autograd routes the shards' gradients
    ctx->save_for_backward({x});
    ctx->saved_data["engine"] = static_cast<int64_t>(reinterpret_cast<std::intptr_t>(e));
    ctx->saved_data["x_grad"] = x.requires_grad();
    e->bind_module_params(true);
    auto y = e->module_forward()(x);
    e->bind_module_params(false);  // reshard after forward
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list gy) {
    auto* e = reinterpret_cast<ShardedDataParallel*>(static_cast<std::intptr_t>(ctx->saved_data["engine"].toInt()));
    const bool x_grad = ctx->saved_data["x_grad"].toBool();
    const auto x = ctx->get_saved_variables()[0];
    torch::AutoGradMode on(true);
    auto xd = x.detach();
    if (x_grad) xd.requires_grad_(true);
    e->bind_module_params(true);
    std::vector<torch::Tensor> inputs = e->module_params();
    const std::size_t k = inputs.size();
    if (x_grad) inputs.push_back(xd);
    std::vector<torch::Tensor> g;
    {
      auto y = e->module_forward()(xd);
      g = torch::autograd::grad({y}, inputs, {gy[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                                /*allow_unused=*/true);
    }
    std::vector<std::size_t> ids(k);
    std::vector<torch::Tensor> gs(k);
    for (std::size_t i = 0; i < k; ++i) {
      ids[i] = i;
      gs[i] = g[i].defined() ? g[i] : torch::zeros_like(inputs[i]);  // a parameter the forward did not use
    }
    e->bind_module_params(false);
    auto red = e->reduce_param_grads(ids, gs);  // one reduce-scatter
    torch::autograd::variable_list out{x_grad ? g.back() : torch::Tensor()};
    for (auto& t : red) out.push_back(t);
    out.push_back(torch::Tensor());  // the engine pointer
    return out;
  }
};

}  // namespace

std::size_t ShardedDataParallel::init_param(const torch::Tensor& t, const std::string& what,
                                            torch::Tensor module_param) {
  torch::NoGradGuard ng;
  const int n = group_->size(), r = group_->rank();
  Param p;
  auto full = t.detach().to(torch::kFloat32).clone().contiguous();
  group_->broadcast(full, 0);  // DDP / FSDP: every rank starts from rank 0's values
  p.shape = full.sizes().vec();
  if (full.dim() == 0) throw std::invalid_argument("ShardedDataParallel: expected tensors of >= 1 dims, got " + what);
  if (opts_.stage == 3 && full.size(0) < n)
    throw std::invalid_argument(fmt::format("ShardedDataParallel: stage 3 shards {} ({} rows) over {} ranks: "
                                            "expected at least one row per rank", what, full.size(0), n));
  p.split = dim0_split(full.size(0), r, n);
  numel_ += full.numel();
  padded_numel_ += n * p.split.chunk * (full.numel() / full.size(0));
  // The compute tensor: the module's own parameter (whole-module wrapper) or a fresh leaf.
  auto as_compute = [&](const torch::Tensor& values) {
    if (!module_param.defined()) return values.requires_grad_(true);
    module_param.set_data(values);
    return module_param;
  };
  if (opts_.stage == 0) {
    if (opts_.param_dtype == torch::kFloat32) {
      p.compute = as_compute(full);
      p.master = p.compute;
      p.master_is_compute = true;
    } else {
      p.compute = as_compute(full.to(opts_.param_dtype));
      p.master = full.requires_grad_(true);
    }
  } else {
    if (opts_.stage < 3)
      p.compute = as_compute(full.to(opts_.param_dtype).clone());
    else if (module_param.defined())
      module_param.set_data(torch::empty({0}, torch::TensorOptions().dtype(opts_.param_dtype)));  // resharded
    p.master = shard_dim0(full, r, n).requires_grad_(true);
  }
  params_.push_back(std::move(p));
  return params_.size() - 1;
}

ShardedDataParallel::ShardedDataParallel(const torch::nn::Sequential& net, std::shared_ptr<Group> group,
                                         ShardOptions opts, const OptimizerFactory& make_optimizer)
    : group_(std::move(group)), opts_(opts) {
  if (opts_.stage < 0 || opts_.stage > 3)
    throw std::invalid_argument(fmt::format("ShardedDataParallel: expected a ZeRO stage 0..3, got {}", opts_.stage));
  auto add = [&](const torch::Tensor& t, const std::string& what) { return init_param(t, what, torch::Tensor()); };
  for (const auto& m : *net) {
    Op op;
    if (auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(m.ptr())) {
      op.linear = true;
      op.w = add(lin->weight, fmt::format("a Linear weight {}", c10::str(lin->weight.sizes())));
      if (lin->bias.defined()) {
        op.has_bias = true;
        op.b = add(lin->bias, fmt::format("a Linear bias {}", c10::str(lin->bias.sizes())));
      }
    } else {
      if (!m.ptr()->parameters().empty())
        throw std::invalid_argument("ShardedDataParallel: expected Linear layers and parameter-free modules, got " +
                                    m.ptr()->name());
      op.module = m;
    }
    ops_.push_back(std::move(op));
  }
  std::vector<torch::Tensor> masters;
  for (auto& p : params_) masters.push_back(p.master);
  opt_ = make_optimizer(masters);
  init_flat();
}

ShardedDataParallel::ShardedDataParallel(std::shared_ptr<torch::nn::Module> module, Forward forward,
                                         std::shared_ptr<Group> group, ShardOptions opts,
                                         const OptimizerFactory& make_optimizer)
    : group_(std::move(group)), opts_(opts), module_(std::move(module)), module_forward_(std::move(forward)) {
  if (opts_.stage < 0 || opts_.stage > 3)
    throw std::invalid_argument(fmt::format("ShardedDataParallel: expected a ZeRO stage 0..3, got {}", opts_.stage));
  if (!module_ || !module_forward_) throw std::invalid_argument("ShardedDataParallel: expected a module and its forward");
  for (auto& kv : module_->named_parameters(/*recurse=*/true)) {
    module_params_.push_back(kv.value());
    init_param(kv.value(), fmt::format("parameter {} {}", kv.key(), c10::str(kv.value().sizes())), kv.value());
  }
  if (params_.empty()) throw std::invalid_argument("ShardedDataParallel: expected a module with parameters");
  std::vector<torch::Tensor> masters;
  for (auto& p : params_) masters.push_back(p.master);
  opt_ = make_optimizer(masters);
  init_flat();
}

void ShardedDataParallel::init_flat() {
  if (opts_.stage != 1 && opts_.stage != 2) return;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& p : params_) shapes.push_back(p.shape);
  flat_ = std::make_unique<FlatShardGroup>(std::move(shapes), group_->rank(), group_->size());
  flat_->keep_terms(opts_.record_reductions);
  grad_flat_ = torch::zeros({flat_->shard_numel()}, torch::kFloat32);
}

void ShardedDataParallel::bind_module_params(bool bind) {
  torch::NoGradGuard ng;
  if (!bind) {
    for (auto& t : module_params_) t.set_data(torch::empty({0}, torch::TensorOptions().dtype(opts_.param_dtype)));
    return;
  }
  std::vector<std::size_t> all(params_.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  auto fulls = gather_params(all);  // one all-gather: the root's parameter group
  for (std::size_t i = 0; i < all.size(); ++i) module_params_[i].set_data(fulls[i]);
}

ShardedDataParallel::~ShardedDataParallel() = default;

std::vector<torch::Tensor> ShardedDataParallel::gather_params(const std::vector<std::size_t>& ids) {
  std::vector<torch::Tensor> shards, fulls;
  for (auto i : ids) {
    shards.push_back(params_[i].master.detach());
    fulls.push_back(torch::empty(params_[i].shape, torch::TensorOptions().dtype(opts_.param_dtype)));
  }
  all_gather_dim0(*group_, shards, fulls);
  return fulls;
}

std::vector<torch::Tensor> ShardedDataParallel::reduce_param_grads(const std::vector<std::size_t>& ids,
                                                                  const std::vector<torch::Tensor>& grads) {
  std::vector<torch::Tensor> fulls, outs;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    Param& p = params_[ids[k]];
    torch::Tensor full = grads[k];
    if (!opts_.reduce_every_micro_batch) {
      // FSDP2 without gradient sync: accumulate the unsharded gradient locally, in the order the
      // AccumulateGrad of stages 0-2 sums it (the first copied, the next ones added).
      if (p.unsharded_grad.defined()) full = p.unsharded_grad + grads[k];
      if (!syncing_) {
        p.unsharded_grad = p.unsharded_grad.defined() ? full : grads[k].clone();
        continue;
      }
      p.unsharded_grad = torch::Tensor();
    }
    fulls.push_back(full);
    outs.push_back(torch::empty(with_rows(p.master, p.split.rows), torch::TensorOptions().dtype(torch::kFloat32)));
  }
  if (fulls.empty()) return std::vector<torch::Tensor>(ids.size());  // nothing reaches the shards yet
  // One reduce-scatter of the layer's (or the root's) group; its buffers are transient, freed
  // with the gathered parameters (stage 3 holds no unsharded-size buffer between layers).
  FlatShardGroup fg(shapes_of(fulls), group_->rank(), group_->size());
  fg.keep_terms(opts_.record_reductions);
  auto part = fg.reduce_scatter_flat(*group_, fulls, opts_.reduce_dtype, static_cast<double>(group_->size()));
  torch::NoGradGuard ng;
  for (std::size_t i = 0; i < outs.size(); ++i)
    outs[i].copy_(part.narrow(0, fg.shard_offset(i), outs[i].numel()).view(outs[i].sizes()));
  if (opts_.record_reductions) records_.push_back({fg.kept_terms(), part.clone(), /*scattered=*/true});
  return outs;  // AccumulateGrad adds them to the shards' .grad
}

torch::Tensor ShardedDataParallel::forward(const torch::Tensor& x) {
  torch::Tensor h = x.is_floating_point() ? x.to(opts_.param_dtype) : x;
  if (module_) {
    if (opts_.stage < 3) return module_forward_(h);
    std::vector<torch::Tensor> shards;
    for (auto& p : params_) shards.push_back(p.master);
    return GatheredModule::apply(h, at::TensorList(shards), this);
  }
  for (auto& op : ops_) {
    if (!op.linear) {
      h = op.module.forward(h);
      continue;
    }
    if (opts_.stage < 3) {
      h = F::linear(h, params_[op.w].compute, op.has_bias ? params_[op.b].compute : torch::Tensor());
    } else {
      h = GatheredLinear::apply(h, params_[op.w].master, op.has_bias ? params_[op.b].master : torch::Tensor(), this,
                                static_cast<int64_t>(op.w), op.has_bias ? static_cast<int64_t>(op.b) : int64_t{-1});
    }
  }
  return h;
}

void ShardedDataParallel::reduce_unsharded(bool accumulate) {
  const double n = static_cast<double>(group_->size());
  torch::NoGradGuard ng;
  if (opts_.stage == 0) {
    std::vector<torch::Tensor> ins, outs;
    for (auto& p : params_) {
      ins.push_back(p.compute.grad());
      if (!p.master_is_compute) p.master.mutable_grad() = torch::empty(p.shape, torch::kFloat32);
      outs.push_back(p.master.grad());
    }
    torch::Tensor terms;
    if (opts_.record_reductions) {  // the summands allreduce_flat sends: the same cast and divide
      std::vector<torch::Tensor> flat;
      for (const auto& t : ins) flat.push_back(t.reshape({-1}).to(opts_.reduce_dtype));
      terms = torch::cat(flat).div_(n);
    }
    allreduce_flat(*group_, ins, outs, opts_.reduce_dtype, n);
    if (opts_.record_reductions) {
      std::vector<torch::Tensor> flat;
      for (const auto& t : outs) flat.push_back(t.reshape({-1}).to(opts_.reduce_dtype));  // exact: widened
      records_.push_back({terms, torch::cat(flat), /*scattered=*/false});
    }
    return;
  }
  // One reduce-scatter for every parameter (FSDP2's foreach_reduce; DeepSpeed's buckets) of the
  // group's persistent [N, C] buffer; the fp32 gradient shards are views of one flat buffer
  // (grad_flat_, same layout as the reduce-scatter output), filled by one copy or one add.
  const bool have = accumulate && params_.front().master.grad().defined();
  std::vector<torch::Tensor> fulls;
  for (auto& p : params_) fulls.push_back(p.compute.grad());
  // Without a gradient to add to, an fp32 reduce-scatter writes the gradient shards directly.
  const bool direct = !have && opts_.reduce_dtype == torch::kFloat32 && grad_flat_.device() == fulls.front().device();
  auto part = flat_->reduce_scatter_flat(*group_, fulls, opts_.reduce_dtype, n, direct ? grad_flat_ : torch::Tensor());
  if (opts_.record_reductions) records_.push_back({flat_->kept_terms(), part.clone(), /*scattered=*/true});
  if (have) {
    grad_flat_.add_(part);
  } else {
    if (!direct) grad_flat_.copy_(part);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      p.master.mutable_grad() = grad_flat_.narrow(0, flat_->shard_offset(i), p.master.numel()).view(p.master.sizes());
    }
  }
  if (opts_.stage == 2)
    for (auto& p : params_) p.compute.mutable_grad() = torch::Tensor();  // only the shard is kept
}

void ShardedDataParallel::backward(const torch::Tensor& loss, bool last) {
  syncing_ = last || opts_.reduce_every_micro_batch;
  loss.backward();
  if (opts_.stage < 2 && last) reduce_unsharded(false);
  if (opts_.stage == 2 && syncing_) reduce_unsharded(/*accumulate=*/true);
}

void ShardedDataParallel::step() {
  note_held();
  opt_->step();
  {
    torch::NoGradGuard ng;
    std::vector<torch::Tensor> shards, fulls;
    for (auto& p : params_) {
      if (opts_.stage == 0 && !p.master_is_compute) p.compute.copy_(p.master);
      shards.push_back(p.master.detach());
      if (p.compute.defined()) fulls.push_back(p.compute.detach());
    }
    // Stages 1-2: one all-gather of the updated shards, cast to param_dtype first (FSDP2), through
    // the group's persistent buffers.
    if (flat_) flat_->all_gather(*group_, shards, fulls);
  }
  note_held();
  for (auto& p : params_) {  // zero_grad(set_to_none=True)
    if (p.compute.defined()) p.compute.mutable_grad() = torch::Tensor();
    p.master.mutable_grad() = torch::Tensor();
  }
}

std::vector<torch::Tensor> ShardedDataParallel::full_parameters() {
  std::vector<torch::Tensor> out, shards;
  for (auto& p : params_) {
    out.push_back(opts_.stage == 0 ? p.master.detach().clone() : torch::empty(p.shape, torch::kFloat32));
    shards.push_back(p.master.detach());
  }
  if (flat_)
    flat_->all_gather(*group_, shards, out);
  else if (opts_.stage > 0)
    all_gather_dim0(*group_, shards, out);  // stage 3: transient buffers (freed, as the reshard frees them)
  return out;
}

HeldBytes ShardedDataParallel::held() const {
  HeldBytes h;
  for (const auto& p : params_) {
    h.params += opts_.stage < 3 ? nbytes(p.compute) : nbytes(p.master);
    if (p.compute.defined()) h.grads += nbytes(p.compute.grad());
    if (!p.master_is_compute) h.grads += nbytes(p.master.grad());
    h.grads += nbytes(p.unsharded_grad);
    if (opts_.stage < 3 && !p.master_is_compute) h.optimizer += nbytes(p.master);
  }
  for (const auto& kv : opt_->state()) {
    if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(kv.second.get()))
      h.optimizer += nbytes(a->exp_avg()) + nbytes(a->exp_avg_sq()) + nbytes(a->max_exp_avg_sq());
    else if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(kv.second.get()))
      h.optimizer += nbytes(s->momentum_buffer());
  }
  return h;
}

void ShardedDataParallel::note_held() {
  const HeldBytes h = held();
  held_peak_.params = std::max(held_peak_.params, h.params);
  held_peak_.grads = std::max(held_peak_.grads, h.grads);
  held_peak_.optimizer = std::max(held_peak_.optimizer, h.optimizer);
}

}  // namespace mpt::dist
