#include "core/parallel/tp.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/numerics/bounds.hpp"
#include "core/runtime/memory.hpp"

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

torch::nn::LayerNorm copy_layer_norm(const torch::nn::LayerNorm& full) {
  torch::nn::LayerNorm ln(full->options);
  torch::NoGradGuard no_grad;
  ln->weight.copy_(full->weight);
  ln->bias.copy_(full->bias);
  return ln;
}

double max_abs(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.numel() == 0) return 0.0;
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

SiteCheck bitwise_site(const std::string& site, const torch::Tensor& tp, const torch::Tensor& one) {
  SiteCheck c;
  c.site = site;
  c.max_diff = max_abs(tp, one);
  return c;
}

SiteCheck bounded_site(const std::string& site, const torch::Tensor& tp, const torch::Tensor& one,
                       const torch::Tensor& bound) {
  SiteCheck c;
  c.site = site;
  c.reduced = true;
  auto d = (tp.to(torch::kDouble) - one.to(torch::kDouble)).abs();
  c.max_diff = d.max().item<double>();
  c.max_bound = bound.max().item<double>();
  // Elements whose bound is 0 (all products exactly 0) must match exactly: ratio inf otherwise.
  auto ratio = torch::where(bound > 0, d / bound, torch::where(d > 0, torch::full_like(d, INFINITY), torch::zeros_like(d)));
  c.worst_ratio = ratio.max().item<double>();
  return c;
}

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

TpGpt::TpGpt(const TinyGpt& full, std::shared_ptr<dist::Group> group, int64_t vocab_divisible_by,
             bool sequence_parallel)
    : full_(full), cfg_(full->cfg), group_(std::move(group)), sp_(sequence_parallel) {
  t_ = group_->size();
  const int64_t r = group_->rank(), C = cfg_.width, H = cfg_.mlp_ratio * cfg_.width;
  if (cfg_.heads % t_ != 0)
    throw std::invalid_argument("TpGpt: the TP degree (" + std::to_string(t_) + ") must divide heads (" +
                                std::to_string(cfg_.heads) + ")");
  if (H % t_ != 0)
    throw std::invalid_argument("TpGpt: the TP degree (" + std::to_string(t_) + ") must divide the MLP width (" +
                                std::to_string(H) + ")");
  local_heads_ = cfg_.heads / t_;
  padded_vocab_ = padded_vocab_size(cfg_.vocab, vocab_divisible_by, t_);
  wte_ = std::make_unique<VocabParallelEmbedding>(full->wte->weight, padded_vocab_, group_);
  const auto vocab_rows = torch::arange(wte_->vocab_start, wte_->vocab_end, torch::kLong);
  params_.push_back({"wte.weight", wte_->weight, 0, vocab_rows});
  wpe_ = leaf(full->wpe->weight);
  params_.push_back({"wpe.weight", wpe_, -1, {}});
  const auto qkv = qkv_shard(C, cfg_.heads, t_, r), cshard = contiguous_shard(C, t_, r),
             hshard = contiguous_shard(H, t_, r);
  for (std::size_t i = 0; i < full->blocks.size(); ++i) {
    const auto& fb = full->blocks[i];
    const std::string p = "h" + std::to_string(i) + ".";
    Block b;
    b.ln_1 = copy_layer_norm(fb->ln_1);
    b.ln_2 = copy_layer_norm(fb->ln_2);
    b.c_attn = std::make_unique<ColumnParallelLinear>(fb->c_attn->weight, fb->c_attn->bias, qkv, group_, false, sp_);
    b.attn_proj = std::make_unique<RowParallelLinear>(fb->attn_proj->weight, fb->attn_proj->bias, cshard, group_, sp_);
    b.c_fc = std::make_unique<ColumnParallelLinear>(fb->c_fc->weight, fb->c_fc->bias, hshard, group_, false, sp_);
    b.mlp_proj = std::make_unique<RowParallelLinear>(fb->mlp_proj->weight, fb->mlp_proj->bias, hshard, group_, sp_);
    params_.push_back({p + "ln_1.weight", b.ln_1->weight, -1, {}, sp_});
    params_.push_back({p + "ln_1.bias", b.ln_1->bias, -1, {}, sp_});
    params_.push_back({p + "c_attn.weight", b.c_attn->weight, 0, qkv});
    params_.push_back({p + "c_attn.bias", b.c_attn->bias, 0, qkv});
    params_.push_back({p + "attn_proj.weight", b.attn_proj->weight, 1, cshard});
    params_.push_back({p + "attn_proj.bias", b.attn_proj->bias, -1, {}, sp_});
    params_.push_back({p + "ln_2.weight", b.ln_2->weight, -1, {}, sp_});
    params_.push_back({p + "ln_2.bias", b.ln_2->bias, -1, {}, sp_});
    params_.push_back({p + "c_fc.weight", b.c_fc->weight, 0, hshard});
    params_.push_back({p + "c_fc.bias", b.c_fc->bias, 0, hshard});
    params_.push_back({p + "mlp_proj.weight", b.mlp_proj->weight, 1, hshard});
    params_.push_back({p + "mlp_proj.bias", b.mlp_proj->bias, -1, {}, sp_});
    blocks_.push_back(std::move(b));
  }
  ln_f_ = copy_layer_norm(full->ln_f);
  params_.push_back({"ln_f.weight", ln_f_->weight, -1, {}, sp_});
  params_.push_back({"ln_f.bias", ln_f_->bias, -1, {}, sp_});
  auto lm = torch::cat({full->lm_head->weight.detach(),
                        torch::zeros({padded_vocab_ - cfg_.vocab, C}, full->lm_head->weight.options())});
  lm_head_ = std::make_unique<ColumnParallelLinear>(lm, torch::Tensor(), vocab_rows, group_, false, sp_);
  params_.push_back({"lm_head.weight", lm_head_->weight, 0, vocab_rows});
}

