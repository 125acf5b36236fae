// Unit tests of core/parallel/mesh: rank → coordinates → groups of a few mesh shapes in
// Megatron-LM's order (tp fastest), the groups every rank builds in one order, bad degrees.
#include <stdexcept>
#include <vector>

#include "catch.hpp"
#include "core/parallel/mesh.hpp"

using namespace mpt;

TEST_CASE("MeshLayout: ranks as Megatron's tp-dp-pp order (tp fastest), the TP, DP and PP groups of a 2x2x2 mesh",
          "[mesh]") {
  const MeshLayout m(/*dp=*/2, /*tp=*/2, /*pp=*/2);
  REQUIRE(m.size() == 8);
  // torch: init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp")) = arange(8).view(2, 2, 2);
  // Megatron's initialize_model_parallel(tp=2, pp=2) on 8 ranks: TP groups [0,1] [2,3] [4,5] [6,7],
  // DP groups [0,2] [1,3] [4,6] [5,7], PP groups [0,4] [1,5] [2,6] [3,7].
  CHECK(m.rank_of(0, 0, 1) == 1);
  CHECK(m.rank_of(0, 1, 0) == 2);
  CHECK(m.rank_of(1, 0, 0) == 4);
  CHECK(m.rank_of(1, 1, 1) == 7);
  CHECK(m.tp_group(1, 0) == std::vector<int>{4, 5});
  CHECK(m.dp_group(0, 1) == std::vector<int>{1, 3});
  CHECK(m.dp_group(1, 0) == std::vector<int>{4, 6});
  CHECK(m.pp_group(1, 1) == std::vector<int>{3, 7});
  for (int r = 0; r < 8; ++r) {
    const auto c = m.coord(r);
    CHECK(m.rank_of(c.pp, c.dp, c.tp) == r);
  }
  // Uneven degrees: dp 1 x tp 2 x pp 3 — the PP group of tp-rank 1 is every other rank.
  const MeshLayout u(1, 2, 3);
  CHECK(u.pp_group(0, 1) == std::vector<int>{1, 3, 5});
  CHECK(u.coord(5).pp == 2);
  CHECK_THROWS_AS(u.rank_of(3, 0, 0), std::out_of_range);
  CHECK_THROWS_AS(u.coord(6), std::out_of_range);
}

TEST_CASE("MeshLayout::groups: every group of an axis once, in the order every rank builds them", "[mesh]") {
  const MeshLayout m(/*dp=*/2, /*tp=*/2, /*pp=*/2);
  const auto tp = m.groups("tp"), dp = m.groups("dp"), pp = m.groups("pp");
  REQUIRE(tp.size() == 4);
  REQUIRE(dp.size() == 4);
  REQUIRE(pp.size() == 4);
  CHECK(tp[0].name == "mesh/tp/pp0dp0/");
  CHECK(tp[3].ranks == std::vector<int>{6, 7});
  CHECK(dp[1].name == "mesh/dp/pp0tp1/");
  CHECK(dp[1].ranks == std::vector<int>{1, 3});
  CHECK(pp[2].name == "mesh/pp/dp1tp0/");
  CHECK(pp[2].ranks == std::vector<int>{2, 6});
  // Every rank is in exactly one group of each axis, and its own coordinates pick that group.
  for (const auto* axis : {&tp, &dp, &pp}) {
    std::vector<int> seen(8, 0);
    for (const auto& g : *axis)
      for (int r : g.ranks) ++seen[static_cast<std::size_t>(r)];
    CHECK(seen == std::vector<int>(8, 1));
  }
  for (int r = 0; r < 8; ++r) {
    const auto c = m.coord(r);
    CHECK(tp[static_cast<std::size_t>(c.pp * 2 + c.dp)].ranks == m.tp_group(c.pp, c.dp));
    CHECK(dp[static_cast<std::size_t>(c.pp * 2 + c.tp)].ranks == m.dp_group(c.pp, c.tp));
    CHECK(pp[static_cast<std::size_t>(c.dp * 2 + c.tp)].ranks == m.pp_group(c.dp, c.tp));
  }
  // Pure TP (tp 4): one TP group of every rank, four DP and four PP groups of one rank each.
  const MeshLayout t4(1, 4, 1);
  CHECK(t4.groups("tp").size() == 1);
  CHECK(t4.groups("tp")[0].ranks == std::vector<int>{0, 1, 2, 3});
  CHECK(t4.groups("dp").size() == 4);
  CHECK(t4.groups("pp")[3].ranks == std::vector<int>{3});
  // dp 3 x tp 1 x pp 2: the DP group of stage 1 is ranks 3, 4, 5.
  const MeshLayout d3(3, 1, 2);
  CHECK(d3.groups("dp")[1].ranks == std::vector<int>{3, 4, 5});
  CHECK(d3.groups("pp")[2].ranks == std::vector<int>{2, 5});
  CHECK(d3.groups("cp").size() == 6);  // cp = 1: a group of one rank per (pp, dp, tp)
  CHECK(d3.groups("cp")[4].ranks == std::vector<int>{4});
  CHECK(d3.groups("ep").size() == 6);  // ep = 1: a group of one rank per (pp, dp, tp)
  CHECK_THROWS_AS(d3.groups("sp"), std::invalid_argument);
}

