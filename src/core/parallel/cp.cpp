// core/parallel/cp: context-parallel attention (ring, all-gather K/V, Ulysses), the sequence
// splits, the GPT loss on a share of the sequence and the bounds of the checks. See cp.hpp.
#include "core/parallel/cp.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/numerics/bounds.hpp"
#include "core/parallel/tp.hpp"
#include "core/runtime/memory.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/trace.hpp"

namespace mpt::cp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The Attention travels through the autograd context as its address (as tp.cpp's groups do):
// the caller keeps it alive for as long as the graph.
int64_t addr(Attention& a) { return static_cast<int64_t>(reinterpret_cast<std::intptr_t>(&a)); }

// Seconds since `t0`, added to `acc`.
struct Timed {
  double& acc;
  double t0 = now_seconds();
  explicit Timed(double& a) : acc(a) {}
  ~Timed() { acc += now_seconds() - t0; }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;
};

}  // namespace

// The private parts of Attention the autograd functions use.
struct AttentionAccess {
  static dist::Group& group(Attention& a) { return *a.group_; }
  static Stats& stats(Attention& a) { return a.stats_; }
  static Split split(const Attention& a) { return a.split_; }
  static int64_t next_call(Attention& a) { return a.calls_++; }
};

namespace {

Attention& attention_of(AutogradContext* ctx) {
  return *reinterpret_cast<Attention*>(static_cast<std::intptr_t>(ctx->saved_data["a"].toInt()));
}

// Point-to-point tags of one ring call: 32 per call (phase 0, the forward's K/V: 0..7; phase 2,
// the backward's K/V: 16..23; phase 3, its dK/dV: 24..31; c ≤ 8 steps), wrapping below
// dist::kRingTagBase.
int ring_tag(int64_t call, int phase, int step) {
  return static_cast<int>((call % (dist::kRingTagBase / 64)) * 32 + phase * 8 + step);
}

// The boolean mask of key positions after query positions: [Tl_q, Tl_k].
torch::Tensor future_mask(const torch::Tensor& qpos, const torch::Tensor& kpos) {
  return kpos.unsqueeze(0) > qpos.unsqueeze(1);
}

// A run of consecutive positions in a rank's local layout: rows [begin, begin + len) of its
// q/k/v, positions [first, first + len). Contiguous: one chunk; balanced: two (r and 2c−1−r).
struct Chunk {
  int64_t begin, len, first;
};

std::vector<Chunk> local_chunks(int64_t T, int64_t c, int64_t r, Split s) {
  const auto pos = positions(T, c, r, s);
  const int64_t Tl = T / c;
  if (s == Split::Contiguous) return {{0, Tl, pos[0].item<int64_t>()}};
  return {{0, Tl / 2, pos[0].item<int64_t>()}, {Tl / 2, Tl / 2, pos[Tl / 2].item<int64_t>()}};
}

// The keys of a K/V block that query chunk `qc` needs: its chunks ascend in position, so the
// ones with a key at or before the chunk's last query are a prefix — columns [0, end) of the
// block (0: the whole block is in the chunk's future and is skipped). Transformer Engine's
// load-balanced ring computes the same halves (kv's first half from an earlier rank, the
// queries' second half against a later rank's block).
int64_t needed_columns(const Chunk& qc, const std::vector<Chunk>& kcs) {
  int64_t end = 0;
  for (const auto& kc : kcs)
    if (kc.first <= qc.first + qc.len - 1) end = kc.begin + kc.len;
  return end;
}

// One step of the online softmax (FlashAttention-2's forward, Algorithm 1, lines 8–10): the
// scores of q against one K/V block, masked, folded into the running max m, normaliser l and
// unnormalised output acc. A row whose keys so far are all masked keeps m = −inf; its shift is 0
// there so that exp(−inf − 0) = 0 instead of exp(−inf + inf) = nan.
void ring_block_forward(const torch::Tensor& q, const torch::Tensor& kb, const torch::Tensor& vb, const torch::Tensor& mask,
                        double scale, torch::Tensor& m, torch::Tensor& l, torch::Tensor& acc) {
  auto s = (torch::matmul(q, kb.transpose(-2, -1)) * scale).masked_fill(mask, -kInf);
  auto m_new = torch::maximum(m, std::get<0>(s.max(-1, /*keepdim=*/true)));
  auto shift = torch::where(torch::isinf(m_new), torch::zeros_like(m_new), m_new);
  auto p = torch::exp(s - shift);
  auto alpha = torch::exp(m - shift);
  l = alpha * l + p.sum(-1, /*keepdim=*/true);
  acc = alpha * acc + torch::matmul(p, vb);
  m = m_new;
}

// One step of FlashAttention-2's backward (Algorithm 2, lines 11–21) for one K/V block: the
// probabilities recomputed from the saved log-sum-exp, dV and dK of the block added to its
// travelling partials dkv[1], dkv[0], dQ to this rank's.
void ring_block_backward(const torch::Tensor& q, const torch::Tensor& kb, const torch::Tensor& vb,
                         const torch::Tensor& mask, double scale, const torch::Tensor& lse, const torch::Tensor& dy,
                         const torch::Tensor& D, torch::Tensor& dq, torch::Tensor& dkv) {
  auto s = (torch::matmul(q, kb.transpose(-2, -1)) * scale).masked_fill(mask, -kInf);
  auto p = torch::exp(s - lse);
  dkv.select(0, 1).add_(torch::matmul(p.transpose(-2, -1), dy));
  auto ds = p * (torch::matmul(dy, vb.transpose(-2, -1)) - D);
  dq.add_(torch::matmul(ds, kb) * scale);
  dkv.select(0, 0).add_(torch::matmul(ds.transpose(-2, -1), q) * scale);
}

// One hop of the ring: `out` to rank r + 1 while `in` (a buffer of its shape) fills from r − 1.
// wait() blocks on both (the time counted as waiting) and returns the received tensor.
struct Hop {
  dist::Work send, recv;
  torch::Tensor in;
  Hop() = default;
  Hop(dist::Group& g, const torch::Tensor& out, int tag) : in(torch::empty_like(out)) {
    const int c = g.size(), r = g.rank();
    recv = g.recv_async(in, (r - 1 + c) % c, tag);
    send = g.send_async(out, (r + 1) % c, tag);
  }
  torch::Tensor wait(Stats& st) {
    Timed t(st.wait_s);
    recv.wait();
    send.wait();
    return in;
  }
};

// The parts of one ring step: for each of this rank's query chunks `qcs` that sees keys of block
// `src` (columns [0, ke): needed_columns), fn(chunk, ke, the mask of its queries against those keys),
// timed as computing and traced as `what`; counts the pairs and whether the block was computed.
template <class Fn>
void for_each_part(int64_t T, int c, int src, Split split, const torch::Tensor& qpos, const std::vector<Chunk>& qcs,
                   Stats& st, const char* what, Fn fn) {
  const auto kpos = positions(T, c, src, split);
  const auto kcs = local_chunks(T, c, src, split);
  bool any = false;
  for (const auto& qc : qcs) {
    const int64_t ke = needed_columns(qc, kcs);
    if (ke == 0) continue;
    Timed t(st.compute_s);
    trace::Scope sc(trace::Track::Compute, what);
    fn(qc, ke, future_mask(qpos.narrow(0, qc.begin, qc.len), kpos.narrow(0, 0, ke)));
    st.pairs_computed += qc.len * ke;
    any = true;
  }
  ++(any ? st.blocks_computed : st.blocks_skipped);
}

// What one rank's ring call works with: its group and stats, the sequence's length, the scale of
// the scores, the split, this rank's positions and query chunks. q [B, nh, T/c, hd].
struct RingRank {
  dist::Group& g;
  Stats& st;
  int c, r;
  int64_t T;
  double scale;
  Split split;
  torch::Tensor qpos;
  std::vector<Chunk> qcs;
  RingRank(Attention& a, const torch::Tensor& q)
      : g(AttentionAccess::group(a)), st(AttentionAccess::stats(a)), c(g.size()), r(g.rank()), T(q.size(2) * c),
        scale(1.0 / std::sqrt(static_cast<double>(q.size(3)))), split(AttentionAccess::split(a)),
        qpos(positions(T, c, r, split)), qcs(local_chunks(T, c, r, split)) {}
  // for_each_part at ring step s (the block of rank r − s)
  template <class Fn>
  void parts(int s, const char* what, Fn fn) {
    for_each_part(T, c, (r - s + c) % c, split, qpos, qcs, st, what, fn);
  }
};

}  // namespace

