// core/parallel/tp: Megatron-LM's tensor-parallel operators (f, g, the sequence-parallel
// mappings) as autograd functions, shard index sets and the parallel layers. See tp.hpp.
#include "core/parallel/tp.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>


namespace mpt::tp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through the autograd context as its address: the caller keeps it alive for
// as long as the graph (TpGpt and TpMlp hold a shared_ptr).
int64_t addr(dist::Group& g) { return static_cast<int64_t>(reinterpret_cast<std::intptr_t>(&g)); }
dist::Group& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<dist::Group*>(static_cast<std::intptr_t>(ctx->saved_data["g"].toInt()));
}

torch::Tensor all_reduce_copy(const torch::Tensor& x, dist::Group& g, dist::ReduceOp op = dist::ReduceOp::Sum) {
  auto y = x.contiguous().clone();
  g.allreduce(y, op);
  return y;
}

// All-gather / reduce-scatter / split along `dim`, through dim 0 (what dist::Group offers).
torch::Tensor gather_dim(const torch::Tensor& x, dist::Group& g, int64_t dim) {
  auto in = x.movedim(dim, 0).contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] *= g.size();
  auto out = torch::empty(sizes, in.options());
  g.all_gather(in, out);
  return out.movedim(0, dim).contiguous();
}

void check_divides(const torch::Tensor& x, dist::Group& g, int64_t dim, const char* what) {
  if (x.size(dim) % g.size() != 0)
    throw std::invalid_argument(std::string(what) + ": the group size (" + std::to_string(g.size()) +
                                ") must divide dim " + std::to_string(dim) + " (" + std::to_string(x.size(dim)) + ")");
}

torch::Tensor reduce_scatter_dim(const torch::Tensor& x, dist::Group& g, int64_t dim) {
  check_divides(x, g, dim, "reduce_scatter_to_sequence_parallel_region");
  auto in = x.movedim(dim, 0).contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] /= g.size();
  auto out = torch::empty(sizes, in.options());
  g.reduce_scatter(in, out);
  return out.movedim(0, dim).contiguous();
}

torch::Tensor split_dim(const torch::Tensor& x, dist::Group& g, int64_t dim) {
  check_divides(x, g, dim, "scatter_to_sequence_parallel_region");
  return x.chunk(g.size(), dim)[static_cast<std::size_t>(g.rank())].contiguous();
}

struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t g) {
    ctx->saved_data["g"] = g;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_reduce_copy(grad[0], group_of(ctx)), torch::Tensor()};
  }
};

struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t g) {
    ctx->saved_data["g"] = g;
    return all_reduce_copy(x, group_of(ctx));
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], torch::Tensor()}; }
};

struct GatherFromTp : torch::autograd::Function<GatherFromTp> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t g) {
    ctx->saved_data["g"] = g;
    return gather_dim(x, group_of(ctx), x.dim() - 1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {split_dim(grad[0], group_of(ctx), grad[0].dim() - 1), torch::Tensor()};
  }
};

// The sequence-parallel mappings along `dim`: a dimension-wise collective Forward and its
// conjugate Backward (Megatron's mappings.py: scatter ↔ gather, gather ↔ reduce-scatter,
// reduce-scatter ↔ gather).
using DimCollective = torch::Tensor (*)(const torch::Tensor&, dist::Group&, int64_t);
template <DimCollective Forward, DimCollective Backward>
struct SpMapping : torch::autograd::Function<SpMapping<Forward, Backward>> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t g, int64_t dim) {
    ctx->saved_data["g"] = g;
    ctx->saved_data["dim"] = dim;
    return Forward(x, group_of(ctx), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {Backward(grad[0], group_of(ctx), ctx->saved_data["dim"].toInt()), torch::Tensor(), torch::Tensor()};
  }
};
using ScatterToSp = SpMapping<split_dim, gather_dim>;
using GatherFromSp = SpMapping<gather_dim, reduce_scatter_dim>;
using ReduceScatterToSp = SpMapping<reduce_scatter_dim, gather_dim>;