torch::Tensor TpGpt::block_forward(Block& b, GptBlock fb, const std::string& name,
                                   const torch::Tensor& x, std::vector<SiteCheck>* checks) {
  const int64_t B = x.size(0), Cl = cfg_.width / t_, hd = cfg_.width / cfg_.heads, nh = local_heads_;
  // Attention: this rank's heads (nanoGPT's CausalSelfAttention on heads r*a/t .. (r+1)*a/t).
  auto h = b.ln_1->forward(x);
  auto qkv = b.c_attn->forward(h);
  const int64_t T = qkv.size(1);
  auto parts = qkv.split(Cl, /*dim=*/2);
  auto q = parts[0].view({B, T, nh, hd}).transpose(1, 2);
  auto k = parts[1].view({B, T, nh, hd}).transpose(1, 2);
  auto v = parts[2].view({B, T, nh, hd}).transpose(1, 2);
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  auto mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).tril();
  att = att.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  att = torch::softmax(att, /*dim=*/-1);
  auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, Cl});
  auto o = b.attn_proj->forward(y);
  auto r = x + o;
  // MLP.
  auto m_in = b.ln_2->forward(r);
  auto m_pre = b.c_fc->forward(m_in);
  auto m_h = torch::gelu(m_pre);
  auto m = b.mlp_proj->forward(m_h);
  auto out = r + m;
  if (checks) {
    torch::NoGradGuard no_grad;
    dist::Group& g = *group_;
    auto full_in = [&](const torch::Tensor& s) { return sp_ ? gather_dim(s, g, 1) : s; };
    auto seq_local = [&](const torch::Tensor& s) { return sp_ ? split_dim(s, g, 1) : s; };
    // ln_1 (row-local) against the full module on this input: bitwise.
    checks->push_back(bitwise_site(name + "ln_1", h, fb->ln_1->forward(x)));
    // Column-parallel c_attn: the same dot products as the full GEMM's columns, but a CPU GEMM
    // may block K differently for a narrower output (seen at t = 4), so within reorder_bound.
    const auto h_full = full_in(h);
    auto column_site = [&](const std::string& site, const torch::Tensor& got, const torch::Tensor& in,
                           const torch::nn::Linear& l, const torch::Tensor& rows) {
      const auto w = l->weight.index_select(0, rows);
      const auto bias = l->bias.defined() ? l->bias.index_select(0, rows) : torch::Tensor();
      const auto want = torch::linear(in, l->weight, l->bias).index_select(in.dim() - 1, rows);
      const auto bound = reorder_bound(in.reshape({-1, in.size(-1)}), w, bias).view(want.sizes());
      checks->push_back(bounded_site(site, got, want, bound));
    };
    column_site(name + "c_attn", qkv, h_full, fb->c_attn, b.c_attn->rows);
    // Attention of this rank's heads against the full attention on the same q, k, v: the TP
    // ranks' qkv gathered back into nanoGPT's [q; k; v] layout. Per head the same bmm: bitwise.
    {
      const int64_t C = cfg_.width, a = cfg_.heads;
      auto all_rows = gather_dim(b.c_attn->rows.view({1, -1}).to(torch::kDouble), g, 1).to(torch::kLong).view({-1});
      auto gathered = gather_dim(qkv, g, 2);
      auto qkv_same = torch::zeros({B, T, 3 * C}, qkv.options()).index_copy_(2, all_rows, gathered);
      auto fp = qkv_same.split(C, 2);
      auto fq = fp[0].view({B, T, a, hd}).transpose(1, 2), fk = fp[1].view({B, T, a, hd}).transpose(1, 2),
           fv = fp[2].view({B, T, a, hd}).transpose(1, 2);
      auto fa = torch::matmul(fq, fk.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
      fa = torch::softmax(fa.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity()), -1);
      auto fy = torch::matmul(fa, fv).transpose(1, 2).contiguous().view({B, T, C});
      checks->push_back(bitwise_site(name + "attention", y, fy.index_select(2, b.attn_proj->cols)));
    }
    // The row-parallel attn c_proj: the full GEMM on the gathered heads, within reorder_bound.
    const auto y_full = gather_dim(y, g, 2);
    const auto o_full = torch::linear(y_full, fb->attn_proj->weight, fb->attn_proj->bias);
    const auto o_bound = reorder_bound(y_full.reshape({-1, y_full.size(2)}), fb->attn_proj->weight,
                                       fb->attn_proj->bias).view(o_full.sizes());
    checks->push_back(bounded_site(name + "attn_proj", o, seq_local(o_full), seq_local(o_bound)));
    checks->push_back(bitwise_site(name + "ln_2", m_in, fb->ln_2->forward(r)));
    column_site(name + "c_fc", m_pre, full_in(m_in), fb->c_fc, b.c_fc->rows);
    const auto h_all = gather_dim(m_h, g, 2);
    const auto p_full = torch::linear(h_all, fb->mlp_proj->weight, fb->mlp_proj->bias);
    const auto p_bound = reorder_bound(h_all.reshape({-1, h_all.size(2)}), fb->mlp_proj->weight, fb->mlp_proj->bias)
                             .view(p_full.sizes());
    checks->push_back(bounded_site(name + "mlp_proj", m, seq_local(p_full), seq_local(p_bound)));
  }
  return out;
}