// Ring attention (Liu et al. 2023) with FlashAttention-2's merge, forward and backward.
struct RingFunction : torch::autograd::Function<RingFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t a_addr) {
    ctx->saved_data["a"] = a_addr;
    Attention& a = attention_of(ctx);
    const int64_t call = AttentionAccess::next_call(a);
    ctx->saved_data["call"] = call;
    RingRank rr(a, q);
    auto& g = rr.g;
    auto& st = rr.st;
    const int c = rr.c;
    const double scale = rr.scale;
    const int64_t Tl = q.size(2);
    auto m = torch::full({q.size(0), q.size(1), Tl, 1}, -kInf, q.options());
    auto l = torch::zeros({q.size(0), q.size(1), Tl, 1}, q.options());
    auto acc = torch::zeros_like(q);
    auto kv = torch::stack({k, v}).contiguous();
    for (int s = 0; s < c; ++s) {
      Hop hop;  // the next block travels while this one is computed
      if (s < c - 1) hop = Hop(g, kv, ring_tag(call, 0, s));
      rr.parts(s, "ring forward step", [&](const Chunk& qc, int64_t ke, const torch::Tensor& mask) {
        auto rows = [&](torch::Tensor& x) { return x.narrow(2, qc.begin, qc.len); };
        auto m2 = rows(m).clone(), l2 = rows(l).clone(), a2 = rows(acc).clone();
        ring_block_forward(q.narrow(2, qc.begin, qc.len), kv[0].narrow(2, 0, ke), kv[1].narrow(2, 0, ke),
                           mask, scale, m2, l2, a2);
        rows(m).copy_(m2);
        rows(l).copy_(l2);
        rows(acc).copy_(a2);
      });
      if (s < c - 1) kv = hop.wait(st);
    }
    torch::Tensor y, lse;
    {
      Timed t(st.compute_s);
      y = acc / l;
      lse = m + torch::log(l);
    }
    ctx->save_for_backward({q, k, v, y, lse});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const int64_t call = ctx->saved_data["call"].toInt();
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &y = saved[3], &lse = saved[4];
    RingRank rr(attention_of(ctx), q);
    auto& g = rr.g;
    auto& st = rr.st;
    const int c = rr.c;
    const double scale = rr.scale;
    const auto dy = grad[0].contiguous();
    torch::Tensor D, dq;
    {
      Timed t(st.compute_s);
      D = (dy * y).sum(-1, /*keepdim=*/true);  // rowsum(dO ∘ O), FlashAttention-2 Algorithm 2 line 4
      dq = torch::zeros_like(q);
    }
    auto kv = torch::stack({k, v}).contiguous();
    auto dkv = torch::zeros_like(kv);
    for (int s = 0; s < c; ++s) {
      Hop kv_hop;
      if (s < c - 1) kv_hop = Hop(g, kv, ring_tag(call, 2, s));
      rr.parts(s, "ring backward step", [&](const Chunk& qc, int64_t ke, const torch::Tensor& mask) {
        auto rows = [&](const torch::Tensor& x) { return x.narrow(2, qc.begin, qc.len); };
        auto dq_c = rows(dq), dkv_c = dkv.narrow(3, 0, ke);  // views: the adds land in dq, dkv
        ring_block_backward(rows(q), kv[0].narrow(2, 0, ke), kv[1].narrow(2, 0, ke), mask, scale,
                            rows(lse), rows(dy), rows(D), dq_c, dkv_c);
      });
      // The partial dK/dV of the block goes on with it, one rank per step; the one that arrives
      // from r − 1 at the last step is this rank's own block, complete.
      if (c > 1) dkv = Hop(g, dkv, ring_tag(call, 3, s)).wait(st);
      if (s < c - 1) kv = kv_hop.wait(st);
    }
    return {dq, dkv[0], dkv[1], torch::Tensor()};
  }
};

