// core/parallel, ZeRO's shard layout and its collectives: FSDP2's dim-0 split (dim0_split,
// shard_dim0), the flat [N, C] buffers of foreach_reduce / foreach_all_gather (FlatShardGroup),
// the padded all-gather of shards (all_gather_dim0) and the bound a reduced shard is checked
// against (reduction_error). ShardedDataParallel, which uses them: zero.cpp. See parallel/zero.hpp.
#include "core/parallel/zero.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include <fmt/format.h>

#include "core/numerics/bounds.hpp"

namespace mpt::dist {


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

// ----------------------------------------------------------------------------
// FlatShardGroup: FSDP2's foreach_reduce / foreach_all_gather layout, buffers kept
// ----------------------------------------------------------------------------

std::vector<std::vector<int64_t>> shapes_of(const std::vector<torch::Tensor>& ts) {
  std::vector<std::vector<int64_t>> v;
  for (const auto& t : ts) v.push_back(t.sizes().vec());
  return v;
}

namespace {

// The [N, chunk, row] view of tensor i's column range of the [N, C] buffer `blocks`, and the
// [dim0, row] view of a contiguous tensor t. Rows [0, dim0) of the padded tensor lie in q full
// blocks and one partial block of rem rows (dim0 = q·chunk + rem).
torch::Tensor block_view(const torch::Tensor& blocks, int64_t off, const Dim0Split& s, int64_t row) {
  return blocks.narrow(1, off, s.chunk * row).view({blocks.size(0), s.chunk, row});
}

// dst[0 .. dim0) rows of the blocked view <- src [dim0, row] (or the reverse with to_blocks = false).
// `divide` (to_blocks only, src already of the blocks' dtype): writes src / divide instead, the
// same op as a copy followed by div_(divide) (at::div with a Scalar: a wrapped-number divisor).
void copy_rows(const torch::Tensor& blocked, const torch::Tensor& rows2d, const Dim0Split& s, bool to_blocks,
               double divide = 1.0) {
  const int64_t q = s.dim0 / s.chunk, rem = s.dim0 - q * s.chunk, row = rows2d.size(1);
  torch::Tensor d;
  if (divide != 1.0) {
    d = c10::scalar_to_tensor(divide);
    d.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  auto transfer = [&](torch::Tensor b, torch::Tensor r) {  // blocks <-> rows
    if (!to_blocks) r.copy_(b);
    else if (d.defined()) at::div_out(b, r, d);
    else b.copy_(r);
  };
  if (q > 0) {
    auto b = blocked.narrow(0, 0, q);
    auto r = rows2d.narrow(0, 0, q * s.chunk);
    r = to_blocks ? r.reshape({q, s.chunk, row}) : r.view({q, s.chunk, row});  // the destination: a view
    transfer(b, r);
  }
  if (rem > 0) {
    auto b = blocked.select(0, q).narrow(0, 0, rem);
    auto r = rows2d.narrow(0, q * s.chunk, rem);
    transfer(b, r);
  }
}

}  // namespace

FlatShardGroup::FlatShardGroup(std::vector<std::vector<int64_t>> shapes, int rank, int world)
    : shapes_(std::move(shapes)), rank_(rank), world_(world) {
  if (shapes_.empty()) throw std::invalid_argument("FlatShardGroup: expected at least one tensor");
  off_.push_back(0);
  for (const auto& sh : shapes_) {
    if (sh.empty()) throw std::invalid_argument("FlatShardGroup: expected tensors of >= 1 dims, got a 0-dim one");
    int64_t row = 1;
    for (std::size_t d = 1; d < sh.size(); ++d) row *= sh[d];
    sp_.push_back(dim0_split(sh[0], rank, world));
    row_.push_back(row);
    off_.push_back(off_.back() + sp_.back().chunk * row);
  }
}

torch::Tensor& FlatShardGroup::buffer(std::map<torch::ScalarType, torch::Tensor>& m, torch::ScalarType dt,
                                      int64_t numel, const torch::Device& dev, bool zero) {
  auto& t = m[dt];
  if (!t.defined() || t.device() != dev) {
    const auto o = torch::TensorOptions().dtype(dt).device(dev);
    t = zero ? torch::zeros({numel}, o) : torch::empty({numel}, o);  // the padding: zero for good
  }
  return t;
}

void FlatShardGroup::copy_in(const std::vector<torch::Tensor>& fulls, const torch::Tensor& in, double divide) {
  auto blocks = in.view({world_, shard_numel()});
  for (std::size_t i = 0; i < fulls.size(); ++i)
    copy_rows(block_view(blocks, off_[i], sp_[i], row_[i]), fulls[i].reshape({sp_[i].dim0, row_[i]}), sp_[i],
              /*to_blocks=*/true, divide);
}

torch::Tensor FlatShardGroup::reduce_scatter_flat(Group& g, const std::vector<torch::Tensor>& fulls,
                                                  torch::ScalarType reduce_dtype, double divide, torch::Tensor out) {
  if (fulls.size() != shapes_.size())
    throw std::invalid_argument(fmt::format("FlatShardGroup::reduce_scatter: expected {} tensors, got {}",
                                            shapes_.size(), fulls.size()));
  for (std::size_t i = 0; i < fulls.size(); ++i)
    if (fulls[i].sizes().vec() != shapes_[i])
      throw std::invalid_argument(fmt::format("FlatShardGroup::reduce_scatter: expected tensor {} of {}, got {}", i,
                                              c10::str(c10::IntArrayRef(shapes_[i])), c10::str(fulls[i].sizes())));
  torch::NoGradGuard ng;
  const auto dev = fulls[0].device();
  auto& in = buffer(rs_in_, reduce_dtype, world_ * shard_numel(), dev, /*zero=*/true);
  if (out.defined()) {
    if (!out.is_contiguous() || out.numel() != shard_numel() || out.scalar_type() != reduce_dtype || out.device() != dev)
      throw std::invalid_argument(fmt::format("FlatShardGroup::reduce_scatter: expected an output of {} contiguous "
                                              "elements of {}, got {} of {}", shard_numel(),
                                              c10::toString(reduce_dtype), c10::str(out.sizes()),
                                              c10::toString(out.scalar_type())));
  } else {
    out = buffer(rs_out_, reduce_dtype, shard_numel(), dev, /*zero=*/false);
  }
  // chunk_cat: block r = chunk r of every tensor, cast to reduce_dtype, and the pre-divide
  // (padding: 0 / N = 0): in one pass where no cast comes first.
  bool fuse = divide != 1.0;
  for (const auto& t : fulls) fuse = fuse && t.scalar_type() == reduce_dtype;
  copy_in(fulls, in, fuse ? divide : 1.0);
  if (divide != 1.0 && !fuse) in.div_(divide);
  if (keep_) kept_ = in.clone();
  g.reduce_scatter(in, out);
  return out;
}

void FlatShardGroup::reduce_scatter(Group& g, const std::vector<torch::Tensor>& fulls,
                                    const std::vector<torch::Tensor>& outs, torch::ScalarType reduce_dtype,
                                    double divide, bool accumulate) {
  if (outs.size() != fulls.size() || outs.size() != shapes_.size())
    throw std::invalid_argument("reduce_scatter_dim0: expected as many outputs as full tensors, at least one");
  for (std::size_t i = 0; i < outs.size(); ++i) {
    auto want = shapes_[i];
    want[0] = sp_[i].rows;
    if (outs[i].sizes().vec() != want)
      throw std::invalid_argument(fmt::format("reduce_scatter_dim0: expected an output of {} rows of {}, got {}",
                                              sp_[i].rows, c10::str(c10::IntArrayRef(shapes_[i])),
                                              c10::str(outs[i].sizes())));
  }
  auto part = reduce_scatter_flat(g, fulls, reduce_dtype, divide);
  torch::NoGradGuard ng;
  for (std::size_t i = 0; i < fulls.size(); ++i) {
    auto mine = part.narrow(0, off_[i], sp_[i].rows * row_[i]).view(outs[i].sizes());
    accumulate ? outs[i].add_(mine) : outs[i].copy_(mine);
  }
}

void FlatShardGroup::all_gather(Group& g, const std::vector<torch::Tensor>& shards,
                                const std::vector<torch::Tensor>& fulls) {
  if (shards.size() != fulls.size() || fulls.size() != shapes_.size())
    throw std::invalid_argument("all_gather_dim0: expected as many shards as full tensors, at least one");
  for (std::size_t i = 0; i < fulls.size(); ++i) {
    auto want = shapes_[i];
    want[0] = sp_[i].rows;
    if (fulls[i].sizes().vec() != shapes_[i] || shards[i].sizes().vec() != want)
      throw std::invalid_argument(fmt::format("all_gather_dim0: expected a shard of {} rows of {}, got {}",
                                              sp_[i].rows, c10::str(c10::IntArrayRef(shapes_[i])),
                                              c10::str(shards[i].sizes())));
    if (fulls[i].scalar_type() != fulls[0].scalar_type() || !fulls[i].is_contiguous())
      throw std::invalid_argument("all_gather_dim0: expected contiguous full tensors of one dtype");
  }
  torch::NoGradGuard ng;
  const auto dt = fulls[0].scalar_type();
  const auto dev = fulls[0].device();
  // Zeroed once: the padding rows are never written, so every rank's block keeps zero padding.
  auto& out = buffer(ag_out_, dt, world_ * shard_numel(), dev, /*zero=*/true);
  // The ring reads this rank's block in place; c10d's all-gather gets a separate input.
  auto in = g.uses_ring("all_gather") ? out.narrow(0, rank_ * shard_numel(), shard_numel())
                                      : buffer(ag_in_, dt, shard_numel(), dev, /*zero=*/true);
  // foreach_all_gather's copy-in: this rank's shards side by side (cast to the full dtype).
  for (std::size_t i = 0; i < fulls.size(); ++i)
    if (sp_[i].rows > 0) in.narrow(0, off_[i], shards[i].numel()).copy_(shards[i].reshape({-1}));
  // An all-gather only moves bits: bf16 travels as bytes (LibTorch 1.13 Gloo has no bf16).
  if (dt == torch::kBFloat16)
    g.all_gather(in.view(torch::kUInt8), out.view(torch::kUInt8));
  else
    g.all_gather(in, out);
  // Copy-out (split_with_sizes_copy): rank r's block holds its chunk of every tensor.
  auto blocks = out.view({world_, shard_numel()});
  for (std::size_t i = 0; i < fulls.size(); ++i)
    copy_rows(block_view(blocks, off_[i], sp_[i], row_[i]), fulls[i].view({sp_[i].dim0, row_[i]}), sp_[i],
              /*to_blocks=*/false);
}

void all_gather_dim0(Group& g, const std::vector<torch::Tensor>& shards, const std::vector<torch::Tensor>& fulls) {
  if (shards.size() != fulls.size() || fulls.empty())
    throw std::invalid_argument("all_gather_dim0: expected as many shards as full tensors, at least one");
  for (std::size_t i = 0; i < fulls.size(); ++i)
    if (fulls[i].dim() == 0 || shards[i].dim() != fulls[i].dim())
      throw std::invalid_argument(fmt::format("all_gather_dim0: expected a shard of {}'s dims, got {}",
                                              c10::str(fulls[i].sizes()), c10::str(shards[i].sizes())));
  FlatShardGroup(shapes_of(fulls), g.rank(), g.size()).all_gather(g, shards, fulls);
}

void all_gather_dim0(Group& g, const torch::Tensor& shard, torch::Tensor full) {
  all_gather_dim0(g, std::vector<torch::Tensor>{shard}, std::vector<torch::Tensor>{std::move(full)});
}

void reduce_scatter_dim0(Group& g, const std::vector<torch::Tensor>& fulls, const std::vector<torch::Tensor>& outs,
                         torch::ScalarType reduce_dtype, double divide, bool accumulate) {
  if (outs.size() != fulls.size() || fulls.empty())
    throw std::invalid_argument("reduce_scatter_dim0: expected as many outputs as full tensors, at least one");
  for (std::size_t i = 0; i < fulls.size(); ++i)
    if (fulls[i].dim() == 0 || outs[i].dim() != fulls[i].dim())
      throw std::invalid_argument(fmt::format("reduce_scatter_dim0: expected an output of {}'s dims, got {}",
                                              c10::str(fulls[i].sizes()), c10::str(outs[i].sizes())));
  FlatShardGroup(shapes_of(fulls), g.rank(), g.size()).reduce_scatter(g, fulls, outs, reduce_dtype, divide, accumulate);
}

void reduce_scatter_dim0(Group& g, const torch::Tensor& full, torch::Tensor out, torch::ScalarType reduce_dtype,
                         double divide, bool accumulate) {
  reduce_scatter_dim0(g, std::vector<torch::Tensor>{full}, std::vector<torch::Tensor>{std::move(out)}, reduce_dtype,
                      divide, accumulate);
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

ReductionError reduction_error(Group& g, const std::vector<ReductionRecord>& records) {
  torch::NoGradGuard ng;
  const int n = g.size();
  ReductionError e;
  for (const auto& rec : records) {
    const int64_t len = rec.terms.numel();
    if (rec.scattered ? len != n * rec.reduced.numel() : len != rec.reduced.numel())
      throw std::invalid_argument(fmt::format("reduction_error: expected {} terms for {} reduced elements, got {}",
                                              rec.scattered ? "N x" : "as many", rec.reduced.numel(), len));
    // Every rank's summands, [N, len] (bf16 travels as bytes, as all_gather_dim0 sends it).
    auto terms = rec.terms.contiguous();
    auto all = torch::empty({n * len}, terms.options());
    if (terms.scalar_type() == torch::kBFloat16)
      g.all_gather(terms.view(torch::kUInt8), all.view(torch::kUInt8));
    else
      g.all_gather(terms, all);
    auto t = all.view({n, len}).to(torch::kFloat64);
    auto exact = t.sum(0);
    auto abs_sum = t.abs().sum(0);
    if (rec.scattered) {  // this rank's block of the [N, C] layout
      const int64_t c = rec.reduced.numel();
      exact = exact.view({n, c})[g.rank()];
      abs_sum = abs_sum.view({n, c})[g.rank()];
    }
    const double gam = bounds::gamma(n - 1, bounds::unit_roundoff(rec.terms.scalar_type())) +
                      bounds::gamma(n - 1, bounds::unit_roundoff(torch::kFloat64));
    auto bound = abs_sum * gam;
    auto diff = (rec.reduced.to(torch::kFloat64) - exact).abs();
    // diff / bound with 0 / 0 = 0 (all terms zero: the sum must be exactly zero) and x / 0 = inf.
    auto ratio = torch::where(diff == 0, torch::zeros_like(diff), diff / bound);
    if (diff.numel() > 0) {
      e.max_abs_diff = std::max(e.max_abs_diff, diff.max().item<double>());
      e.max_bound = std::max(e.max_bound, bound.max().item<double>());
      e.max_ratio = std::max(e.max_ratio, ratio.max().item<double>());
    }
    e.elements += diff.numel();
  }
  auto m = torch::tensor({e.max_abs_diff, e.max_bound, e.max_ratio}, torch::kFloat64);
  g.allreduce(m, ReduceOp::Max);
  e.max_abs_diff = m[0].item<double>();
  e.max_bound = m[1].item<double>();
  e.max_ratio = m[2].item<double>();
  return e;
}

}  // namespace mpt::dist