torch::Tensor TpGpt::forward_loss(const torch::Tensor& idx, const torch::Tensor& targets,
                                  std::vector<int64_t>* block_bytes, std::vector<SiteCheck>* checks) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= cfg_.context, "TpGpt: sequence of ", T, " tokens is longer than the context (", cfg_.context, ")");
  if (sp_ && T % t_ != 0)
    throw std::invalid_argument("TpGpt: with sequence parallelism the TP degree (" + std::to_string(t_) +
                                ") must divide the sequence length (" + std::to_string(T) + ")");
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  auto tok = wte_->forward(idx);
  if (checks) {
    torch::NoGradGuard no_grad;
    checks->push_back(bitwise_site("wte (vocab-parallel)", tok, full_->wte->forward(idx)));
  }
  auto x = tok + torch::embedding(wpe_, pos);
  if (sp_) x = scatter_to_sequence_parallel_region(x, *group_, 1);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const int64_t before = block_bytes ? current_bytes(torch::kCPU) : 0;
    x = block_forward(blocks_[i], full_->blocks[i], "h" + std::to_string(i) + ".", x, checks);
    if (block_bytes) block_bytes->push_back(current_bytes(torch::kCPU) - before);
  }
  auto xf = ln_f_->forward(x);
  auto logits = lm_head_->forward(xf);  // [B, T, V'/t]
  const int64_t vl = logits.size(2);
  auto flat_t = targets.reshape({-1});
  auto per_token = vocab_parallel_cross_entropy(logits.reshape({-1, vl}), flat_t, wte_->vocab_start, cfg_.vocab,
                                                *group_);
  if (checks) {
    torch::NoGradGuard no_grad;
    auto xfull = sp_ ? gather_dim(xf, *group_, 1) : xf;
    auto full_logits = torch::linear(xfull, full_->lm_head->weight).reshape({-1, cfg_.vocab});
    // lm_head: this rank's columns of the full logits (padded columns have no full counterpart).
    // (within reorder_bound: a column-parallel GEMM, see c_attn).
    const int64_t real = std::max<int64_t>(0, std::min(vl, cfg_.vocab - wte_->vocab_start));
    if (real > 0) {
      const auto x2 = xfull.reshape({-1, cfg_.width});
      const auto w = full_->lm_head->weight.narrow(0, wte_->vocab_start, real);
      checks->push_back(bounded_site("lm_head (vocab-parallel)", logits.reshape({-1, vl}).narrow(1, 0, real),
                                     full_logits.narrow(1, wte_->vocab_start, real),
                                     reorder_bound(x2, w, torch::Tensor())));
    } else {  // this rank holds only padding: nothing to compare, but one row per site on every rank
      SiteCheck none;
      none.site = "lm_head (vocab-parallel)";
      none.reduced = true;
      checks->push_back(none);
    }
    auto one = torch::nn::functional::cross_entropy(
        full_logits, flat_t, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    checks->push_back(
        bounded_site("cross_entropy (vocab-parallel)", per_token, one, ce_reorder_bound(full_logits, flat_t)));
  }
  return per_token.mean();
}