namespace {

// Ulysses' all-to-all (DeepSpeed's _SeqAllToAll): x [B, nh, Tl, hd] sequence-sharded → [B, nh/c, T, hd]
// head-sharded with the sequence in rank order (chunk i from rank i), or back.
torch::Tensor seq_to_heads(const torch::Tensor& x, dist::Group& g) {
  const int64_t c = g.size(), B = x.size(0), nh = x.size(1), Tl = x.size(2), hd = x.size(3);
  auto in = x.reshape({B, c, nh / c, Tl, hd}).permute({1, 0, 2, 3, 4}).contiguous();  // chunk j: heads of rank j
  auto out = torch::empty_like(in);
  g.all_to_all(in, out);  // out[i]: rank i's positions of this rank's heads
  return out.permute({1, 2, 0, 3, 4}).reshape({B, nh / c, c * Tl, hd});
}

torch::Tensor heads_to_seq(const torch::Tensor& x, dist::Group& g) {
  const int64_t c = g.size(), B = x.size(0), nhl = x.size(1), T = x.size(2), hd = x.size(3), Tl = T / c;
  auto in = x.reshape({B, nhl, c, Tl, hd}).permute({2, 0, 1, 3, 4}).contiguous();  // chunk j: rank j's positions
  auto out = torch::empty_like(in);
  g.all_to_all(in, out);  // out[i]: this rank's positions of rank i's heads
  return out.permute({1, 0, 2, 3, 4}).reshape({B, c * nhl, Tl, hd});
}

// An all-to-all as an autograd function: Forward's layout change forward, Backward's (its inverse)
// on the gradient (DeepSpeed's _SeqAllToAll).
template <torch::Tensor (*Forward)(const torch::Tensor&, dist::Group&),
          torch::Tensor (*Backward)(const torch::Tensor&, dist::Group&)>
struct AllToAll : torch::autograd::Function<AllToAll<Forward, Backward>> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t a_addr) {
    ctx->saved_data["a"] = a_addr;
    return Forward(x, AttentionAccess::group(attention_of(ctx)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {Backward(grad[0], AttentionAccess::group(attention_of(ctx))), torch::Tensor()};
  }
};
using SeqToHeads = AllToAll<seq_to_heads, heads_to_seq>;
using HeadsToSeq = AllToAll<heads_to_seq, seq_to_heads>;

// The permutation that puts the ranks' positions (concatenated in rank order) in natural order,
// and whether it is the identity (the contiguous split).
torch::Tensor natural_order(int64_t T, int64_t c, Split split) {
  std::vector<torch::Tensor> all;
  for (int64_t r = 0; r < c; ++r) all.push_back(positions(T, c, r, split));
  return torch::argsort(torch::cat(all));
}

// The causal attention of queries at `qpos` against the whole sequence's keys and values (natural
// order, [B, nh, T, hd]), as GptBlockImpl writes it, so that each query row is one process's row.
torch::Tensor rows_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& qpos) {
  const int64_t hd = q.size(3), T = k.size(2);
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  att = att.masked_fill(future_mask(qpos, torch::arange(T, qpos.options())), -kInf);
  return torch::matmul(torch::softmax(att, /*dim=*/-1), v);
}

}  // namespace