// Megatron's _VocabParallelCrossEntropy (megatron/core/tensor_parallel/cross_entropy.py).
struct VocabParallelCE : torch::autograd::Function<VocabParallelCE> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits_in, const torch::Tensor& targets,
                               int64_t vocab_start, int64_t vocab, int64_t g) {
    ctx->saved_data["g"] = g;
    dist::Group& grp = group_of(ctx);
    const int64_t n = logits_in.size(0), vl = logits_in.size(1);
    auto logits = logits_in.to(torch::kFloat).clone();
    if (vocab_start + vl > vocab)  // padded columns: exp(-inf) = 0 in S, never the max
      logits.narrow(1, std::max<int64_t>(vocab - vocab_start, 0), vocab_start + vl - std::max(vocab, vocab_start))
          .fill_(-std::numeric_limits<float>::infinity());
    auto logits_max = std::get<0>(logits.max(/*dim=*/1));
    grp.allreduce(logits_max, dist::ReduceOp::Max);
    logits.sub_(logits_max.unsqueeze(1));
    auto mask = (targets < vocab_start).logical_or(targets >= vocab_start + vl);
    auto masked_target = (targets - vocab_start).masked_fill(mask, 0);
    auto arange = torch::arange(n, targets.options());
    auto predicted = logits.index({arange, masked_target}).masked_fill(mask, 0.0).contiguous();
    grp.allreduce(predicted);
    auto exp_logits = logits.exp();
    auto sum_exp = exp_logits.sum(/*dim=*/1).contiguous();
    grp.allreduce(sum_exp);
    auto loss = sum_exp.log() - predicted;
    exp_logits.div_(sum_exp.unsqueeze(1));  // softmax
    ctx->save_for_backward({exp_logits, mask, masked_target});
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto saved = ctx->get_saved_variables();
    auto grad_input = saved[0].clone();
    const auto& mask = saved[1];
    auto arange = torch::arange(grad_input.size(0), saved[2].options());
    auto update = 1.0 - mask.to(torch::kFloat);
    grad_input.index_put_({arange, saved[2]}, grad_input.index({arange, saved[2]}) - update);
    grad_input.mul_(grad[0].unsqueeze(1));
    return {grad_input, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor leaf(const torch::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

}  // namespace

// ----------------------------------------------------------------------------
// Conjugate operators
// ----------------------------------------------------------------------------

torch::Tensor copy_to_tensor_model_parallel_region(const torch::Tensor& x, dist::Group& g) {
  return CopyToTp::apply(x, addr(g));
}
torch::Tensor reduce_from_tensor_model_parallel_region(const torch::Tensor& x, dist::Group& g) {
  return ReduceFromTp::apply(x, addr(g));
}
torch::Tensor gather_from_tensor_model_parallel_region(const torch::Tensor& x, dist::Group& g) {
  return GatherFromTp::apply(x, addr(g));
}
torch::Tensor scatter_to_sequence_parallel_region(const torch::Tensor& x, dist::Group& g, int64_t dim) {
  return ScatterToSp::apply(x, addr(g), dim);
}
torch::Tensor gather_from_sequence_parallel_region(const torch::Tensor& x, dist::Group& g, int64_t dim) {
  return GatherFromSp::apply(x, addr(g), dim);
}
torch::Tensor reduce_scatter_to_sequence_parallel_region(const torch::Tensor& x, dist::Group& g, int64_t dim) {
  return ReduceScatterToSp::apply(x, addr(g), dim);
}

// ----------------------------------------------------------------------------
// Shards
// ----------------------------------------------------------------------------

torch::Tensor contiguous_shard(int64_t n, int64_t t, int64_t r) {
  if (t < 1 || n % t != 0 || r < 0 || r >= t)
    throw std::invalid_argument("contiguous_shard: " + std::to_string(t) + " ranks must divide " + std::to_string(n) +
                                " rows (rank " + std::to_string(r) + ")");
  const int64_t k = n / t;
  return torch::arange(r * k, (r + 1) * k, torch::kLong);
}

torch::Tensor qkv_shard(int64_t width, int64_t heads, int64_t t, int64_t r) {
  if (heads < 1 || width % heads != 0)
    throw std::invalid_argument("qkv_shard: heads (" + std::to_string(heads) + ") must divide width (" +
                                std::to_string(width) + ")");
  if (heads % t != 0)
    throw std::invalid_argument("qkv_shard: the TP degree (" + std::to_string(t) + ") must divide heads (" +
                                std::to_string(heads) + ")");
  const auto own = contiguous_shard(width, t, r);  // heads r*a/t .. of width/heads columns each
  return torch::cat({own, own + width, own + 2 * width});
}

int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by, int64_t t) {
  const int64_t m = divisible_by * t;
  return (vocab + m - 1) / m * m;
}

std::vector<torch::Tensor> all_gather_shards(const torch::Tensor& local, dist::Group& g) {
  auto flat = local.detach().contiguous().reshape({-1});
  auto out = torch::empty({g.size() * flat.numel()}, flat.options());
  g.all_gather(flat, out);
  std::vector<torch::Tensor> v;
  for (auto& c : out.chunk(g.size())) v.push_back(c.reshape(local.sizes()));
  return v;
}

torch::Tensor unshard(const std::vector<torch::Tensor>& shards, const std::vector<torch::Tensor>& index, int dim,
                      int64_t full_size) {
  if (dim < 0) return shards.at(0);
  int64_t total = 0;
  for (const auto& s : shards) total += s.size(dim);
  auto sizes = shards.at(0).sizes().vec();
  sizes[static_cast<std::size_t>(dim)] = total;
  auto out = torch::zeros(sizes, shards[0].options());
  for (std::size_t r = 0; r < shards.size(); ++r) out.index_copy_(dim, index.at(r), shards[r]);
  return out.narrow(dim, 0, full_size);
}

// ----------------------------------------------------------------------------
// Layers
// ----------------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(const torch::Tensor& full_weight, const torch::Tensor& full_bias,
                                           torch::Tensor rows_, std::shared_ptr<dist::Group> group_, bool gather,
                                           bool sp)
    : rows(std::move(rows_)), group(std::move(group_)), gather_output(gather), sequence_parallel(sp) {
  weight = leaf(full_weight.index_select(0, rows));
  if (full_bias.defined()) bias = leaf(full_bias.index_select(0, rows));
}