torch::Tensor TpGpt::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  return forward_loss(idx, targets, nullptr, nullptr);
}
torch::Tensor TpGpt::loss_measuring(const torch::Tensor& idx, const torch::Tensor& targets,
                                    std::vector<int64_t>& block_bytes) {
  return forward_loss(idx, targets, &block_bytes, nullptr);
}
torch::Tensor TpGpt::loss_checked(const torch::Tensor& idx, const torch::Tensor& targets,
                                  std::vector<SiteCheck>& checks) {
  return forward_loss(idx, targets, nullptr, &checks);
}

void TpGpt::allreduce_sequence_parallel_grads() const {
  if (!sp_) return;
  for (const auto& p : params_)
    if (p.sequence_parallel && p.local.grad().defined()) {
      auto g = p.local.grad().contiguous();
      group_->allreduce(g);
      p.local.mutable_grad() = g;
    }
}

torch::Tensor TpGpt::embed(const torch::Tensor& idx) {
  if (sp_) throw std::logic_error("TpGpt::embed: the pipeline pieces run without sequence parallelism");
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= cfg_.context, "TpGpt: sequence of ", T, " tokens is longer than the context (", cfg_.context, ")");
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  return wte_->forward(idx) + torch::embedding(wpe_, pos);  // as forward_loss
}

torch::Tensor TpGpt::blocks(const torch::Tensor& x, int64_t begin, int64_t end) {
  if (begin < 0 || end < begin || end > static_cast<int64_t>(blocks_.size()))
    throw std::out_of_range("TpGpt::blocks: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") outside the " + std::to_string(blocks_.size()) + " blocks");
  auto h = x;
  for (int64_t i = begin; i < end; ++i)
    h = block_forward(blocks_[static_cast<std::size_t>(i)], full_->blocks[static_cast<std::size_t>(i)],
                      "h" + std::to_string(i) + ".", h, nullptr);
  return h;
}

torch::Tensor TpGpt::logits(const torch::Tensor& x) { return lm_head_->forward(ln_f_->forward(x)); }

torch::Tensor TpGpt::loss_of_logits(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t vl = logits.size(-1);
  return vocab_parallel_cross_entropy(logits.reshape({-1, vl}), targets.reshape({-1}), wte_->vocab_start, cfg_.vocab,
                                      *group_)
      .mean();
}

// ----------------------------------------------------------------------------
// The DP x TP x PP mesh
// ----------------------------------------------------------------------------

MeshLayout::MeshLayout(int dp_, int tp_, int pp_) : dp(dp_), tp(tp_), pp(pp_) {
  if (dp < 1 || tp < 1 || pp < 1)
    throw std::invalid_argument("MeshLayout: degrees must be >= 1, got dp = " + std::to_string(dp) + ", tp = " +
                                std::to_string(tp) + ", pp = " + std::to_string(pp));
}

int MeshLayout::rank_of(int pp_idx, int dp_idx, int tp_idx) const {
  if (pp_idx < 0 || pp_idx >= pp || dp_idx < 0 || dp_idx >= dp || tp_idx < 0 || tp_idx >= tp)
    throw std::out_of_range("MeshLayout::rank_of: (" + std::to_string(pp_idx) + ", " + std::to_string(dp_idx) + ", " +
                            std::to_string(tp_idx) + ") outside the mesh");
  return (pp_idx * dp + dp_idx) * tp + tp_idx;
}

MeshLayout::Coord MeshLayout::coord(int rank) const {
  if (rank < 0 || rank >= size())
    throw std::out_of_range("MeshLayout::coord: rank " + std::to_string(rank) + " outside the mesh of " +
                            std::to_string(size()));
  return {rank / (dp * tp), (rank / tp) % dp, rank % tp};
}

std::vector<int> MeshLayout::tp_group(int pp_idx, int dp_idx) const {
  std::vector<int> v;
  for (int i = 0; i < tp; ++i) v.push_back(rank_of(pp_idx, dp_idx, i));
  return v;
}
std::vector<int> MeshLayout::dp_group(int pp_idx, int tp_idx) const {
  std::vector<int> v;
  for (int d = 0; d < dp; ++d) v.push_back(rank_of(pp_idx, d, tp_idx));
  return v;
}
std::vector<int> MeshLayout::pp_group(int dp_idx, int tp_idx) const {
  std::vector<int> v;
  for (int s = 0; s < pp; ++s) v.push_back(rank_of(s, dp_idx, tp_idx));
  return v;
}