// ----------------------------------------------------------------------------
// Splits and formulas
// ----------------------------------------------------------------------------

Split split_from_name(const std::string& name) {
  if (name == "contiguous") return Split::Contiguous;
  if (name == "balanced") return Split::Balanced;
  throw std::invalid_argument("cp split: expected \"contiguous\" or \"balanced\", got \"" + name + "\"");
}

std::string split_name(Split s) { return s == Split::Contiguous ? "contiguous" : "balanced"; }

Variant variant_from_name(const std::string& name) {
  if (name == "ring") return Variant::Ring;
  if (name == "all_gather") return Variant::AllGather;
  if (name == "ulysses") return Variant::Ulysses;
  throw std::invalid_argument("cp variant: expected \"ring\", \"all_gather\" or \"ulysses\", got \"" + name + "\"");
}

std::string variant_name(Variant v) {
  switch (v) {
    case Variant::Ring: return "ring";
    case Variant::AllGather: return "all_gather";
    case Variant::Ulysses: return "ulysses";
  }
  return "?";
}

void check_split(int64_t T, int64_t c, Split s) {
  const int64_t parts = s == Split::Balanced ? 2 * c : c;
  if (c < 1 || T < 1 || T % parts != 0)
    throw std::invalid_argument("cp: the " + split_name(s) + " split of " + std::to_string(T) + " positions over " +
                                std::to_string(c) + " ranks needs a multiple of " + std::to_string(parts));
}