torch::Tensor ColumnParallelLinear::forward(const torch::Tensor& x, torch::Tensor* pre) const {
  auto in = sequence_parallel ? gather_from_sequence_parallel_region(x, *group, 1)
                              : copy_to_tensor_model_parallel_region(x, *group);
  auto y = torch::linear(in, weight, bias);
  if (pre) *pre = y;
  return gather_output ? gather_from_tensor_model_parallel_region(y, *group) : y;
}

RowParallelLinear::RowParallelLinear(const torch::Tensor& full_weight, const torch::Tensor& full_bias,
                                     torch::Tensor cols_, std::shared_ptr<dist::Group> group_, bool sp)
    : cols(std::move(cols_)), group(std::move(group_)), sequence_parallel(sp) {
  weight = leaf(full_weight.index_select(1, cols));
  if (full_bias.defined()) bias = leaf(full_bias);
}

torch::Tensor RowParallelLinear::forward(const torch::Tensor& x) const {
  auto partial = torch::linear(x, weight);
  auto y = sequence_parallel ? reduce_scatter_to_sequence_parallel_region(partial, *group, 1)
                             : reduce_from_tensor_model_parallel_region(partial, *group);
  return bias.defined() ? y + bias : y;
}

VocabParallelEmbedding::VocabParallelEmbedding(const torch::Tensor& full_weight, int64_t padded_vocab,
                                               std::shared_ptr<dist::Group> group_)
    : group(std::move(group_)) {
  const int64_t v = full_weight.size(0), t = group->size();
  if (padded_vocab < v || padded_vocab % t != 0)
    throw std::invalid_argument("VocabParallelEmbedding: padded vocabulary " + std::to_string(padded_vocab) +
                                " must be >= " + std::to_string(v) + " and a multiple of " + std::to_string(t));
  const int64_t per = padded_vocab / t;
  vocab_start = group->rank() * per;
  vocab_end = vocab_start + per;
  auto padded = torch::cat({full_weight.detach(), torch::zeros({padded_vocab - v, full_weight.size(1)},
                                                               full_weight.options().requires_grad(false))});
  weight = leaf(padded.narrow(0, vocab_start, per));
}

torch::Tensor VocabParallelEmbedding::forward(const torch::Tensor& ids) const {
  auto mask = (ids < vocab_start).logical_or(ids >= vocab_end);
  auto local = (ids - vocab_start).masked_fill(mask, 0);
  auto out = torch::embedding(weight, local).masked_fill(mask.unsqueeze(-1), 0.0);
  return reduce_from_tensor_model_parallel_region(out, *group);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           int64_t vocab_start, int64_t vocab, dist::Group& g) {
  if (logits.dim() != 2 || targets.dim() != 1 || logits.size(0) != targets.size(0))
    throw std::invalid_argument("vocab_parallel_cross_entropy: expected logits [N, V/t] and targets [N]");
  return VocabParallelCE::apply(logits, targets, vocab_start, vocab, addr(g));
}

// ----------------------------------------------------------------------------
// Models
// ----------------------------------------------------------------------------

TpMlp::TpMlp(const torch::nn::Linear& l1, const torch::nn::Linear& l2, std::shared_ptr<dist::Group> group)
    : fc1(l1->weight, l1->bias, contiguous_shard(l1->weight.size(0), group->size(), group->rank()), group),
      fc2(l2->weight, l2->bias, contiguous_shard(l2->weight.size(1), group->size(), group->rank()), group) {}

torch::Tensor TpMlp::forward(const torch::Tensor& x, torch::Tensor* pre) const {
  return fc2.forward(torch::gelu(fc1.forward(x, pre)));
}

}  // namespace mpt::tp