TpGptStages::TpGptStages(TpGpt& model, int stages) : model_(&model), stages_(stages) {
  const int64_t layers = model.layers();
  if (stages < 1 || layers % stages != 0)
    throw std::invalid_argument("TpGptStages: " + std::to_string(stages) + " stages must divide the " +
                                std::to_string(layers) + " blocks");
  per_ = layers / stages;
  for (const auto& p : model.params()) {
    int c = 0;
    if (p.name.rfind("h", 0) == 0)
      c = static_cast<int>(std::stoll(p.name.substr(1, p.name.find('.') - 1)) / per_);
    else if (p.name.rfind("ln_f.", 0) == 0 || p.name.rfind("lm_head.", 0) == 0)
      c = stages - 1;
    chunk_of_.push_back(c);
  }
}

torch::Tensor TpGptStages::forward(int chunk, const torch::Tensor& x, ChunkSaved* /*saved*/) const {
  if (chunk < 0 || chunk >= stages_) throw std::out_of_range("TpGptStages::forward: chunk " + std::to_string(chunk));
  auto h = chunk == 0 ? model_->embed(x) : x;
  h = model_->blocks(h, chunk * per_, (chunk + 1) * per_);
  return chunk == stages_ - 1 ? model_->logits(h) : h;
}

std::vector<torch::Tensor> TpGptStages::parameters(int chunk) const {
  std::vector<torch::Tensor> v;
  const auto& ps = model_->params();
  for (std::size_t i = 0; i < ps.size(); ++i)
    if (chunk_of_[i] == chunk) v.push_back(ps[i].local);
  return v;
}

torch::Tensor TpGptStages::loss(const torch::Tensor& y, const torch::Tensor& target) const {
  return model_->loss_of_logits(y, target);
}

std::vector<int64_t> TpGptStages::output_shape(int /*chunk*/, const std::vector<int64_t>& microbatch_shape) const {
  return {microbatch_shape.at(0), microbatch_shape.at(1), model_->width()};
}

// ----------------------------------------------------------------------------
// Bounds
// ----------------------------------------------------------------------------

torch::Tensor reorder_bound(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b) {
  const int64_t k = x.size(-1);
  auto s = torch::matmul(x.detach().to(torch::kDouble).abs(), a.detach().to(torch::kDouble).abs().t());
  if (b.defined()) s = s + b.detach().to(torch::kDouble).abs();
  return 2.0 * bounds::gamma(k + (b.defined() ? 1 : 0)) * s;
}

torch::Tensor sum_reorder_bound(const torch::Tensor& x, int64_t dim) {
  return 2.0 * bounds::gamma(std::max<int64_t>(x.size(dim) - 1, 1)) * x.detach().to(torch::kDouble).abs().sum(dim);
}

torch::Tensor ce_reorder_bound(const torch::Tensor& logits, const torch::Tensor& targets) {
  const double u = bounds::kFp32UnitRoundoff;
  const int64_t v = logits.size(1);
  const double g = bounds::gamma(std::max<int64_t>(v - 1, 1)), delta = g + 2 * u * (1 + g);
  auto l = logits.detach().to(torch::kDouble);
  auto m = std::get<0>(l.max(1));
  auto log_s = (l - m.unsqueeze(1)).exp().sum(1).log();
  auto ly = l.gather(1, targets.view({-1, 1})).squeeze(1) - m;
  return 2.0 * (-std::log1p(-delta) + 2 * u * (log_s.abs() + ly.abs()));
}

// ----------------------------------------------------------------------------
// Activation memory
// ----------------------------------------------------------------------------

double korthikanti_bytes(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t, bool sp) {
  const double sbh = static_cast<double>(s) * b * h, as_h = static_cast<double>(a) * s / h, td = static_cast<double>(t);
  if (sp) return sbh / td * (34 + 5 * as_h);
  return sbh * (10 + 24 / td + 5 * as_h / td);
}

double fp32_activation_bytes(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t, bool sp) {
  const double sbh = static_cast<double>(s) * b * h, as_h = static_cast<double>(a) * s / h, td = static_cast<double>(t);
  if (sp) return sbh * (8 / td + 8 + 48 / td + 4 * as_h / td);
  return sbh * (16 + 48 / td + 4 * as_h / td);
}

}  // namespace mpt::tp