torch::Tensor positions(int64_t T, int64_t c, int64_t r, Split s) {
  check_split(T, c, s);
  if (r < 0 || r >= c) throw std::out_of_range("cp::positions: rank " + std::to_string(r) + " of " + std::to_string(c));
  if (s == Split::Contiguous) return torch::arange(r * (T / c), (r + 1) * (T / c), torch::kLong);
  const int64_t n = T / (2 * c);
  return torch::cat({torch::arange(r * n, (r + 1) * n, torch::kLong),
                     torch::arange((2 * c - 1 - r) * n, (2 * c - r) * n, torch::kLong)});
}

int64_t causal_pairs(int64_t T, int64_t c, int64_t r, Split s) {
  return (positions(T, c, r, s) + 1).sum().item<int64_t>();
}

int64_t ring_computed_pairs(int64_t T, int64_t c, int64_t r, Split s) {
  check_split(T, c, s);
  const int64_t Tl = T / c;
  // Contiguous: the blocks of ranks 0 .. r, whole. Balanced: three quarters of the own block
  // (its first query chunk does not see its second key chunk, 2c−1−r), and half of every other
  // (an earlier rank's first chunk for all queries, or a later rank's block for the second
  // query chunk).
  if (s == Split::Contiguous) return (r + 1) * Tl * Tl;
  return 3 * Tl * Tl / 4 + (c - 1) * Tl * Tl / 2;
}

double block_activation_bytes(Variant v, Split split, int64_t T, int64_t c, int64_t B, int64_t h, int64_t a) {
  check_split(T, c, split);
  const double sl = static_cast<double>(T / c), t = static_cast<double>(T), b = static_cast<double>(B),
               hd = static_cast<double>(h), ad = static_cast<double>(a);
  const double base = 64 * sl * b * hd + 16 * sl * b;
  const bool perm = split == Split::Balanced;
  // matmul copies q (and one process's k, v) only when it cannot fold [B, heads] into one batch
  // dimension as a view of qkv, i.e. when B > 1 and a > 1; otherwise the views keep all of qkv
  const bool copies = B > 1 && a > 1;
  switch (v) {
    case Variant::Ring: return base + 4 * ad * sl * b;
    case Variant::AllGather:
      return base - (copies ? 8 * sl * b * hd : 0.0) + 8 * t * b * hd + 4 * ad * sl * t * b + sl * t + (perm ? 8 * t : 0);
    case Variant::Ulysses: return base + 4 * ad * sl * t * b + t * t + (perm ? 16 * t : 0);
  }
  return 0;
}

double block_activation_bytes_one_process(int64_t T, int64_t B, int64_t h, int64_t a) {
  const double t = static_cast<double>(T), b = static_cast<double>(B);
  return 64 * t * b * static_cast<double>(h) + 16 * t * b + 4 * static_cast<double>(a) * t * t * b + t * t;
}

double bytes_per_layer(Variant v, int64_t c, double blk) {
  const double cd = static_cast<double>(c);
  switch (v) {
    case Variant::Ring: return (2 * (cd - 1) + 2 * (cd - 1) + 2 * cd) * blk * (c > 1 ? 1 : 0);
    case Variant::AllGather: return 4 * (cd - 1) * blk;
    case Variant::Ulysses: return 8 * (cd - 1) / cd * blk;
  }
  return 0;
}

// ----------------------------------------------------------------------------
// The attention
// ----------------------------------------------------------------------------

Attention::Attention(std::shared_ptr<dist::Group> group, Variant variant, Split split)
    : group_(std::move(group)), variant_(variant), split_(split) {
  if (!group_) throw std::invalid_argument("cp::Attention: null group");
}

