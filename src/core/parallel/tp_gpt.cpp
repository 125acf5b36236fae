// core/parallel/tp_gpt: the tiny GPT on a tensor-parallel group — the GptBlock of core/models/gpt
// run with column/row-parallel Linears — its per-operation checks, and its pipeline stages. See tp_gpt.hpp.
#include "core/parallel/tp_gpt.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/runtime/memory.hpp"
#include "core/runtime/runtime.hpp"

namespace mpt::tp {

namespace {

// A GptBlock holding `full`'s LayerNorm weights as new leaves. Building it initialises its own
// Linears from the default generator, whose state is put back afterwards, so that a TP model
// built in the middle of a run changes no later random draw (the Linears are never used: the
// block runs with the parallel ones, through GptLinear).
GptBlock block_with_layer_norms_of(const GptConfig& cfg, const GptBlock& full) {
  const auto gen = at::detail::getDefaultCPUGenerator();
  const auto state = generator_state(gen);
  GptBlock b(cfg);
  set_generator_state(gen, state);
  torch::NoGradGuard no_grad;
  b->ln_1->weight.copy_(full->ln_1->weight);
  b->ln_1->bias.copy_(full->ln_1->bias);
  b->ln_2->weight.copy_(full->ln_2->weight);
  b->ln_2->bias.copy_(full->ln_2->bias);
  return b;
}

torch::nn::LayerNorm copy_layer_norm(const torch::nn::LayerNorm& full) {
  torch::nn::LayerNorm ln(full->options);
  torch::NoGradGuard no_grad;
  ln->weight.copy_(full->weight);
  ln->bias.copy_(full->bias);
  return ln;
}

double site_max_abs(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.numel() == 0) return 0.0;
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

SiteCheck bitwise_site(const std::string& site, const torch::Tensor& tp, const torch::Tensor& one) {
  SiteCheck c;
  c.site = site;
  c.max_diff = site_max_abs(tp, one);
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
  wpe_ = full->wpe->weight.detach().clone().set_requires_grad(true);
  params_.push_back({"wpe.weight", wpe_, -1, {}});
  const auto qkv = qkv_shard(C, cfg_.heads, t_, r), cshard = contiguous_shard(C, t_, r),
             hshard = contiguous_shard(H, t_, r);
  for (std::size_t i = 0; i < full->blocks.size(); ++i) {
    const auto& fb = full->blocks[i];
    const std::string p = "h" + std::to_string(i) + ".";
    Block b;
    b.module = block_with_layer_norms_of(cfg_, fb);
    b.c_attn = std::make_unique<ColumnParallelLinear>(fb->c_attn->weight, fb->c_attn->bias, qkv, group_, false, sp_);
    b.attn_proj = std::make_unique<RowParallelLinear>(fb->attn_proj->weight, fb->attn_proj->bias, cshard, group_, sp_);
    b.c_fc = std::make_unique<ColumnParallelLinear>(fb->c_fc->weight, fb->c_fc->bias, hshard, group_, false, sp_);
    b.mlp_proj = std::make_unique<RowParallelLinear>(fb->mlp_proj->weight, fb->mlp_proj->bias, hshard, group_, sp_);
    params_.push_back({p + "ln_1.weight", b.module->ln_1->weight, -1, {}, sp_});
    params_.push_back({p + "ln_1.bias", b.module->ln_1->bias, -1, {}, sp_});
    params_.push_back({p + "c_attn.weight", b.c_attn->weight, 0, qkv});
    params_.push_back({p + "c_attn.bias", b.c_attn->bias, 0, qkv});
    params_.push_back({p + "attn_proj.weight", b.attn_proj->weight, 1, cshard});
    params_.push_back({p + "attn_proj.bias", b.attn_proj->bias, -1, {}, sp_});
    params_.push_back({p + "ln_2.weight", b.module->ln_2->weight, -1, {}, sp_});
    params_.push_back({p + "ln_2.bias", b.module->ln_2->bias, -1, {}, sp_});
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

torch::Tensor TpGpt::block_forward(std::size_t i, const torch::Tensor& x, BlockTrace* trace) {
  Block& b = blocks_[i];
  // The block's four Linears, by name, replaced by the parallel ones (the full weight and bias
  // passed in are not used); with a trace, each one's input and output are kept for check_block.
  const GptLinear parallel = [&b, trace](const torch::Tensor& in, const torch::Tensor&, const torch::Tensor&,
                                         const std::string& name) {
    const std::string site = name.substr(name.rfind('.') + 1);
    torch::Tensor out, *keep_in = nullptr, *keep_out = nullptr;
    if (site == "c_attn") {
      out = b.c_attn->forward(in);
      if (trace) keep_in = &trace->h, keep_out = &trace->qkv;
    } else if (site == "attn_proj") {
      out = b.attn_proj->forward(in);
      if (trace) keep_in = &trace->y, keep_out = &trace->o;
    } else if (site == "c_fc") {
      out = b.c_fc->forward(in);
      if (trace) keep_in = &trace->m_in, keep_out = &trace->m_pre;
    } else if (site == "mlp_proj") {
      out = b.mlp_proj->forward(in);
      if (trace) keep_in = &trace->m_h, keep_out = &trace->m;
    } else {
      throw std::logic_error("TpGpt: no parallel Linear for " + name);
    }
    if (keep_in) *keep_in = in, *keep_out = out;
    return out;
  };
  // With a trace, the hook keeps the first residual sum (ln_2's input); it changes nothing.
  GptHook keep_residual;
  if (trace) {
    trace->x = x;
    keep_residual = [trace](const torch::Tensor& t, const std::string& site) {
      if (site == "residual" && !trace->r.defined()) trace->r = t;
      return t;
    };
  }
  return b.module->forward(x, keep_residual, parallel, "h" + std::to_string(i) + ".", cp_attention_);
}

void TpGpt::set_context_parallel(GptAttention attention, torch::Tensor positions) {
  if (!attention || !positions.defined() || positions.dim() != 1)
    throw std::invalid_argument("TpGpt::set_context_parallel: expected an attention and positions [T/c]");
  cp_attention_ = std::move(attention);
  cp_positions_ = std::move(positions);
}

// Every operation of block i against the full block it was sliced from, fed the same
// (all-gathered) input: LayerNorms and attention bitwise, the GEMMs within reorder_bound.
void TpGpt::check_block(std::size_t i, const BlockTrace& tr, std::vector<SiteCheck>& checks) {
  const Block& b = blocks_[i];
  GptBlock fb = full_->blocks[i];
  const std::string name = "h" + std::to_string(i) + ".";
  const int64_t B = tr.x.size(0), T = tr.qkv.size(1), hd = cfg_.width / cfg_.heads;
  const auto mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(tr.x.device())).tril();
  torch::NoGradGuard no_grad;
  dist::Group& g = *group_;
  auto full_in = [&](const torch::Tensor& s) { return sp_ ? gather_from_sequence_parallel_region(s, g, 1) : s; };
  auto seq_local = [&](const torch::Tensor& s) { return sp_ ? scatter_to_sequence_parallel_region(s, g, 1) : s; };
  // ln_1 (row-local) against the full module on this input: bitwise.
  checks.push_back(bitwise_site(name + "ln_1", tr.h, fb->ln_1->forward(tr.x)));
  // Column-parallel c_attn: the same dot products as the full GEMM's columns, but a CPU GEMM
  // may block K differently for a narrower output (seen at t = 4), so within reorder_bound.
  const auto h_full = full_in(tr.h);
  auto column_site = [&](const std::string& site, const torch::Tensor& got, const torch::Tensor& in,
                         const torch::nn::Linear& l, const torch::Tensor& rows) {
    const auto w = l->weight.index_select(0, rows);
    const auto bias = l->bias.defined() ? l->bias.index_select(0, rows) : torch::Tensor();
    const auto want = torch::linear(in, l->weight, l->bias).index_select(in.dim() - 1, rows);
    const auto bound = reorder_bound(in.reshape({-1, in.size(-1)}), w, bias).view(want.sizes());
    checks.push_back(bounded_site(site, got, want, bound));
  };
  column_site(name + "c_attn", tr.qkv, h_full, fb->c_attn, b.c_attn->rows);
  // Attention of this rank's heads against the full attention on the same q, k, v: the TP
  // ranks' qkv gathered back into nanoGPT's [q; k; v] layout. Per head the same bmm: bitwise.
  {
    const int64_t C = cfg_.width, a = cfg_.heads;
    auto all_rows = gather_from_sequence_parallel_region(b.c_attn->rows.view({1, -1}).to(torch::kDouble), g, 1)
                        .to(torch::kLong)
                        .view({-1});
    auto gathered = gather_from_sequence_parallel_region(tr.qkv, g, 2);
    auto qkv_same = torch::zeros({B, T, 3 * C}, tr.qkv.options()).index_copy_(2, all_rows, gathered);
    auto fp = qkv_same.split(C, 2);
    auto fq = fp[0].view({B, T, a, hd}).transpose(1, 2), fk = fp[1].view({B, T, a, hd}).transpose(1, 2),
         fv = fp[2].view({B, T, a, hd}).transpose(1, 2);
    auto fa = torch::matmul(fq, fk.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    fa = torch::softmax(fa.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity()), -1);
    auto fy = torch::matmul(fa, fv).transpose(1, 2).contiguous().view({B, T, C});
    checks.push_back(bitwise_site(name + "attention", tr.y, fy.index_select(2, b.attn_proj->cols)));
  }
  // The row-parallel attn c_proj: the full GEMM on the gathered heads, within reorder_bound.
  const auto y_full = gather_from_sequence_parallel_region(tr.y, g, 2);
  const auto o_full = torch::linear(y_full, fb->attn_proj->weight, fb->attn_proj->bias);
  const auto o_bound = reorder_bound(y_full.reshape({-1, y_full.size(2)}), fb->attn_proj->weight,
                                     fb->attn_proj->bias).view(o_full.sizes());
  checks.push_back(bounded_site(name + "attn_proj", tr.o, seq_local(o_full), seq_local(o_bound)));
  checks.push_back(bitwise_site(name + "ln_2", tr.m_in, fb->ln_2->forward(tr.r)));
  column_site(name + "c_fc", tr.m_pre, full_in(tr.m_in), fb->c_fc, b.c_fc->rows);
  const auto h_all = gather_from_sequence_parallel_region(tr.m_h, g, 2);
  const auto p_full = torch::linear(h_all, fb->mlp_proj->weight, fb->mlp_proj->bias);
  const auto p_bound = reorder_bound(h_all.reshape({-1, h_all.size(2)}), fb->mlp_proj->weight, fb->mlp_proj->bias)
                           .view(p_full.sizes());
  checks.push_back(bounded_site(name + "mlp_proj", tr.m, seq_local(p_full), seq_local(p_bound)));
}

torch::Tensor TpGpt::forward_loss(const torch::Tensor& idx, const torch::Tensor& targets,
                                  std::vector<int64_t>* block_bytes, std::vector<SiteCheck>* checks) {
  if (cp_attention_) throw std::logic_error("TpGpt::loss: context parallelism runs the pipeline pieces only");
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
  // Live bytes around a block once Gloo's worker has dropped the block's collective temporaries
  // (dist::settle: it drops a collective's tensors only when it takes the next), so that the
  // difference is the storage the block's graph keeps, on every run alike
  torch::Tensor token = block_bytes ? torch::zeros({1}) : torch::Tensor();
  auto settled = [&] {
    if (t_ > 1) dist::settle(*group_, token);
    return current_bytes(torch::kCPU);
  };
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const int64_t before = block_bytes ? settled() : 0;
    BlockTrace trace;
    x = block_forward(i, x, checks ? &trace : nullptr);
    if (block_bytes) block_bytes->push_back(settled() - before);
    if (checks) check_block(i, trace, *checks);
  }
  auto xf = ln_f_->forward(x);
  auto logits = lm_head_->forward(xf);  // [B, T, V'/t]
  const int64_t vl = logits.size(2);
  auto flat_t = targets.reshape({-1});
  auto per_token = vocab_parallel_cross_entropy(logits.reshape({-1, vl}), flat_t, wte_->vocab_start, cfg_.vocab,
                                                *group_);
  if (checks) check_head(xf, logits, per_token, flat_t, *checks);
  return per_token.mean();
}

// lm_head and the vocab-parallel cross-entropy against the full model's on the gathered input.
void TpGpt::check_head(const torch::Tensor& xf, const torch::Tensor& logits, const torch::Tensor& per_token,
                       const torch::Tensor& targets, std::vector<SiteCheck>& checks) {
  torch::NoGradGuard no_grad;
  const int64_t vl = logits.size(2);
  const auto flat_t = targets;
  auto xfull = sp_ ? gather_from_sequence_parallel_region(xf, *group_, 1) : xf;
  auto full_logits = torch::linear(xfull, full_->lm_head->weight).reshape({-1, cfg_.vocab});
  // lm_head: this rank's columns of the full logits (padded columns have no full counterpart).
  // (within reorder_bound: a column-parallel GEMM, see c_attn).
  const int64_t real = std::max<int64_t>(0, std::min(vl, cfg_.vocab - wte_->vocab_start));
  if (real > 0) {
    const auto x2 = xfull.reshape({-1, cfg_.width});
    const auto w = full_->lm_head->weight.narrow(0, wte_->vocab_start, real);
    checks.push_back(bounded_site("lm_head (vocab-parallel)", logits.reshape({-1, vl}).narrow(1, 0, real),
                                   full_logits.narrow(1, wte_->vocab_start, real),
                                   reorder_bound(x2, w, torch::Tensor())));
  } else {  // this rank holds only padding: nothing to compare, but one row per site on every rank
    SiteCheck none;
    none.site = "lm_head (vocab-parallel)";
    none.reduced = true;
    checks.push_back(none);
  }
  auto one = torch::nn::functional::cross_entropy(
      full_logits, flat_t, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  checks.push_back(
      bounded_site("cross_entropy (vocab-parallel)", per_token, one, ce_reorder_bound(full_logits, flat_t)));
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
  if (cp_positions_.defined()) {
    TORCH_CHECK(T == cp_positions_.size(0), "TpGpt: ", T, " tokens, but context parallelism set ",
                cp_positions_.size(0), " positions");
    return wte_->forward(idx) + torch::embedding(wpe_, cp_positions_);
  }
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  return wte_->forward(idx) + torch::embedding(wpe_, pos);  // as forward_loss
}

torch::Tensor TpGpt::blocks(const torch::Tensor& x, int64_t begin, int64_t end) {
  if (begin < 0 || end < begin || end > static_cast<int64_t>(blocks_.size()))
    throw std::out_of_range("TpGpt::blocks: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") outside the " + std::to_string(blocks_.size()) + " blocks");
  auto h = x;
  for (int64_t i = begin; i < end; ++i)
    h = block_forward(static_cast<std::size_t>(i), h, nullptr);
  return h;
}

torch::Tensor TpGpt::logits(const torch::Tensor& x) { return lm_head_->forward(ln_f_->forward(x)); }

torch::Tensor TpGpt::loss_of_logits(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t vl = logits.size(-1);
  return vocab_parallel_cross_entropy(logits.reshape({-1, vl}), targets.reshape({-1}), wte_->vocab_start, cfg_.vocab,
                                      *group_)
      .mean();
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

}  // namespace mpt::tp
