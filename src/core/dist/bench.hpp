// core/dist, benchmarks of collectives: the definitions nccl-tests uses (NVIDIA/nccl-tests,
// src/common.cu, src/<op>.cu, doc/PERFORMANCE.md), so that `mpt collectives` prints numbers
// that read like all_reduce_perf's, and the data it sends is verifiable element by element.
//
//   size     bytes of the larger of the send and the receive buffer (nccl-tests prints
//            max(sendBytes, recvBytes)); all-gather, reduce-scatter and all-to-all split it
//            into `nranks` chunks of `count` elements (count = size / elem / nranks)
//   algbw    size / time                                            (GB/s, 1 GB = 1e9 bytes)
//   busbw    algbw · factor(op, n): 2(n−1)/n all-reduce; (n−1)/n all-gather, reduce-scatter,
//            all-to-all; 1 broadcast and send/recv — the bandwidth each rank's link must carry,
//            comparable with the hardware's peak whatever the number of ranks
//   #wrong   elements of the received buffers (summed over the ranks) that differ from the
//            value every rank can compute for them: inputs are small non-negative integers,
//            so every partial sum is exact in the dtype and the comparison is exact (nccl-tests'
//            "verifiable" inputs are crafted for the same reason)
//
// Everything here is pure except run_collective, which calls a dist::Group.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/dist/group.hpp"