torch::Tensor Attention::operator()(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t c = group_->size(), T = q.size(2) * c;
  check_split(T, c, split_);
  switch (variant_) {
    case Variant::Ring:
      return RingFunction::apply(q, k, v, addr(*this));
    case Variant::AllGather: {
      auto kf = tp::gather_from_sequence_parallel_region(k.contiguous(), *group_, 2);
      auto vf = tp::gather_from_sequence_parallel_region(v.contiguous(), *group_, 2);
      if (split_ != Split::Contiguous) {
        const auto order = natural_order(T, c, split_);
        kf = kf.index_select(2, order);
        vf = vf.index_select(2, order);
      }
      Timed t(stats_.compute_s);
      ++stats_.blocks_computed;
      return rows_attention(q, kf, vf, positions(T, c, group_->rank(), split_));
    }
    case Variant::Ulysses: {
      if (q.size(1) % c != 0)
        throw std::invalid_argument("cp::Attention (Ulysses): the group size " + std::to_string(c) +
                                    " must divide the heads (" + std::to_string(q.size(1)) + ")");
      auto qh = SeqToHeads::apply(q.contiguous(), addr(*this));
      auto kh = SeqToHeads::apply(k.contiguous(), addr(*this));
      auto vh = SeqToHeads::apply(v.contiguous(), addr(*this));
      torch::Tensor order, inverse;
      if (split_ != Split::Contiguous) {
        order = natural_order(T, c, split_);
        inverse = torch::argsort(order);
        qh = qh.index_select(2, order);
        kh = kh.index_select(2, order);
        vh = vh.index_select(2, order);
      }
      torch::Tensor y;
      {
        Timed t(stats_.compute_s);
        ++stats_.blocks_computed;
        y = causal_attention(qh, kh, vh);
      }
      if (inverse.defined()) y = y.index_select(2, inverse);
      return HeadsToSeq::apply(y.contiguous(), addr(*this));
    }
  }
  throw std::logic_error("cp::Attention: unknown variant");
}

GptAttention Attention::hook() {
  return [this](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) { return (*this)(q, k, v); };
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t T = q.size(2), hd = q.size(3);
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  auto mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).tril();
  att = att.masked_fill(mask.logical_not(), -kInf);
  return torch::matmul(torch::softmax(att, /*dim=*/-1), v);
}

// ----------------------------------------------------------------------------
// The GPT on a share of the sequence
// ----------------------------------------------------------------------------

