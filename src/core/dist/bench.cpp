// Definitions of nccl-tests' measurements and verifiable data. See bench.hpp.
#include "core/dist/bench.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace mpt::dist {

// ----------------------------------------------------------------------------
// Operations
// ----------------------------------------------------------------------------

const std::vector<std::string>& coll_names() {
  static const std::vector<std::string> names{"all_reduce", "all_gather", "reduce_scatter",
                                              "broadcast",  "alltoall",   "sendrecv"};
  return names;
}

std::string coll_name(Coll op) { return coll_names()[static_cast<std::size_t>(op)]; }

Coll coll_from_name(const std::string& name) {
  const auto& names = coll_names();
  auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) throw std::invalid_argument("unknown collective '" + name + "'");
  return static_cast<Coll>(it - names.begin());
}

bool coll_reduces(Coll op) { return op == Coll::AllReduce || op == Coll::ReduceScatter; }
bool coll_has_root(Coll op) { return op == Coll::Broadcast; }
bool coll_in_place(Coll op) { return op == Coll::AllReduce || op == Coll::Broadcast; }
int coll_min_ranks(Coll op) { return op == Coll::SendRecv ? 2 : 1; }

CollCounts coll_counts(Coll op, int64_t bytes, int64_t elem_bytes, int nranks) {
  if (bytes < 0 || elem_bytes < 1 || nranks < 1)
    throw std::invalid_argument(fmt::format("coll_counts: expected bytes >= 0, elem_bytes >= 1, nranks >= 1, got {}, "
                                            "{}, {}", bytes, elem_bytes, nranks));
  const int64_t total = bytes / elem_bytes, n = nranks;
  CollCounts c;
  switch (op) {
    case Coll::AllReduce:
    case Coll::Broadcast:
    case Coll::SendRecv: c.count = c.send_count = c.recv_count = total; break;
    case Coll::AllGather:
      c.count = total / n;
      c.send_count = c.count;
      c.recv_count = n * c.count;
      break;
    case Coll::ReduceScatter:
      c.count = total / n;
      c.send_count = n * c.count;
      c.recv_count = c.count;
      break;
    case Coll::AllToAll:
      c.count = total / n;
      c.send_count = c.recv_count = n * c.count;
      break;
  }
  c.size_bytes = std::max(c.send_count, c.recv_count) * elem_bytes;
  return c;
}

double busbw_factor(Coll op, int nranks) {
  if (nranks < 1) throw std::invalid_argument(fmt::format("busbw_factor: expected nranks >= 1, got {}", nranks));
  const double n = nranks;
  switch (op) {
    case Coll::AllReduce: return 2.0 * (n - 1) / n;
    case Coll::AllGather:
    case Coll::ReduceScatter:
    case Coll::AllToAll: return (n - 1) / n;
    case Coll::Broadcast:
    case Coll::SendRecv: return 1.0;
  }
  return 1.0;
}

double algbw_gbps(int64_t size_bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(size_bytes) / 1e9 / seconds : 0.0;
}

std::vector<int64_t> size_schedule(int64_t min_bytes, int64_t max_bytes, int64_t step_factor) {
  if (min_bytes < 1 || min_bytes > max_bytes || step_factor < 2)
    throw std::invalid_argument(fmt::format("size_schedule: expected 1 <= min_bytes <= max_bytes and step_factor >= 2, "
                                            "got {}, {}, {}", min_bytes, max_bytes, step_factor));
  std::vector<int64_t> sizes;
  for (int64_t s = min_bytes;; s *= step_factor) {
    sizes.push_back(s);
    if (s > max_bytes / step_factor) break;  // the next one would pass max_bytes (or overflow)
  }
  return sizes;
}

// ----------------------------------------------------------------------------
// Verifiable data
// ----------------------------------------------------------------------------

int64_t exact_integer_limit(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32: return int64_t{1} << 24;
    case torch::kFloat64: return int64_t{1} << 53;
    case torch::kFloat16: return int64_t{1} << 11;
    case torch::kBFloat16: return int64_t{1} << 8;
    default: throw std::invalid_argument(fmt::format("exact_integer_limit: unsupported dtype {}", c10::toString(dtype)));
  }
}

BenchPattern bench_pattern(torch::ScalarType dtype, int nranks, int64_t rep) {
  const int64_t e = exact_integer_limit(dtype);
  if (nranks < 1 || nranks > e)
    throw std::invalid_argument(fmt::format("bench_pattern: expected 1 .. {} ranks for {}, got {}", e,
                                            c10::toString(dtype), nranks));
  const int64_t vmax = std::min<int64_t>(e, int64_t{1} << 24) / nranks;  // n · vmax <= E, and < 2^31
  BenchPattern p;
  p.b_mod = std::min<int64_t>(nranks, std::max<int64_t>(1, vmax / 2));
  p.a_mod = vmax - p.b_mod + 1;  // (a_mod − 1) + (b_mod − 1) = vmax − 1
  p.rep = rep;
  return p;
}

namespace {

// a(i) = (7·i + 3·rep) mod a_mod for i = offset .. offset + count − 1: int32 while 7·i + 3·rep
// fits (half the memory traffic of int64; values and their sums over the ranks stay below
// 2^31 by bench_pattern's cap), int64 beyond (i < 2^40 for any buffer mpt can hold).
torch::Tensor index_term(const BenchPattern& p, int64_t offset, int64_t count, torch::Device device) {
  const int64_t shift = (3 * p.rep) % p.a_mod;
  const bool narrow = 7 * (offset + count) + shift < (int64_t{1} << 31) - 1;
  auto i = torch::arange(offset, offset + count,
                         torch::TensorOptions().dtype(narrow ? torch::kInt32 : torch::kInt64).device(device));
  i.mul_(7).add_(shift).remainder_(p.a_mod);
  return narrow ? i : i.to(torch::kInt32);  // a < a_mod < 2^31
}

int64_t rank_term(const BenchPattern& p, int rank) { return rank % p.b_mod; }

}  // namespace

