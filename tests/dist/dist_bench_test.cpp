// Unit tests of core/dist/bench: nccl-tests' counts, bus-bandwidth factors and size schedule,
// the verifiable data (exact in every dtype, expected values equal a reference computation of
// each collective), and run_collective on two Gloo ranks played by two threads.
#include <functional>
#include <thread>

#include <fmt/format.h>

#include "catch.hpp"
#include "dist/two_ranks.hpp"
#include "core/runtime/compat.hpp"
#include "core/dist/dist.hpp"
#include "core/dist/bench.hpp"

using namespace mpt;
using mpt::testing::on_two_ranks;
using dist::Coll;

namespace {
const std::vector<Coll> kAll{Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter,
                             Coll::Broadcast, Coll::AllToAll,  Coll::SendRecv};
const std::vector<torch::ScalarType> kTypes{torch::kFloat32, torch::kFloat64, torch::kFloat16, torch::kBFloat16};
}  // namespace

TEST_CASE("busbw_factor: nccl-tests' PERFORMANCE.md factors", "[dist_bench]") {
  CHECK(dist::busbw_factor(Coll::AllReduce, 2) == 1.0);
  CHECK(dist::busbw_factor(Coll::AllReduce, 4) == 1.5);
  CHECK(dist::busbw_factor(Coll::AllReduce, 8) == 1.75);
  for (Coll op : {Coll::AllGather, Coll::ReduceScatter, Coll::AllToAll}) {
    CHECK(dist::busbw_factor(op, 2) == 0.5);
    CHECK(dist::busbw_factor(op, 4) == 0.75);
  }
  for (Coll op : {Coll::Broadcast, Coll::SendRecv}) CHECK(dist::busbw_factor(op, 4) == 1.0);
  // One rank: no link carries anything for the collectives that move data between ranks.
  CHECK(dist::busbw_factor(Coll::AllReduce, 1) == 0.0);
  CHECK(dist::busbw_factor(Coll::AllGather, 1) == 0.0);
  CHECK_THROWS_AS(dist::busbw_factor(Coll::AllReduce, 0), std::invalid_argument);
  CHECK(dist::algbw_gbps(2'000'000'000, 2.0) == 1.0);
  CHECK(dist::algbw_gbps(100, 0.0) == 0.0);
}

TEST_CASE("coll_counts: size is the larger buffer, count is per rank for the chunked operations", "[dist_bench]") {
  // 64 bytes of float32 on 4 ranks: 16 elements.
  auto ar = dist::coll_counts(Coll::AllReduce, 64, 4, 4);
  CHECK((ar.count == 16 && ar.send_count == 16 && ar.recv_count == 16 && ar.size_bytes == 64));
  auto ag = dist::coll_counts(Coll::AllGather, 64, 4, 4);
  CHECK((ag.count == 4 && ag.send_count == 4 && ag.recv_count == 16 && ag.size_bytes == 64));
  auto rs = dist::coll_counts(Coll::ReduceScatter, 64, 4, 4);
  CHECK((rs.count == 4 && rs.send_count == 16 && rs.recv_count == 4 && rs.size_bytes == 64));
  auto aa = dist::coll_counts(Coll::AllToAll, 64, 4, 4);
  CHECK((aa.count == 4 && aa.send_count == 16 && aa.recv_count == 16 && aa.size_bytes == 64));
  for (Coll op : {Coll::Broadcast, Coll::SendRecv}) {
    auto c = dist::coll_counts(op, 64, 4, 4);
    CHECK((c.count == 16 && c.send_count == 16 && c.recv_count == 16 && c.size_bytes == 64));
  }
  // Not divisible: 100 bytes = 25 floats on 3 ranks -> 8 per rank, size 96 bytes.
  auto odd = dist::coll_counts(Coll::AllGather, 100, 4, 3);
  CHECK((odd.count == 8 && odd.recv_count == 24 && odd.size_bytes == 96));
  // Less than one element per rank: nothing to measure.
  CHECK(dist::coll_counts(Coll::AllGather, 8, 4, 4).count == 0);
  CHECK(dist::coll_counts(Coll::AllReduce, 2, 4, 4).count == 0);
  CHECK_THROWS_AS(dist::coll_counts(Coll::AllReduce, 8, 0, 2), std::invalid_argument);
  CHECK_THROWS_AS(dist::coll_counts(Coll::AllReduce, 8, 4, 0), std::invalid_argument);
}

TEST_CASE("size_schedule: min, min*f, ... up to max, as nccl-tests -b -e -f", "[dist_bench]") {
  auto s2 = dist::size_schedule(8, 64 << 20, 2);
  REQUIRE(s2.size() == 24);  // 2^3 .. 2^26
  CHECK(s2.front() == 8);
  CHECK(s2.back() == 64 << 20);
  for (std::size_t i = 1; i < s2.size(); ++i) CHECK(s2[i] == 2 * s2[i - 1]);
  auto s4 = dist::size_schedule(8, 64 << 20, 4);
  REQUIRE(s4.size() == 12);  // 2^3, 2^5, .. 2^25: the next, 2^27, passes max
  CHECK(s4.back() == 32 << 20);
  CHECK(dist::size_schedule(5, 5, 2) == std::vector<int64_t>{5});
  CHECK(dist::size_schedule(3, 10, 3) == std::vector<int64_t>{3, 9});
  // Near int64's limit the next step would overflow: it stops instead.
  CHECK(dist::size_schedule(int64_t{1} << 61, std::numeric_limits<int64_t>::max(), 2).size() == 2);
  CHECK_THROWS_AS(dist::size_schedule(16, 8, 2), std::invalid_argument);
  CHECK_THROWS_AS(dist::size_schedule(8, 16, 1), std::invalid_argument);
  CHECK_THROWS_AS(dist::size_schedule(0, 16, 2), std::invalid_argument);
  CHECK(dist::coll_from_name("alltoall") == Coll::AllToAll);
  for (Coll op : kAll) CHECK(dist::coll_from_name(dist::coll_name(op)) == op);
  CHECK_THROWS_AS(dist::coll_from_name("allreduce"), std::invalid_argument);
}

TEST_CASE("bench_pattern: every sum of n inputs is an exact integer of the dtype", "[dist_bench]") {
  CHECK(dist::exact_integer_limit(torch::kFloat32) == 1 << 24);
  CHECK(dist::exact_integer_limit(torch::kFloat16) == 2048);
  CHECK(dist::exact_integer_limit(torch::kBFloat16) == 256);
  CHECK_THROWS_AS(dist::exact_integer_limit(torch::kInt32), std::invalid_argument);
  // The limit is the last exact integer: E + 1 rounds away in the dtype.
  for (auto t : {torch::kFloat16, torch::kBFloat16}) {
    const double e = static_cast<double>(dist::exact_integer_limit(t));
    CHECK(torch::tensor({e}).to(t).item<double>() == e);
    CHECK(torch::tensor({e + 1}).to(t).item<double>() != e + 1);
  }
  for (auto t : kTypes)
    for (int n : {1, 2, 3, 8, 64}) {
      INFO(c10::toString(t) << " n=" << n);
      const auto p = dist::bench_pattern(t, n, /*rep=*/5);
      CHECK(n * (p.a_mod - 1 + p.b_mod - 1) <= dist::exact_integer_limit(t));
      CHECK(p.a_mod >= 2);
      if (n >= 2) CHECK(p.b_mod >= 2);  // the ranks' data differ
      // Sum the ranks' values in the dtype itself, forwards and backwards: both equal the
      // closed form exactly (every partial sum is an exact integer).
      const int64_t count = 3000;
      const auto opts = torch::TensorOptions().dtype(t);
      auto fwd = dist::pattern_values(p, 0, 100, count, opts), bwd = dist::pattern_values(p, n - 1, 100, count, opts);
      for (int r = 1; r < n; ++r) {
        fwd = fwd + dist::pattern_values(p, r, 100, count, opts);
        bwd = bwd + dist::pattern_values(p, n - 1 - r, 100, count, opts);
      }
      const auto want = dist::pattern_reduced(p, dist::ReduceOp::Sum, n, 100, count, opts);
      CHECK(dist::count_wrong(fwd, want) == 0);
      CHECK(dist::count_wrong(bwd, want) == 0);
      CHECK(want.to(torch::kFloat64).max().item<double>() <= dist::exact_integer_limit(t));
    }
  CHECK_THROWS_AS(dist::bench_pattern(torch::kBFloat16, 257, 0), std::invalid_argument);
}

namespace {

// Every rank's send buffer for `op`, and what each rank receives, computed from the
// definitions of the collectives with plain tensor operations (a reference, not the Group).
std::vector<torch::Tensor> reference_results(Coll op, const std::vector<torch::Tensor>& send, dist::ReduceOp redop,
                                             int root, const dist::CollCounts& c) {
  const int n = static_cast<int>(send.size());
  auto reduce = [&](const std::vector<torch::Tensor>& xs) {
    auto s = torch::stack(xs).to(torch::kFloat64);
    auto r = redop == dist::ReduceOp::Sum ? s.sum(0) : redop == dist::ReduceOp::Min ? std::get<0>(s.min(0))
                                                                                     : std::get<0>(s.max(0));
    return r.to(send[0].scalar_type());
  };
  std::vector<torch::Tensor> out;
  for (int me = 0; me < n; ++me) {
    std::vector<torch::Tensor> parts;
    switch (op) {
      case Coll::AllReduce: out.push_back(reduce(send)); break;
      case Coll::AllGather: out.push_back(torch::cat(send)); break;
      case Coll::ReduceScatter: out.push_back(reduce(send).narrow(0, me * c.count, c.count)); break;
      case Coll::Broadcast: out.push_back(send[static_cast<std::size_t>(root)]); break;
      case Coll::AllToAll:
        for (int j = 0; j < n; ++j) parts.push_back(send[static_cast<std::size_t>(j)].narrow(0, me * c.count, c.count));
        out.push_back(torch::cat(parts));
        break;
      case Coll::SendRecv: out.push_back(send[static_cast<std::size_t>((me + n - 1) % n)]); break;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("coll_expected equals each collective computed from the send buffers, corruption is caught",
          "[dist_bench]") {
  for (auto t : kTypes)
    for (int n : {1, 2, 3, 4})
      for (Coll op : kAll)
        for (auto redop : {dist::ReduceOp::Sum, dist::ReduceOp::Min, dist::ReduceOp::Max}) {
          if (n < dist::coll_min_ranks(op) || (!dist::coll_reduces(op) && redop != dist::ReduceOp::Sum)) continue;
          INFO(dist::coll_name(op) << " " << c10::toString(t) << " n=" << n << " redop=" << static_cast<int>(redop));
          const auto opts = torch::TensorOptions().dtype(t);
          const auto c = dist::coll_counts(op, 1000, static_cast<int64_t>(c10::elementSize(t)), n);
          const int root = n - 1;
          const auto p = dist::bench_pattern(t, n, /*rep=*/3);
          std::vector<torch::Tensor> send;
          for (int r = 0; r < n; ++r) send.push_back(dist::coll_send_values(op, p, r, n, root, c, opts));
          if (op == Coll::Broadcast && n > 1)  // only the root's buffer holds data
            CHECK(dist::count_wrong(send[0], torch::full({c.send_count}, dist::kUnwritten, opts)) == 0);
          auto got = reference_results(op, send, redop, root, c);
          for (int r = 0; r < n; ++r) {
            const auto want = dist::coll_expected(op, p, redop, r, n, root, c, opts);
            CHECK(want.numel() == c.recv_count);
            CHECK(dist::count_wrong(got[static_cast<std::size_t>(r)], want) == 0);
            // A receive buffer the collective never wrote is wrong everywhere.
            CHECK(dist::count_wrong(torch::full({c.recv_count}, dist::kUnwritten, opts), want) == c.recv_count);
          }
          // The rank that sends data corrupts its first element: some rank must see it.
          const int bad = op == Coll::Broadcast ? root : 0;
          send[static_cast<std::size_t>(bad)] = send[static_cast<std::size_t>(bad)].clone();
          send[static_cast<std::size_t>(bad)].index_put_({0}, dist::corrupting_value(op, redop, t));
          got = reference_results(op, send, redop, root, c);
          int64_t wrong = 0;
          for (int r = 0; r < n; ++r)
            wrong += dist::count_wrong(got[static_cast<std::size_t>(r)], dist::coll_expected(op, p, redop, r, n, root, c, opts));
          CHECK(wrong >= 1);
        }
}

TEST_CASE("count_wrong: exact comparison, NaN is wrong, shapes must agree", "[dist_bench]") {
  auto a = torch::tensor({1.0f, 2.0f, 3.0f});
  CHECK(dist::count_wrong(a, a.clone()) == 0);
  CHECK(dist::count_wrong(torch::tensor({1.0f, 2.0000002f, NAN}), a) == 2);
  CHECK(dist::count_wrong(torch::tensor({NAN}), torch::tensor({NAN})) == 1);
  CHECK_THROWS_AS(dist::count_wrong(a, torch::zeros({2})), std::invalid_argument);
}


TEST_CASE("run_collective on two Gloo ranks delivers what coll_expected says, in every dtype Gloo has", "[dist_bench]") {
  // wrong[type][op][rank]; -1 = not run
  std::vector<std::vector<std::vector<int64_t>>> wrong(kTypes.size(),
                                                       std::vector<std::vector<int64_t>>(kAll.size(), {-1, -1}));
  const auto errors = on_two_ranks("bench_pair/", [&](dist::Group& g, int r) {
    for (std::size_t ti = 0; ti < kTypes.size(); ++ti)
      for (std::size_t oi = 0; oi < kAll.size(); ++oi) {
        if (kTypes[ti] == torch::kBFloat16 && !compat::kGlooHasBFloat16) continue;  // LibTorch 1.13's Gloo
        const Coll op = kAll[oi];
        const auto opts = torch::TensorOptions().dtype(kTypes[ti]);
        const auto c = dist::coll_counts(op, 4096, static_cast<int64_t>(c10::elementSize(kTypes[ti])), 2);
        const auto p = dist::bench_pattern(kTypes[ti], 2, static_cast<int64_t>(oi));
        auto send = dist::coll_send_values(op, p, r, 2, /*root=*/1, c, opts);
        torch::Tensor recv = dist::coll_in_place(op) ? send : torch::full({c.recv_count}, dist::kUnwritten, opts);
        dist::run_collective(g, op, send, recv, dist::ReduceOp::Sum, /*root=*/1);
        wrong[ti][oi][static_cast<std::size_t>(r)] =
            dist::count_wrong(recv, dist::coll_expected(op, p, dist::ReduceOp::Sum, r, 2, 1, c, opts));
      }
  });
  REQUIRE(errors == std::vector<std::string>{"", ""});
  for (std::size_t ti = 0; ti < kTypes.size(); ++ti)
    for (std::size_t oi = 0; oi < kAll.size(); ++oi) {
      INFO(dist::coll_name(kAll[oi]) << " " << c10::toString(kTypes[ti]));
      if (kTypes[ti] == torch::kBFloat16 && !compat::kGlooHasBFloat16) continue;
      CHECK(wrong[ti][oi] == std::vector<int64_t>{0, 0});
    }
}