TEST_CASE("MeshLayout with expert parallelism: EP groups carved out of DP, the expert-DP groups across them",
          "[mesh]") {
  // dp 4 x tp 2 with ep 2: ranks (dp, tp) = 2·dp + tp; EP groups of 2 consecutive DP coordinates.
  const MeshLayout m(/*dp=*/4, /*tp=*/2, /*pp=*/1, /*cp=*/1, /*ep=*/2);
  REQUIRE(m.size() == 8);  // ep adds no ranks
  CHECK(m.coord(5).ep == 0);  // dp 2
  CHECK(m.coord(7).ep == 1);  // dp 3
  CHECK(m.ep_group(0, 3, 1) == std::vector<int>{5, 7});   // dp 2, 3 at tp 1
  CHECK(m.edp_group(0, 3, 1) == std::vector<int>{3, 7});  // dp 1, 3: the same experts
  const auto eps = m.groups("ep");
  REQUIRE(eps.size() == 4);  // tp 2 x dp/ep 2
  CHECK(eps[0].name == "mesh/ep/pp0tp0ep0/");
  CHECK(eps[0].ranks == std::vector<int>{0, 2});
  CHECK(eps[3].ranks == std::vector<int>{5, 7});
  const auto edps = m.groups("edp");
  REQUIRE(edps.size() == 4);  // tp 2 x ep 2
  CHECK(edps[1].ranks == std::vector<int>{2, 6});
  for (const char* axis : {"ep", "edp"}) {
    std::vector<int> seen(8, 0);
    for (const auto& g : m.groups(axis))
      for (int r : g.ranks) ++seen[static_cast<std::size_t>(r)];
    CHECK(seen == std::vector<int>(8, 1));
  }
  // ep = dp (Megatron's common case): the EP group is the DP group, the expert-DP groups single ranks.
  const MeshLayout full(2, 2, 1, 1, 2);
  CHECK(full.ep_group(0, 1, 0) == full.dp_group(0, 0));
  CHECK(full.edp_group(0, 1, 0) == std::vector<int>{2});
  CHECK_THROWS_AS(MeshLayout(4, 1, 1, 1, 3), std::invalid_argument);  // 3 does not divide 4
}

TEST_CASE("MeshLayout with context parallelism: Megatron's tp-cp-dp-pp order, the CP groups between TP and DP",
          "[mesh]") {
  const MeshLayout m(/*dp=*/2, /*tp=*/2, /*pp=*/1, /*cp=*/2);  // the dp 2 x cp 2 x tp 2 mesh of 8 ranks
  REQUIRE(m.size() == 8);
  CHECK(m.rank_of(0, 1, 1, 0) == 5);  // ((0*2 + 1)*2 + 0)*2 + 1
  const auto c = m.coord(6);
  CHECK((c.pp == 0 && c.dp == 1 && c.cp == 1 && c.tp == 0));
  CHECK(m.tp_group(0, 1, 1) == std::vector<int>{6, 7});
  CHECK(m.cp_group(0, 1, 0) == std::vector<int>{4, 6});
  CHECK(m.dp_group(0, 1, 1) == std::vector<int>{3, 7});
  const auto cps = m.groups("cp");
  REQUIRE(cps.size() == 4);
  CHECK(cps[1].name == "mesh/cp/pp0dp0tp1/");
  CHECK(cps[1].ranks == std::vector<int>{1, 3});
  CHECK(m.groups("tp")[1].name == "mesh/tp/pp0dp0cp1/");
  // Every rank in exactly one group of each axis.
  for (const char* axis : {"tp", "cp", "dp", "pp"}) {
    std::vector<int> seen(8, 0);
    for (const auto& g : m.groups(axis))
      for (int r : g.ranks) ++seen[static_cast<std::size_t>(r)];
    CHECK(seen == std::vector<int>(8, 1));
  }
  CHECK_THROWS_AS(m.rank_of(0, 0, 0, 2), std::out_of_range);
}

TEST_CASE("MeshLayout: bad degrees throw std::invalid_argument", "[mesh]") {
  CHECK_THROWS_AS(MeshLayout(0, 1, 1), std::invalid_argument);
  CHECK_THROWS_AS(MeshLayout(1, -1, 1), std::invalid_argument);
  CHECK_THROWS_AS(MeshLayout(1, 1, 0), std::invalid_argument);
  CHECK_THROWS_AS(MeshLayout(MeshDims{1, 1, 1, /*cp=*/0, 1}), std::invalid_argument);
  CHECK_NOTHROW(MeshLayout(MeshDims{1, 1, 1, /*cp=*/2, 1}));
  CHECK_THROWS_AS(MeshLayout(MeshDims{1, 1, 1, 1, /*ep=*/2}), std::invalid_argument);
  CHECK_NOTHROW(MeshLayout(MeshDims{2, 2, 2}));
}