torch::Tensor gpt_loss(TinyGptImpl& model, const torch::Tensor& idx, const torch::Tensor& targets,
                       const torch::Tensor& pos, Attention& attention, torch::Tensor* logits,
                       std::vector<int64_t>* block_bytes) {
  dist::Group& g = AttentionAccess::group(attention);
  const int64_t B = idx.size(0), T = idx.size(1) * g.size();
  torch::Tensor token = torch::zeros({1});  // settled_bytes' (allocated before the first reading)
  auto x = model.wte->forward(idx) + model.wpe->forward(pos);
  const auto attn = attention.hook();
  for (std::size_t i = 0; i < model.blocks.size(); ++i) {
    const int64_t before = block_bytes ? settled_bytes(g, token) : 0;
    x = model.blocks[i]->forward(x, {}, {}, "h" + std::to_string(i) + ".", attn);
    if (block_bytes) block_bytes->push_back(settled_bytes(g, token) - before);
  }
  auto out = torch::linear(model.ln_f->forward(x), model.lm_head->weight, model.lm_head->bias);
  if (logits) *logits = out;
  const int64_t V = out.size(-1);
  // The sum over this rank's tokens, divided by the whole sequence's count: a division's backward
  // divides the incoming 1 by B·T, as the mean's backward of one process does (same bits).
  auto local = torch::nn::functional::cross_entropy(
                   out.reshape({-1, V}), targets.reshape({-1}),
                   torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
               static_cast<double>(B * T);
  return tp::reduce_from_tensor_model_parallel_region(local, g);
}

int64_t settled_bytes(dist::Group& group, torch::Tensor& token) {
  dist::settle(group, token);
  return current_bytes(torch::kCPU);
}

void allreduce_grads(TinyGptImpl& model, dist::Group& group) {
  for (auto& p : model.parameters())
    if (p.grad().defined()) group.allreduce(p.grad());
}

// ----------------------------------------------------------------------------
// Bounds
// ----------------------------------------------------------------------------

AttentionBounds attention_bounds(const torch::Tensor& q32, const torch::Tensor& k32, const torch::Tensor& v32,
                                 const torch::Tensor& dy32, int64_t blocks, int64_t grad_terms) {
  torch::NoGradGuard ng;
  const double u = bounds::kFp32UnitRoundoff, e_exp = 2 * u;
  const int64_t T = q32.size(2), hd = q32.size(3);
  const auto g = [u](int64_t n) { return bounds::gamma(n, u); };
  const double nb = static_cast<double>(blocks);
  // The scale as the fp32 code multiplies by it (a double scalar rounded to the tensor's float).
  const double scale = static_cast<double>(static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))));
  auto q = q32.to(torch::kDouble), k = k32.to(torch::kDouble), v = v32.to(torch::kDouble), dy = dy32.to(torch::kDouble);
  auto future = torch::ones({T, T}, torch::kBool).tril().logical_not();
  auto s = torch::matmul(q, k.transpose(-2, -1)) * scale;
  auto s_m = s.masked_fill(future, -kInf);
  auto lse = torch::logsumexp(s_m, -1, /*keepdim=*/true);
  auto w = torch::exp(s_m - lse);  // exact weights; 0 where masked
  auto o = torch::matmul(w, v);
  auto open = future.logical_not().to(torch::kDouble);  // 1 where a key is visible
  // Score error: a q·k of hd products in any order (γ_hd Σ|q||k|) times the scale, and the scale's
  // rounding (u|s|); Es = its largest over the row's visible keys.
  auto es = (torch::matmul(q.abs(), k.abs().transpose(-2, -1)) * (scale * g(hd)) + u * s.abs()) * open;
  auto Es = std::get<0>(es.max(-1, true));
  // The largest |s − max| over the row's visible keys: every exponent's argument rounds within u·R.
  auto R = std::get<0>(((std::get<0>(s_m.max(-1, true)) - s).abs() * open).max(-1, true));
  // Forward weights: the score error enters the numerator and the normaliser (2 Es); each of the
  // ≤ blocks + 1 exponent arguments and exps rounds (u R + e_exp); the normaliser is a sum of T
  // terms and ≤ 2·blocks rescalings, the output a division: γ_{T + 2 blocks + 2}.
  auto eps = 2 * Es + (nb + 1) * (u * R + e_exp) + g(T + 2 * blocks + 2);
  auto w_absv = torch::matmul(w, v.abs());
  auto by = (eps + g(T + 2 * blocks)) * w_absv;
  // Backward weights: recomputed from the saved lse (ring) or kept from the forward (one process):
  // the forward's ε, the lse's own error (≤ Es + u|lse| + e_exp(1 + log T), the score error once
  // more, and the rounding of s − lse and of its exp.
  auto eps_b = 2 * eps + Es + u * (2 * lse.abs() + R + std::log(static_cast<double>(T))) + 2 * e_exp;
  auto dP = torch::matmul(dy, v.transpose(-2, -1));
  auto dP_err = torch::matmul(dy.abs(), v.abs().transpose(-2, -1)) * g(hd);
  auto D = (dy * o).sum(-1, true);
  // D = rowsum(dy∘ô) (ring) or Σ_j ŵ_ij dP̂_ij (autograd's softmax backward): the sum of both bounds.
  auto dD = (dy.abs() * by).sum(-1, true) + g(hd) * (dy.abs() * o.abs()).sum(-1, true) +
            (eps_b + g(T)) * (w * dP.abs()).sum(-1, true) + (w * dP_err).sum(-1, true);
  auto dS = w * (dP - D);
  auto dS_err = eps_b * (w * (dP - D).abs()) + w * (dP_err + dD) + 2 * u * (w * (dP - D).abs());
  AttentionBounds b;
  b.y_ref = o;
  b.dv_ref = torch::matmul(w.transpose(-2, -1), dy);
  b.dq_ref = torch::matmul(dS, k) * scale;
  b.dk_ref = torch::matmul(dS.transpose(-2, -1), q) * scale;
  b.y = by;
  b.dv = torch::matmul((eps_b * w).transpose(-2, -1), dy.abs()) +
         g(T + grad_terms) * torch::matmul(w.transpose(-2, -1), dy.abs());
  b.dq = scale * (torch::matmul(dS_err, k.abs()) + g(T + 2 * blocks + 1) * torch::matmul(dS.abs(), k.abs()));
  b.dk = scale * (torch::matmul(dS_err.transpose(-2, -1), q.abs()) +
                  g(T + grad_terms + 1) * torch::matmul(dS.abs().transpose(-2, -1), q.abs()));
  // Higher orders: every first-order term above is a product with at most one relative error;
  // the products of two are within the largest ε times the first-order bound.
  const double hi = 1 + 2 * eps_b.max().item<double>();
  b.y *= hi;
  b.dq *= hi;
  b.dk *= hi;
  b.dv *= hi;
  return b;
}

}  // namespace mpt::cp