namespace mpt::dist {

/// The collectives nccl-tests measures, one benchmark binary each (all_reduce_perf, ...).
enum class Coll { AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll, SendRecv };

/// nccl-tests' names, in this order: "all_reduce", "all_gather", "reduce_scatter",
/// "broadcast", "alltoall", "sendrecv" (the binaries' names without "_perf").
const std::vector<std::string>& coll_names();
/// The name of `op` (one of coll_names()).
std::string coll_name(Coll op);
/// The operation named `name` (one of coll_names()); throws std::invalid_argument otherwise.
Coll coll_from_name(const std::string& name);
/// Whether `op` combines values (all-reduce, reduce-scatter): its rows have a redop.
bool coll_reduces(Coll op);
/// Whether `op` has a root rank (broadcast).
bool coll_has_root(Coll op);
/// Whether c10d runs `op` in place (all_reduce and broadcast work on one tensor, as
/// torch.distributed.all_reduce / broadcast do); the others have a send and a receive buffer.
bool coll_in_place(Coll op);
/// The fewest ranks `op` runs on: 2 for sendrecv (a rank sends to the next one, not to
/// itself), 1 for the others.
int coll_min_ranks(Coll op);

/// Element counts of one measurement of `op` at a nominal `bytes` (nccl-tests'
/// <Op>GetCollByteCount after setupArgs: count = bytes / elem_bytes elements, split into
/// `nranks` chunks for all-gather, reduce-scatter and all-to-all).
struct CollCounts {
  int64_t count = 0;       ///< the "count" column: elements per rank and chunk (nccl-tests' paramcount)
  int64_t send_count = 0;  ///< elements of each rank's send buffer
  int64_t recv_count = 0;  ///< elements of each rank's receive buffer
  int64_t size_bytes = 0;  ///< the "size" column: max(send_count, recv_count) · elem_bytes
};
/// Counts of `op` at `bytes` for elements of `elem_bytes` on `nranks` ranks:
///   all_reduce, broadcast, sendrecv: count = send = recv = ⌊bytes / elem⌋;
///   all_gather:     count = ⌊bytes / elem / n⌋, send = count, recv = n · count;
///   reduce_scatter: count = ⌊bytes / elem / n⌋, send = n · count, recv = count;
///   alltoall:       count = ⌊bytes / elem / n⌋, send = recv = n · count.
/// nccl-tests also rounds the per-rank count down to a multiple of 16 bytes (for its vector
/// loads); mpt does not (so sizes below 16·n bytes still run). count 0 means the size holds
/// less than one element per chunk: nothing to measure. Throws std::invalid_argument for
/// bytes < 0, elem_bytes < 1 or nranks < 1.
CollCounts coll_counts(Coll op, int64_t bytes, int64_t elem_bytes, int nranks);

/// nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md): 2(n−1)/n for all-reduce (every
/// element crosses 2(n−1) links among n), (n−1)/n for all-gather, reduce-scatter and
/// all-to-all (half of an all-reduce), 1 for broadcast and sendrecv (everything leaves one
/// rank). n = 1 gives 0 for the first four (no traffic). Throws std::invalid_argument for n < 1.
double busbw_factor(Coll op, int nranks);
/// Algorithm bandwidth in GB/s (1e9 bytes per second, as nccl-tests): size_bytes / seconds;
/// 0 when seconds <= 0.
double algbw_gbps(int64_t size_bytes, double seconds);

/// The message sizes of a run: min_bytes, min_bytes · f, min_bytes · f², ... while <= max_bytes
/// (nccl-tests' -b, -e, -f). Throws std::invalid_argument for min_bytes < 1, min_bytes >
/// max_bytes or step_factor < 2.
std::vector<int64_t> size_schedule(int64_t min_bytes, int64_t max_bytes, int64_t step_factor);

// ----------------------------------------------------------------------------
// Verifiable data
// ----------------------------------------------------------------------------

/// The largest E such that every integer 0 .. E is exact in `dtype`: 2^24 float32, 2^53
/// float64, 2^11 float16, 2^8 bfloat16 (the significand's bits + 1). Throws
/// std::invalid_argument for other dtypes.
int64_t exact_integer_limit(torch::ScalarType dtype);

/// The values rank r contributes at global element index i:
///   v(r, i) = ((7·i + 3·rep) mod a_mod) + (r mod b_mod)
/// Small non-negative integers: with n ranks every partial sum is at most
/// n · (a_mod − 1 + b_mod − 1) <= E (exact_integer_limit), so all-reduce and reduce-scatter
/// results are exact in any summation order, and min/max trivially so. The rank term tells
/// the ranks' data apart (all-gather, all-to-all, sendrecv), the index term the elements
/// (a chunk in the wrong place shows); `rep` changes the data between runs.
struct BenchPattern {
  int64_t a_mod = 1;  ///< period of the index term (>= 1)
  int64_t b_mod = 1;  ///< period of the rank term (>= 1)
  int64_t rep = 0;    ///< which run's data (nccl-tests' rep)
};
/// The pattern for `nranks` ranks in `dtype`: per-rank values up to vmax = min(E, 2^24) / n
/// (E from exact_integer_limit; 2^24 keeps every sum within int32), the rank term
/// b_mod = min(n, max(1, vmax / 2)), the index term a_mod = vmax − b_mod + 1. Throws
/// std::invalid_argument for nranks < 1 or more ranks than E.
BenchPattern bench_pattern(torch::ScalarType dtype, int nranks, int64_t rep);

/// v(rank, i) for i = offset .. offset + count − 1 (a 1-D tensor of `opts`' dtype and device).
torch::Tensor pattern_values(const BenchPattern& p, int rank, int64_t offset, int64_t count,
                             const torch::TensorOptions& opts);
/// The reduction over ranks 0 .. nranks − 1 of v(r, i), i = offset .. offset + count − 1, in
/// closed form: Sum = n · a(i) + Σ_r b(r); Min / Max = a(i) + min / max_r b(r).
torch::Tensor pattern_reduced(const BenchPattern& p, ReduceOp op, int nranks, int64_t offset, int64_t count,
                              const torch::TensorOptions& opts);

/// Rank `rank`'s send buffer for `op` (send_count elements): v(rank, 0 .. send_count − 1);
/// for broadcast only the root's holds data, the others' buffer (overwritten by the
/// broadcast) is filled with kUnwritten, so a broadcast that does nothing is caught.
torch::Tensor coll_send_values(Coll op, const BenchPattern& p, int rank, int nranks, int root, const CollCounts& c,
                               const torch::TensorOptions& opts);
/// What rank `rank` must hold after `op` (recv_count elements), for send buffers filled by
/// coll_send_values (nccl-tests' <Op>InitData "expected"):
///   all_reduce:     red_r v(r, i)
///   all_gather:     chunk j = v(j, 0 .. count − 1)
///   reduce_scatter: red_r v(r, rank·count + i)
///   broadcast:      v(root, i)
///   alltoall:       chunk j = v(j, rank·count + i)          (rank j's chunk number `rank`)
///   sendrecv:       v((rank − 1) mod n, i)                 (ring: received from the previous rank)
torch::Tensor coll_expected(Coll op, const BenchPattern& p, ReduceOp redop, int rank, int nranks, int root,
                            const CollCounts& c, const torch::TensorOptions& opts);
/// What receive buffers hold before a verified run (nccl-tests memsets them to 0): −1 is no
/// v(r, i) and no reduction of them, so an element the collective never wrote counts as wrong.
inline constexpr double kUnwritten = -1.0;
/// Elements of `got` that differ from `expected` (exact comparison; NaN counts as wrong).
/// Throws std::invalid_argument when the shapes differ.
int64_t count_wrong(const torch::Tensor& got, const torch::Tensor& expected);
/// count_wrong(recv, coll_expected(...)) computed chunk by chunk, without the whole expected
/// buffer (less memory and time at large sizes). Throws std::invalid_argument when `recv` does
/// not have c.recv_count elements.
int64_t coll_count_wrong(Coll op, const BenchPattern& p, ReduceOp redop, int rank, int nranks, int root,
                         const CollCounts& c, const torch::Tensor& recv);
/// A value that makes the element it replaces wrong whatever the other ranks send: −1 for
/// min (below every v), E for sum and max (above every sum of v), −1 for the rest.
double corrupting_value(Coll op, ReduceOp redop, torch::ScalarType dtype);

/// Runs `op` once on `g` and waits for it (nccl-tests' <Op>RunColl): all_reduce and broadcast
/// in place on `recv` (`send` unused); all_gather(send → recv), reduce_scatter(send → recv),
/// alltoall(send → recv); sendrecv: send `send` to rank + 1 and receive `recv` from rank − 1
/// (even ranks post the send first, odd ranks the receive, so that NCCL's in-order streams
/// pair them up), tag 0. Throws what the Group's calls throw (RuntimeFailure when a peer
/// fails or times out).
void run_collective(Group& g, Coll op, const torch::Tensor& send, torch::Tensor& recv, ReduceOp redop, int root);

}  // namespace mpt::dist
