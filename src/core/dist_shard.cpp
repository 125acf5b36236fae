// core/dist, sharding: ZeRO stages 0-3 with FSDP2's dim-0 sharding. See dist_shard.hpp.
#include "core/dist_shard.hpp"

#include <algorithm>
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

Dim0Split dim0_split(int64_t dim0, int rank, int world) {
  if (dim0 < 1 || world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument(fmt::format("dim0_split: expected dim0 >= 1 and 0 <= rank < world, got dim0 {}, "
                                            "rank {}, world {}", dim0, rank, world));
  Dim0Split s;
  s.dim0 = dim0;
  s.chunk = (dim0 + world - 1) / world;
  s.offset = std::min<int64_t>(dim0, s.chunk * rank);
  s.rows = std::max<int64_t>(0, std::min<int64_t>(s.chunk, dim0 - s.chunk * rank));
  return s;
}

torch::Tensor shard_dim0(const torch::Tensor& full, int rank, int world) {
  const Dim0Split s = dim0_split(full.size(0), rank, world);
  return full.detach().narrow(0, s.offset, s.rows).clone().contiguous();
}

void all_gather_dim0(Group& g, const torch::Tensor& shard, torch::Tensor full) {
  const int n = g.size();
  const Dim0Split s = dim0_split(full.size(0), g.rank(), n);
  if (shard.dim() != full.dim() || shard.size(0) != s.rows || shard.sizes().slice(1) != full.sizes().slice(1))
    throw std::invalid_argument(fmt::format("all_gather_dim0: expected a shard of {} rows of {}, got {}", s.rows,
                                            c10::str(full.sizes()), c10::str(shard.sizes())));
  torch::NoGradGuard ng;
  auto padded = torch::zeros(with_rows(full, s.chunk), full.options().requires_grad(false));
  if (s.rows > 0) padded.narrow(0, 0, s.rows).copy_(shard);
  auto out = torch::empty(with_rows(full, n * s.chunk), padded.options());
  g.all_gather(padded, out);
  full.copy_(out.narrow(0, 0, s.dim0));
}

void reduce_scatter_dim0(Group& g, const torch::Tensor& full, torch::Tensor out, torch::ScalarType reduce_dtype,
                         double divide, bool accumulate) {
  const int n = g.size();
  const Dim0Split s = dim0_split(full.size(0), g.rank(), n);
  if (out.dim() != full.dim() || out.size(0) != s.rows || out.sizes().slice(1) != full.sizes().slice(1))
    throw std::invalid_argument(fmt::format("reduce_scatter_dim0: expected an output of {} rows of {}, got {}", s.rows,
                                            c10::str(full.sizes()), c10::str(out.sizes())));
  torch::NoGradGuard ng;
  auto opts = full.options().dtype(reduce_dtype).requires_grad(false);
  auto padded = torch::zeros(with_rows(full, n * s.chunk), opts);
  auto body = padded.narrow(0, 0, s.dim0);
  body.copy_(full);
  if (divide != 1.0) body.div_(divide);
  auto part = torch::empty(with_rows(full, s.chunk), opts);
  g.reduce_scatter(padded, part);
  auto mine = part.narrow(0, 0, s.rows);
  if (accumulate)
    out.add_(mine);
  else
    out.copy_(mine);
}

void allreduce_flat(Group& g, const std::vector<torch::Tensor>& ins, const std::vector<torch::Tensor>& outs,
                    torch::ScalarType reduce_dtype, double divide) {
  if (ins.size() != outs.size()) throw std::invalid_argument("allreduce_flat: expected as many outputs as inputs");
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> flat;
  for (const auto& t : ins) flat.push_back(t.reshape({-1}).to(reduce_dtype));
  auto buf = torch::cat(flat);
  if (divide != 1.0) buf.div_(divide);
  g.allreduce(buf);
  int64_t off = 0;
  for (std::size_t i = 0; i < ins.size(); ++i) {
    const int64_t k = ins[i].numel();
    outs[i].copy_(buf.narrow(0, off, k).view(outs[i].sizes()));
    off += k;
  }
}

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
    const auto full_w = e->gather_param(static_cast<std::size_t>(w));
    const auto full_b = b >= 0 ? e->gather_param(static_cast<std::size_t>(b)) : torch::Tensor();
    return F::linear(x, full_w, full_b);  // full_w, full_b freed on return
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
    auto wd = e->gather_param(w).requires_grad_(true);
    torch::Tensor bd;
    std::vector<torch::Tensor> inputs{wd};
    if (b >= 0) {
      bd = e->gather_param(static_cast<std::size_t>(b)).requires_grad_(true);
      inputs.push_back(bd);
    }
    if (x_grad) inputs.push_back(xd);
    auto y = F::linear(xd, wd, bd);
    auto g = torch::autograd::grad({y}, inputs, {gy[0]});
    torch::Tensor gw = e->reduce_param_grad(w, g[0]);
    torch::Tensor gb = b >= 0 ? e->reduce_param_grad(static_cast<std::size_t>(b), g[1]) : torch::Tensor();
    torch::Tensor gx = x_grad ? g.back() : torch::Tensor();
    return {gx, gw, gb, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

ShardedDataParallel::ShardedDataParallel(const torch::nn::Sequential& net, std::shared_ptr<Group> group,
                                         ShardOptions opts, const OptimizerFactory& make_optimizer)
    : group_(std::move(group)), opts_(opts) {
  if (opts_.stage < 0 || opts_.stage > 3)
    throw std::invalid_argument(fmt::format("ShardedDataParallel: expected a ZeRO stage 0..3, got {}", opts_.stage));
  const int n = group_->size(), r = group_->rank();
  auto add = [&](const torch::Tensor& t, const std::string& what) {
    torch::NoGradGuard ng;
    Param p;
    auto full = t.detach().to(torch::kFloat32).clone().contiguous();
    group_->broadcast(full, 0);  // DDP / FSDP: every rank starts from rank 0's values
    p.shape = full.sizes().vec();
    if (opts_.stage == 3 && full.size(0) < n)
      throw std::invalid_argument(fmt::format("ShardedDataParallel: stage 3 shards {} ({} rows) over {} ranks: "
                                              "expected at least one row per rank", what, full.size(0), n));
    p.split = dim0_split(full.size(0), r, n);
    numel_ += full.numel();
    padded_numel_ += n * p.split.chunk * (full.numel() / full.size(0));
    if (opts_.stage == 0) {
      if (opts_.param_dtype == torch::kFloat32) {
        p.compute = full.requires_grad_(true);
        p.master = p.compute;
        p.master_is_compute = true;
      } else {
        p.compute = full.to(opts_.param_dtype).requires_grad_(true);
        p.master = full.requires_grad_(true);
      }
    } else {
      if (opts_.stage < 3) p.compute = full.to(opts_.param_dtype).clone().requires_grad_(true);
      p.master = shard_dim0(full, r, n).requires_grad_(true);
    }
    params_.push_back(std::move(p));
    return params_.size() - 1;
  };
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
}

ShardedDataParallel::~ShardedDataParallel() = default;

torch::Tensor ShardedDataParallel::gather_param(std::size_t i) {
  Param& p = params_[i];
  auto full = torch::empty(p.shape, torch::TensorOptions().dtype(opts_.param_dtype));
  all_gather_dim0(*group_, p.master.detach(), full);
  return full;
}

torch::Tensor ShardedDataParallel::reduce_param_grad(std::size_t i, const torch::Tensor& g) {
  Param& p = params_[i];
  torch::Tensor full = g;
  if (!opts_.reduce_every_micro_batch) {
    // FSDP2 without gradient sync: accumulate the unsharded gradient locally, in the order the
    // AccumulateGrad of stages 0-2 sums it (the first copied, the next ones added).
    if (p.unsharded_grad.defined()) full = p.unsharded_grad + g;
    if (!syncing_) {
      p.unsharded_grad = p.unsharded_grad.defined() ? full : g.clone();
      return torch::Tensor();  // nothing reaches the shard yet
    }
    p.unsharded_grad = torch::Tensor();
  }
  auto out = torch::empty(with_rows(p.master, p.split.rows), torch::TensorOptions().dtype(torch::kFloat32));
  reduce_scatter_dim0(*group_, full, out, opts_.reduce_dtype, static_cast<double>(group_->size()),
                      /*accumulate=*/false);
  return out;  // AccumulateGrad adds it to the shard's .grad
}

torch::Tensor ShardedDataParallel::forward(const torch::Tensor& x) {
  torch::Tensor h = x.to(opts_.param_dtype);
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
    allreduce_flat(*group_, ins, outs, opts_.reduce_dtype, n);
    return;
  }
  for (auto& p : params_) {
    const bool have = accumulate && p.master.grad().defined();
    if (!have) p.master.mutable_grad() = torch::empty(with_rows(p.master, p.split.rows), torch::kFloat32);
    reduce_scatter_dim0(*group_, p.compute.grad(), p.master.grad(), opts_.reduce_dtype, n, /*accumulate=*/have);
    if (opts_.stage == 2) p.compute.mutable_grad() = torch::Tensor();  // only the shard is kept
  }
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
    for (auto& p : params_) {
      if (opts_.stage == 0 && !p.master_is_compute) p.compute.copy_(p.master);
      if (opts_.stage == 1 || opts_.stage == 2) all_gather_dim0(*group_, p.master.detach(), p.compute.detach());
    }
  }
  note_held();
  for (auto& p : params_) {  // zero_grad(set_to_none=True)
    if (p.compute.defined()) p.compute.mutable_grad() = torch::Tensor();
    p.master.mutable_grad() = torch::Tensor();
  }
}

std::vector<torch::Tensor> ShardedDataParallel::full_parameters() {
  std::vector<torch::Tensor> out;
  for (auto& p : params_) {
    if (opts_.stage == 0) {
      out.push_back(p.master.detach().clone());
    } else {
      auto full = torch::empty(p.shape, torch::kFloat32);
      all_gather_dim0(*group_, p.master.detach(), full);
      out.push_back(full);
    }
  }
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