torch::Tensor pattern_values(const BenchPattern& p, int rank, int64_t offset, int64_t count,
                             const torch::TensorOptions& opts) {
  return index_term(p, offset, count, opts.device()).add_(rank_term(p, rank)).to(opts.dtype());
}

torch::Tensor pattern_reduced(const BenchPattern& p, ReduceOp op, int nranks, int64_t offset, int64_t count,
                              const torch::TensorOptions& opts) {
  auto a = index_term(p, offset, count, opts.device());
  int64_t sum = 0, lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (int r = 0; r < nranks; ++r) {
    const int64_t b = rank_term(p, r);
    sum += b;
    lo = std::min(lo, b);
    hi = std::max(hi, b);
  }
  switch (op) {
    case ReduceOp::Sum: a.mul_(nranks).add_(sum); break;
    case ReduceOp::Min: a.add_(lo); break;
    case ReduceOp::Max: a.add_(hi); break;
  }
  return a.to(opts.dtype());
}

torch::Tensor coll_send_values(Coll op, const BenchPattern& p, int rank, int /*nranks*/, int root, const CollCounts& c,
                               const torch::TensorOptions& opts) {
  if (op == Coll::Broadcast && rank != root) return torch::full({c.send_count}, kUnwritten, opts);
  return pattern_values(p, rank, 0, c.send_count, opts);
}

torch::Tensor coll_expected(Coll op, const BenchPattern& p, ReduceOp redop, int rank, int nranks, int root,
                            const CollCounts& c, const torch::TensorOptions& opts) {
  const int64_t k = c.count;
  auto chunks = [&](auto&& chunk_of) {
    std::vector<torch::Tensor> parts;
    for (int j = 0; j < nranks; ++j) parts.push_back(chunk_of(j));
    return torch::cat(parts);
  };
  switch (op) {
    case Coll::AllReduce: return pattern_reduced(p, redop, nranks, 0, c.recv_count, opts);
    case Coll::AllGather: return chunks([&](int j) { return pattern_values(p, j, 0, k, opts); });
    case Coll::ReduceScatter: return pattern_reduced(p, redop, nranks, rank * k, k, opts);
    case Coll::Broadcast: return pattern_values(p, root, 0, c.recv_count, opts);
    case Coll::AllToAll: return chunks([&](int j) { return pattern_values(p, j, rank * k, k, opts); });
    case Coll::SendRecv: return pattern_values(p, (rank - 1 + nranks) % nranks, 0, c.recv_count, opts);
  }
  throw std::logic_error("coll_expected: unknown operation");
}

int64_t count_wrong(const torch::Tensor& got, const torch::Tensor& expected) {
  if (got.sizes() != expected.sizes())
    throw std::invalid_argument(fmt::format("count_wrong: shapes differ: {} vs {}", c10::str(got.sizes()),
                                            c10::str(expected.sizes())));
  return got.ne(expected).sum().item<int64_t>();  // NaN != anything: counted
}

int64_t coll_count_wrong(Coll op, const BenchPattern& p, ReduceOp redop, int rank, int nranks, int root,
                         const CollCounts& c, const torch::Tensor& recv) {
  if (recv.numel() != c.recv_count)
    throw std::invalid_argument(fmt::format("coll_count_wrong: expected {} received elements, got {}", c.recv_count,
                                            recv.numel()));
  const auto opts = recv.options();
  const int64_t k = c.count;
  int64_t wrong = 0;
  switch (op) {
    case Coll::AllGather:
      for (int j = 0; j < nranks; ++j) wrong += count_wrong(recv.narrow(0, j * k, k), pattern_values(p, j, 0, k, opts));
      return wrong;
    case Coll::AllToAll:
      for (int j = 0; j < nranks; ++j)
        wrong += count_wrong(recv.narrow(0, j * k, k), pattern_values(p, j, rank * k, k, opts));
      return wrong;
    default: return count_wrong(recv, coll_expected(op, p, redop, rank, nranks, root, c, opts));
  }
}

double corrupting_value(Coll op, ReduceOp redop, torch::ScalarType dtype) {
  if (!coll_reduces(op) || redop == ReduceOp::Min) return -1.0;
  return static_cast<double>(exact_integer_limit(dtype));
}

void run_collective(Group& g, Coll op, const torch::Tensor& send, torch::Tensor& recv, ReduceOp redop, int root) {
  switch (op) {
    case Coll::AllReduce: g.allreduce(recv, redop); return;
    case Coll::Broadcast: g.broadcast(recv, root); return;
    case Coll::AllGather: g.all_gather(send, recv); return;
    case Coll::ReduceScatter: g.reduce_scatter(send, recv, redop); return;
    case Coll::AllToAll: g.all_to_all(send, recv); return;
    case Coll::SendRecv: {
      const int n = g.size(), me = g.rank(), next = (me + 1) % n, prev = (me - 1 + n) % n;
      Work s, r;
      if (me % 2 == 0) {
        s = g.send_async(send, next, 0);
        r = g.recv_async(recv, prev, 0);
      } else {
        r = g.recv_async(recv, prev, 0);
        s = g.send_async(send, next, 0);
      }
      s.wait();
      r.wait();
      return;
    }
  }
}

}  // namespace mpt::dist
