// Unit tests of core/dist: bucket assignment, launcher environments, the Reducer on a
// one-process group and on two Gloo ranks played by two threads, the collectives of Group,
// Jobs (several in one process, independent) (the multi-process paths run through ctest's CLI cases).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "catch.hpp"
#include "dist/two_ranks.hpp"
#include "core/dist/dist.hpp"
#include "core/parallel/ddp.hpp"
#include "core/dist/detail.hpp"
#include "core/runtime/compat.hpp"
#include "core/errors.hpp"

using namespace mpt;
using mpt::testing::on_two_ranks;

namespace {
struct EnvGuard {  // sets variables for one test and removes them afterwards
  std::vector<std::string> names;
  void set(const std::string& k, const std::string& v) {
    ::setenv(k.c_str(), v.c_str(), 1);
    names.push_back(k);
  }
  ~EnvGuard() {
    for (const auto& k : names) ::unsetenv(k.c_str());
  }
};
}  // namespace

TEST_CASE("first_line: a library message's first line without Gloo's source location and bug-tracker advice",
          "[dist]") {
  using mpt::dist::detail::first_line;
  CHECK(first_line("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
                   "[127.0.0.1]:7604. This is typically caused by a remote worker crashing. Check the logs of the "
                   "remote worker before reporting an error. GLHF!\nmore") ==
        "Connection closed by peer [127.0.0.1]:7604.");
  CHECK(first_line("[../third_party/gloo/gloo/transport/unbound_buffer.cc:78] Timed out waiting 2000ms for recv") ==
        "Timed out waiting 2000ms for recv");
  // Brackets that are no source location stay.
  CHECK(first_line("[127.0.0.1]:7604 refused\nsecond") == "[127.0.0.1]:7604 refused");
  CHECK(first_line("[rank 1] failed") == "[rank 1] failed");
  CHECK(first_line("plain") == "plain");
}

TEST_CASE("assign_buckets: reverse order, small first bucket, caps respected", "[dist]") {
  // 4 parameters of 100, 50, 300, 10 floats (400, 200, 1200, 40 bytes).
  std::vector<torch::Tensor> ps = {torch::zeros({100}), torch::zeros({50}), torch::zeros({300}), torch::zeros({10})};
  auto b = dist::assign_buckets(ps, /*first_cap_bytes=*/100, /*cap_bytes=*/1600, /*element_bytes=*/4);
  REQUIRE(b.size() == 3);
  CHECK(b[0].params == std::vector<std::size_t>{3});     // last parameter first; 40 + 1200 > 100
  CHECK(b[1].params == std::vector<std::size_t>{2, 1});  // 1200 + 200 <= 1600; + 400 > 1600
  CHECK(b[2].params == std::vector<std::size_t>{0});
  CHECK(b[1].offsets == std::vector<int64_t>{0, 300});
  CHECK(b[1].bytes == 1400);
  // A parameter larger than the cap gets a bucket of its own; every parameter lands somewhere.
  auto d = dist::assign_buckets(ps, 8, 8, 4);
  CHECK(d.size() == 4);
  int64_t total = 0;
  for (const auto& x : d) total += x.numel;
  CHECK(total == 460);
}

TEST_CASE("launch_from_environment reads torchrun and SLURM variables", "[dist]") {
  SECTION("none") { CHECK_FALSE(dist::launch_from_environment().has_value()); }
  SECTION("torchrun with the agent store") {
    EnvGuard e;
    e.set("RANK", "3");
    e.set("WORLD_SIZE", "4");
    e.set("LOCAL_RANK", "1");
    e.set("MASTER_ADDR", "10.0.0.2");
    e.set("MASTER_PORT", "29400");
    e.set("TORCHELASTIC_USE_AGENT_STORE", "True");
    e.set("TORCHELASTIC_RESTART_COUNT", "2");
    auto li = dist::launch_from_environment();
    REQUIRE(li);
    CHECK(li->launcher == "torchrun");
    CHECK(li->rank == 3);
    CHECK(li->world_size == 4);
    CHECK(li->local_rank == 1);
    CHECK(li->master_addr == "10.0.0.2");
    CHECK(li->master_port == 29400);
    CHECK(li->agent_store);
    CHECK(li->store_prefix == "/worker/attempt_2");
    CHECK(li->world_size_var == "WORLD_SIZE");  // named when the harness caps the world size
    CHECK(li->local_world_size == 4);            // no LOCAL_WORLD_SIZE: one node
    CHECK(li->node_rank == 0);
    e.set("LOCAL_WORLD_SIZE", "2");  // torchrun --nnodes 2 --nproc-per-node 2 --node-rank 1
    e.set("GROUP_RANK", "1");
    auto two = dist::launch_from_environment();
    REQUIRE(two);
    CHECK(two->local_world_size == 2);
    CHECK(two->node_rank == 1);
  }
  SECTION("mpt --nproc: the launcher hosts the store") {
    EnvGuard e;
    e.set("MPT_RANK", "1");
    e.set("MPT_WORLD_SIZE", "2");
    e.set("MASTER_PORT", "29401");
    auto plain = dist::launch_from_environment();
    REQUIRE(plain);
    CHECK(plain->launcher == "mpt");
    CHECK_FALSE(plain->agent_store);
    e.set("MPT_AGENT_STORE", "1");
    auto li = dist::launch_from_environment();
    REQUIRE(li);
    CHECK(li->agent_store);
    CHECK(li->store_prefix.empty());
  }
  SECTION("SLURM") {
    EnvGuard e;
    e.set("SLURM_PROCID", "1");
    e.set("SLURM_NTASKS", "2");
    e.set("SLURM_LOCALID", "0");
    e.set("MASTER_PORT", "12345");
    auto li = dist::launch_from_environment();
    REQUIRE(li);
    CHECK(li->launcher == "slurm");
    CHECK(li->rank == 1);
    CHECK(li->world_size == 2);
    CHECK(li->world_size_var == "SLURM_NTASKS");
    CHECK(li->local_world_size == 2);
    e.set("SLURM_NODEID", "1");
    e.set("SLURM_NTASKS_PER_NODE", "1(x2)");  // 1 task on each of 2 nodes
    auto two = dist::launch_from_environment();
    REQUIRE(two);
    CHECK(two->node_rank == 1);
    CHECK(two->local_world_size == 1);
  }
  SECTION("inconsistent values are errors") {
    EnvGuard e;
    e.set("RANK", "2");
    e.set("WORLD_SIZE", "2");
    e.set("MASTER_PORT", "1");
    CHECK_THROWS_AS(dist::launch_from_environment(), RuntimeFailure);
    e.set("RANK", "1");  // a valid place, then one wrong per-node variable at a time
    REQUIRE(dist::launch_from_environment());
    e.set("LOCAL_WORLD_SIZE", "0");
    CHECK_THROWS_WITH(dist::launch_from_environment(), Catch::Matchers::Contains("LOCAL_WORLD_SIZE=0 is not a process count in [1, WORLD_SIZE=2]"));
    e.set("LOCAL_WORLD_SIZE", "3");
    CHECK_THROWS_WITH(dist::launch_from_environment(), Catch::Matchers::Contains("LOCAL_WORLD_SIZE=3 is not a process count"));
    e.set("LOCAL_WORLD_SIZE", "1");
    e.set("LOCAL_RANK", "1");
    CHECK_THROWS_WITH(dist::launch_from_environment(), Catch::Matchers::Contains("LOCAL_RANK=1 is not a local rank in [0, LOCAL_WORLD_SIZE=1)"));
    e.set("LOCAL_RANK", "0");
    e.set("GROUP_RANK", "2");
    CHECK_THROWS_WITH(dist::launch_from_environment(), Catch::Matchers::Contains("GROUP_RANK=2 is not a node rank in [0, WORLD_SIZE=2)"));
    e.set("GROUP_WORLD_SIZE", "2");
    CHECK_THROWS_WITH(dist::launch_from_environment(), Catch::Matchers::Contains("GROUP_RANK=2 is not a node rank in [0, GROUP_WORLD_SIZE=2)"));
    e.set("GROUP_RANK", "1");
    REQUIRE(dist::launch_from_environment());  // rank 1 = node 1's local rank 0
    e.set("RANK", "0");
    e.set("LOCAL_WORLD_SIZE", "2");
    e.set("LOCAL_RANK", "1");
    CHECK_THROWS_WITH(dist::launch_from_environment(), Catch::Matchers::Contains("LOCAL_RANK=1 exceeds the global rank RANK=0"));
  }
  SECTION("SLURM's per-node variables") {
    EnvGuard e;
    e.set("SLURM_PROCID", "3");
    e.set("SLURM_NTASKS", "4");
    e.set("MASTER_PORT", "12345");
    e.set("SLURM_NTASKS_PER_NODE", "1,3");  // heterogeneous: the largest count bounds the local ranks
    e.set("SLURM_LOCALID", "2");
    e.set("SLURM_NODEID", "1");
    e.set("SLURM_NNODES", "2");
    auto li = dist::launch_from_environment();
    REQUIRE(li);
    CHECK(li->local_world_size == 3);
    e.set("SLURM_NTASKS_PER_NODE", "2(x2)");
    CHECK_THROWS_WITH(dist::launch_from_environment(), Catch::Matchers::Contains("SLURM_LOCALID=2 is not a local rank in [0, SLURM_NTASKS_PER_NODE=2)"));
    e.set("SLURM_NTASKS_PER_NODE", "two");
    CHECK_THROWS_WITH(dist::launch_from_environment(), Catch::Matchers::Contains("SLURM_NTASKS_PER_NODE=\"two\" is not a list of task counts"));
    e.set("SLURM_NTASKS_PER_NODE", "8");  // an allocation's count above a smaller step's: capped
    e.set("SLURM_NODEID", "2");
    CHECK_THROWS_WITH(dist::launch_from_environment(), Catch::Matchers::Contains("SLURM_NODEID=2 is not a node rank in [0, SLURM_NNODES=2)"));
    e.set("SLURM_NODEID", "1");
    li = dist::launch_from_environment();
    REQUIRE(li);
    CHECK(li->local_world_size == 4);
  }
  SECTION("a multi-process job needs MASTER_PORT") {
    EnvGuard e;
    e.set("RANK", "0");
    e.set("WORLD_SIZE", "2");
    CHECK_THROWS_AS(dist::launch_from_environment(), RuntimeFailure);
  }
}

TEST_CASE("route_source_address: the local address the route to a host leaves from", "[dist]") {
  CHECK(dist::route_source_address("127.0.0.1", 29500) == "127.0.0.1");
  CHECK(dist::route_source_address("localhost", 0) == "127.0.0.1");
  CHECK(dist::route_source_address("no-such-host.invalid", 29500).empty());  // RFC 6761: never resolves
}

TEST_CASE("Reducer on a one-process group leaves the local gradient (also accumulated)", "[dist]") {
  dist::LaunchInfo li;
  auto g = dist::Group::create(dist::connect_store(li, std::chrono::milliseconds(5000)), 0, 1, "unit/",
                               std::chrono::milliseconds(5000));
  torch::manual_seed(0);
  torch::nn::Linear lin(5, 3);
  auto x = torch::randn({4, 5});
  auto want = [&] {
    auto c = torch::nn::Linear(5, 3);
    torch::NoGradGuard ng;
    for (std::size_t i = 0; i < 2; ++i) c->parameters()[i].copy_(lin->parameters()[i]);
    return c;
  }();
  dist::ReducerOptions o;
  o.first_bucket_cap_mb = 1e-5;  // several buckets
  o.bucket_cap_mb = 1e-5;
  dist::Reducer r(lin->parameters(), g, o);
  CHECK(r.buckets().size() == 2);
  // Two micro-steps, the first without communication (no_sync).
  r.set_sync(false);
  lin->forward(x).sum().backward();
  r.set_sync(true);
  lin->forward(x).pow(2).sum().backward();
  r.finalize();
  want->forward(x).sum().backward();
  want->forward(x).pow(2).sum().backward();
  CHECK(torch::allclose(lin->weight.grad(), want->weight.grad()));
  CHECK(torch::allclose(lin->bias.grad(), want->bias.grad()));
}

TEST_CASE("heartbeat_interval: timeout/20 in milliseconds, between 20 ms and 500 ms", "[dist]") {
  using std::chrono::milliseconds;
  CHECK(dist::heartbeat_interval(milliseconds(100)) == milliseconds(20));    // 0.1 s: the floor
  CHECK(dist::heartbeat_interval(milliseconds(3000)) == milliseconds(150));  // sub-second values kept
  CHECK(dist::heartbeat_interval(milliseconds(30000)) == milliseconds(500));
}

TEST_CASE("Group::barrier of one rank and a thread-played pair returns", "[dist]") {
  using std::chrono::milliseconds;
  const auto job = dist::connect_store(dist::LaunchInfo{}, milliseconds(5000));
  auto solo = dist::Group::create(job, 0, 1, "barrier_solo/", milliseconds(5000));
  solo->barrier();
  std::vector<std::shared_ptr<dist::Group>> gs(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] { gs[static_cast<std::size_t>(r)] = dist::Group::create(job, r, 2, "barrier_pair/", milliseconds(5000)); });
  for (auto& t : ts) t.join();
  ts.clear();
  std::vector<int> done(2, 0);
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      for (int k = 0; k < 3; ++k) gs[static_cast<std::size_t>(r)]->barrier();  // unique keys per call
      done[static_cast<std::size_t>(r)] = 1;
    });
  for (auto& t : ts) t.join();
  CHECK(done == std::vector<int>{1, 1});
}

TEST_CASE("Group::create names a rank that never comes, within the timeout", "[dist]") {
  using std::chrono::milliseconds;
  const auto job = dist::connect_store(dist::LaunchInfo{}, milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(dist::Group::create(job, 0, 2, "never/", milliseconds(300)),
                    Catch::Contains("rank 1 did not arrive within 0.3 s"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
}

TEST_CASE("two Jobs in one process are independent: store, timeout, progress, waits", "[dist]") {
  using std::chrono::milliseconds;
  auto a = dist::connect_store(dist::LaunchInfo{}, milliseconds(300));
  auto b = dist::connect_store(dist::LaunchInfo{}, milliseconds(5000));
  CHECK(a->timeout() == milliseconds(300));
  CHECK(b->timeout() == milliseconds(5000));
  a->note_progress();
  a->note_progress();
  CHECK(a->progress() == 2);
  CHECK(b->progress() == 0);
  {
    dist::WaitingFor waiting(*a, 1);
    CHECK(a->waiting_on() == 1);
    CHECK(b->waiting_on() == -1);
  }
  CHECK(a->waiting_on() == -1);
  // Ranks 0 and 1 of "pair/" meet in b's store. a's store has seen neither: rank 0 of "pair/"
  // there waits alone and fails within the 0.3 s it is given (one shared store would let it
  // through at once: both ranks' arrival keys are there).
  std::vector<std::shared_ptr<dist::Group>> gs(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] { gs[static_cast<std::size_t>(r)] = dist::Group::create(b, r, 2, "pair/", milliseconds(5000)); });
  for (auto& t : ts) t.join();
  ts.clear();
  REQUIRE((gs[0] && gs[1]));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(dist::Group::create(a, 0, 2, "pair/", milliseconds(300)),
                    Catch::Contains("rank 1 did not arrive within 0.3 s"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  // A group keeps its job: with the test's handle on b gone, b's groups still meet in its store.
  b.reset();
  CHECK(gs[0]->job()->timeout() == milliseconds(5000));
  std::vector<float> sums(2, 0.0f);
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      auto& g = *gs[static_cast<std::size_t>(r)];
      g.barrier();
      auto t = torch::full({1}, r + 1.0f);
      g.allreduce(t);
      sums[static_cast<std::size_t>(r)] = t.item<float>();
    });
  for (auto& t : ts) t.join();
  CHECK(sums == std::vector<float>{3.0f, 3.0f});
}

namespace {
// A TCP port nothing listens on right now (bound, read back and released: another process may
// take it before the test does, which is unlikely on a test machine).
int unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  return ok ? ntohs(addr.sin_port) : 0;
}

// Rank 0's and rank 1's Jobs of a two-rank TCPStore job on a free port, both in this process (rank
// 0 hosts the store; each Job beats its own heartbeat).
std::pair<std::shared_ptr<dist::Job>, std::shared_ptr<dist::Job>> two_tcp_jobs(std::chrono::milliseconds timeout) {
  const int port = unused_port();
  REQUIRE(port > 0);
  dist::LaunchInfo l0, l1;
  l0.world_size = l1.world_size = 2;
  l0.master_port = l1.master_port = port;
  l1.rank = l1.local_rank = 1;
  auto j0 = dist::connect_store(l0, timeout);
  auto j1 = dist::connect_store(l1, timeout);
  return {j0, j1};
}
}  // namespace

TEST_CASE("two ranks' Jobs in one process: each beats its own heartbeat, and a failed recv names the late rank",
          "[dist]") {
  using std::chrono::milliseconds;
  // Ranks 0 and 1 of a two-rank TCPStore job (rank 0 hosts it), each with its own Job and
  // heartbeat thread. Rank 1 forms the group and then waits (WaitingFor) for rank 0 without
  // sending; rank 0's recv from it times out after 1 s, and rank 0 reads rank 1's heartbeat:
  // fresh and saying "waiting for rank 0" (its own Job's value, while rank 0's says 1).
  const milliseconds timeout(1000);
  auto jobs = two_tcp_jobs(timeout);
  auto j0 = std::move(jobs.first), j1 = std::move(jobs.second);
  CHECK(j0->rank() == 0);
  CHECK(j1->rank() == 1);
  std::vector<std::shared_ptr<dist::Group>> gs(2);
  {
    std::thread t1([&] { gs[1] = dist::Group::create(j1, 1, 2, "hb/", timeout); });
    gs[0] = dist::Group::create(j0, 0, 2, "hb/", timeout);
    t1.join();
  }
  REQUIRE(gs[1]);
  std::string error;
  int waiting_during = -3;
  {
    dist::WaitingFor waiting(*j1, 0);
    auto buf = torch::zeros({2});
    try {
      gs[0]->recv_async(buf, 1, /*tag=*/0).wait();
    } catch (const RuntimeFailure& e) {
      error = e.what();
    }
    waiting_during = j1->waiting_on();
  }
  CHECK(waiting_during == 0);
  CHECK(j0->waiting_on() == -1);  // restored after the failed wait
  CHECK_THAT(error, Catch::Contains("recv from rank 1 (tag 0) failed on rank 0 of 2") &&
                        Catch::Contains("rank 1 is late: alive, itself waiting for rank 0"));
  gs[0].reset();
  gs[1].reset();
  j1.reset();  // its heartbeat joined, its connections closed
  j0.reset();  // then the host of the store
}

// Issue 38: rank 1's trace events (10.9 MB) went to rank 0 as one value of the job's store; LibTorch
// 2.x's TCPStore server (libuv) closes a connection whose message exceeds 8 MiB, so rank 1 died
// and rank 0 waited out its timeout. Values of any length travel in pieces: a 12 MiB part
// through gather_on_rank0 and a 9 MiB job description through the launch check, on a real
// TCPStore that rank 0 hosts (two Jobs of this process, as above).
TEST_CASE("gather_on_rank0 and the launch check carry values beyond one store message (8 MiB)", "[dist]") {
  using std::chrono::milliseconds;
  const milliseconds timeout(5000);
  auto jobs = two_tcp_jobs(timeout);
  auto j0 = std::move(jobs.first), j1 = std::move(jobs.second);
  std::string part(12u << 20, '\0');
  for (std::size_t i = 0; i < part.size(); ++i) part[i] = static_cast<char>('a' + (i * 7 + i / 4099) % 26);
  const std::string description = "{\"config\": \"" + std::string(9u << 20, 'c') + "\"}";
  std::vector<std::string> got0, got1;
  std::string error0, error1;
  std::thread rank1([&] {
    try {
      j1->check_same_launch(description);
      got1 = j1->gather_on_rank0("big", part);
    } catch (const std::exception& e) {
      error1 = e.what();
    }
  });
  try {
    j0->check_same_launch(description);
    got0 = j0->gather_on_rank0("big", "rank 0's own");
  } catch (const std::exception& e) {
    error0 = e.what();
  }
  rank1.join();
  CHECK(error0.substr(0, 300) == "");
  CHECK(error1.substr(0, 300) == "");
  REQUIRE(got0.size() == 2);
  CHECK(got0[0] == "rank 0's own");
  CHECK(got0[1].size() == part.size());
  CHECK(got0[1] == part);
  CHECK(got1.empty());  // the other ranks only send theirs
  j1.reset();
  j0.reset();  // the host of the store last
}

// ---------------------------------------------------------------------------
// Collectives and the reducer on a real two-rank Gloo group: two threads of this process, one
// rank each, meeting in the job's store as two processes would. Catch2's assertions are not
// thread-safe: the ranks only compute, the checks run on the main thread afterwards.
// ---------------------------------------------------------------------------


TEST_CASE("all_gather, reduce_scatter and all_to_all on two Gloo ranks", "[dist]") {
  std::vector<torch::Tensor> gathered(2), scattered(2), exchanged(2);
  const auto errors = on_two_ranks("collectives/", [&](dist::Group& g, int r) {
    const auto i = static_cast<std::size_t>(r);
    // all_gather: rank r contributes a 2x3 block of r + 1.
    gathered[i] = torch::empty({4, 3});
    g.all_gather(torch::full({2, 3}, r + 1.0), gathered[i]);
    // reduce_scatter: rank r holds (r + 1) * [0 .. 7] as 4x2; the sum is 3 * [0 .. 7].
    scattered[i] = torch::empty({2, 2});
    g.reduce_scatter(torch::arange(8, torch::kFloat32).view({4, 2}) * (r + 1.0), scattered[i]);
    // all_to_all: chunk j of rank r is 10 r + j; chunk i of the output comes from rank i.
    auto in = torch::tensor({10.0f * r, 10.0f * r, 10.0f * r + 1, 10.0f * r + 1});
    exchanged[i] = torch::empty({4});
    g.all_to_all(in, exchanged[i]);
  });
  REQUIRE(errors == std::vector<std::string>{"", ""});
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const auto i = static_cast<std::size_t>(r);
    CHECK(torch::equal(gathered[i], torch::cat({torch::full({2, 3}, 1.0), torch::full({2, 3}, 2.0)})));
    CHECK(torch::equal(scattered[i], (torch::arange(8, torch::kFloat32).view({4, 2}) * 3.0).chunk(2, 0)[i]));
    CHECK(torch::equal(exchanged[i], torch::tensor({0.0f + r, 0.0f + r, 10.0f + r, 10.0f + r})));
  }
}

TEST_CASE("the collectives refuse tensors whose shapes do not fit the group", "[dist]") {
  auto g = dist::Group::create(dist::connect_store(dist::LaunchInfo{}, std::chrono::milliseconds(5000)), 0, 1,
                               "collectives_solo/", std::chrono::milliseconds(5000));
  CHECK_THROWS_AS(g->all_gather(torch::ones({2}), torch::empty({3})), std::invalid_argument);
  CHECK_THROWS_AS(g->reduce_scatter(torch::ones({2}), torch::empty({1})), std::invalid_argument);
  CHECK_THROWS_AS(g->all_to_all(torch::ones({2}), torch::empty({3})), std::invalid_argument);
  auto out = torch::empty({2});
  g->all_gather(torch::tensor({1.0f, 2.0f}), out);  // one rank: a copy
  CHECK(torch::equal(out, torch::tensor({1.0f, 2.0f})));
}

TEST_CASE("Reducer on two Gloo ranks: the bucketed all-reduce of the gradients is their sum (then / N)", "[dist]") {
  // Identical models (rank 0's parameters are broadcast anyway), different data per rank.
  torch::manual_seed(3);
  torch::nn::Linear init(6, 4);
  const std::vector<torch::Tensor> xs = {torch::randn({5, 6}), torch::randn({5, 6})};
  auto clone = [&] {
    torch::nn::Linear c(6, 4);
    torch::NoGradGuard ng;
    for (std::size_t p = 0; p < 2; ++p) c->parameters()[p].copy_(init->parameters()[p]);
    return c;
  };
  // The reference: each rank's own gradient, summed. The Reducer divides by the world size,
  // before the all-reduce (DDP) or after it: both give the sum / 2.
  std::vector<torch::Tensor> want(2);
  for (std::size_t r = 0; r < 2; ++r) {
    auto c = clone();
    c->forward(xs[r]).pow(2).sum().backward();
    for (std::size_t p = 0; p < 2; ++p) want[p] = r == 0 ? c->parameters()[p].grad().clone() : want[p] + c->parameters()[p].grad();
  }
  for (const bool overlap : {true, false}) {
    for (const bool divide_before : {false, true}) {
      std::vector<torch::nn::Linear> nets = {clone(), clone()};
      std::vector<std::size_t> buckets(2);
      const auto errors = on_two_ranks(fmt::format("reducer_{}_{}/", overlap, divide_before), [&](dist::Group& g, int r) {
        dist::ReducerOptions o;
        o.overlap = overlap;
        o.divide_before = divide_before;
        o.first_bucket_cap_mb = 1e-5;  // the bias and the weight in buckets of their own
        o.bucket_cap_mb = 1e-5;
        auto group = std::shared_ptr<dist::Group>(&g, [](dist::Group*) {});  // owned by on_two_ranks
        auto& net = nets[static_cast<std::size_t>(r)];
        dist::Reducer reducer(net->parameters(), group, o);
        buckets[static_cast<std::size_t>(r)] = reducer.buckets().size();
        reducer.prepare();
        net->forward(xs[static_cast<std::size_t>(r)]).pow(2).sum().backward();
        reducer.finalize();
      });
      INFO("overlap " << overlap << ", divide before " << divide_before);
      REQUIRE(errors == std::vector<std::string>{"", ""});
      CHECK(buckets == std::vector<std::size_t>{2, 2});
      for (std::size_t r = 0; r < 2; ++r)
        for (std::size_t p = 0; p < 2; ++p) {
          const auto expected = want[p] / 2.0;
          CHECK(torch::allclose(nets[r]->parameters()[p].grad(), expected, /*rtol=*/1e-6, /*atol=*/1e-6));
        }
    }
  }
}

// ----------------------------------------------------------------------------
// The ring collectives (Group::ring_reduce_scatter / ring_all_gather)
// ----------------------------------------------------------------------------
namespace {
// Chunk j of the ring reduce-scatter as group.hpp documents it: rank order starting after
// j, left to right: ((in_{j+1} ⊕ in_{j+2}) ⊕ ...) ⊕ in_j.
torch::Tensor ring_order(const std::vector<torch::Tensor>& in, int j, dist::ReduceOp op) {
  const int n = static_cast<int>(in.size());
  auto chunk = [&](int r) { return in[static_cast<std::size_t>(r % n)].chunk(n, 0)[static_cast<std::size_t>(j)]; };
  torch::Tensor acc = chunk(j + 1).clone();
  for (int k = 2; k <= n; ++k) {
    const torch::Tensor own = chunk(j + k);
    acc = op == dist::ReduceOp::Sum ? acc + own : op == dist::ReduceOp::Min ? torch::minimum(acc, own) : torch::maximum(acc, own);
  }
  return acc;
}
}  // namespace

TEST_CASE("ring reduce_scatter and all_gather on 2, 3 and 4 Gloo ranks: the documented order, bit for bit",
          "[dist][ring]") {
  for (int n : {2, 3, 4}) {
    DYNAMIC_SECTION("N = " << n) {
      const auto count = static_cast<std::size_t>(n);
      const int64_t rows = 5;  // rows per chunk
      // Inputs made on this thread (the ranks' threads only compute): random floats of different
      // magnitudes per rank (the order of their sum shows), integer-valued floats (exact in any order).
      torch::manual_seed(19 + n);
      std::vector<torch::Tensor> rnd, ints, mine;
      for (int r = 0; r < n; ++r) {
        rnd.push_back(torch::randn({n * rows, 3}) * std::pow(10.0, r));
        ints.push_back(torch::randint(-50, 50, {n * rows, 3}).to(torch::kFloat32));
        mine.push_back(torch::randn({rows, 3}));
      }
      std::vector<torch::Tensor> sum(count), isum(count), mn(count), mx(count), gathered(count), via(count),
          in_place(count);
      std::vector<std::map<std::string, dist::CommCount>> counts(count);
      const auto errors = mpt::testing::on_ranks(n, fmt::format("ring_n{}/", n), [&](dist::Group& g, int r) {
        const auto i = static_cast<std::size_t>(r);
        for (auto* t : {&sum[i], &isum[i], &mn[i], &mx[i], &via[i]}) *t = torch::empty({rows, 3});
        g.ring_reduce_scatter(rnd[i], sum[i]);
        g.ring_reduce_scatter(ints[i], isum[i]);
        g.ring_reduce_scatter(rnd[i], mn[i], dist::ReduceOp::Min);
        g.ring_reduce_scatter(rnd[i], mx[i], dist::ReduceOp::Max);
        gathered[i] = torch::empty({n * rows, 3});
        g.ring_all_gather(mine[i], gathered[i]);
        counts[i] = g.comm_counts();
        // The in-place all-gather: `in` is this rank's chunk of `out` (FlatShardGroup's ring form).
        in_place[i] = torch::full({n * rows, 3}, -1.0f);
        in_place[i].chunk(n, 0)[i].copy_(mine[i]);
        g.ring_all_gather(in_place[i].chunk(n, 0)[i], in_place[i]);
        // reduce_scatter with the Gloo algorithm "ring" takes the same path.
        g.set_gloo_algorithm(dist::GlooAlgorithm::Ring);
        g.reduce_scatter(rnd[i], via[i]);
      });
      REQUIRE(errors == std::vector<std::string>(count, ""));
      int64_t differ_from_rank_order = 0;
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r);
        const auto i = static_cast<std::size_t>(r);
        CHECK(torch::equal(sum[i], ring_order(rnd, r, dist::ReduceOp::Sum)));
        CHECK(torch::equal(via[i], sum[i]));
        CHECK(torch::equal(isum[i], ring_order(ints, r, dist::ReduceOp::Sum)));
        torch::Tensor plain = ints[0].chunk(n, 0)[i].clone();
        for (int k = 1; k < n; ++k) plain = plain + ints[static_cast<std::size_t>(k)].chunk(n, 0)[i];
        CHECK(torch::equal(isum[i], plain));  // integers: every order gives the same
        CHECK(torch::equal(mn[i], ring_order(rnd, r, dist::ReduceOp::Min)));
        CHECK(torch::equal(mx[i], ring_order(rnd, r, dist::ReduceOp::Max)));
        CHECK(torch::equal(gathered[i], torch::cat(mine)));
        CHECK(torch::equal(in_place[i], torch::cat(mine)));
        // Another order (ranks 0 .. N-1) gives other sums at N > 2: the check above can fail.
        torch::Tensor rank_order = rnd[0].chunk(n, 0)[i].clone();
        for (int k = 1; k < n; ++k) rank_order = rank_order + rnd[static_cast<std::size_t>(k)].chunk(n, 0)[i];
        differ_from_rank_order += sum[i].ne(rank_order).sum().item<int64_t>();
        // Counted as the collectives, with the ring's (N-1)/N of the payload sent; no send/recv.
        const auto& c = counts[i];
        const double payload = static_cast<double>(n * rows * 3 * 4);
        REQUIRE(c.count("reduce_scatter") == 1);
        CHECK(c.at("reduce_scatter").calls == 4);
        CHECK(c.at("reduce_scatter").sent_bytes == 4 * payload * (n - 1) / n);
        REQUIRE(c.count("all_gather") == 1);
        CHECK(c.at("all_gather").sent_bytes == payload * (n - 1) / n);
        CHECK(c.count("send") == 0);
        CHECK(c.count("recv") == 0);
      }
      if (n > 2) CHECK(differ_from_rank_order > 0);
      else CHECK(differ_from_rank_order == 0);  // one addition: commutative
    }
  }
}

TEST_CASE("ring and native reduce_scatter / all_gather agree bit for bit on two Gloo ranks", "[dist][ring]") {
  torch::manual_seed(5);
  const std::vector<torch::Tensor> in = {torch::randn({6, 4}), torch::randn({6, 4})};
  std::vector<torch::Tensor> native(2), ring(2), gn(2), gr(2);
  const auto errors = on_two_ranks("ring_vs_native/", [&](dist::Group& g, int r) {
    const auto i = static_cast<std::size_t>(r);
    native[i] = torch::empty({3, 4});
    ring[i] = torch::empty({3, 4});
    gn[i] = torch::empty({12, 4});
    gr[i] = torch::empty({12, 4});
    g.reduce_scatter(in[i], native[i]);  // c10d's on LibTorch 2.x; the ring on 1.13
    g.all_gather(in[i], gn[i]);
    g.ring_reduce_scatter(in[i], ring[i]);
    g.ring_all_gather(in[i], gr[i]);
  });
  REQUIRE(errors == std::vector<std::string>{"", ""});
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(torch::equal(native[i], ring[i]));
    CHECK(torch::equal(native[i], (in[0] + in[1]).chunk(2, 0)[i]));
    CHECK(torch::equal(gn[i], gr[i]));
  }
}

TEST_CASE("send_async and recv_async refuse the ring's tags; names and descriptions of the algorithms",
          "[dist][ring]") {
  auto g = dist::Group::create(dist::connect_store(dist::LaunchInfo{}, std::chrono::milliseconds(5000)), 0, 1,
                               "ring_tags/", std::chrono::milliseconds(5000));
  auto t = torch::zeros({1});
  for (int tag : {dist::kRingTagBase, dist::kRingTagBase + 7, std::numeric_limits<int>::max()}) {
    INFO("tag " << tag);
    std::string send_error, recv_error;
    try {
      g->send_async(t, 0, tag);
    } catch (const std::invalid_argument& e) {
      send_error = e.what();
    }
    try {
      g->recv_async(t, 0, tag);
    } catch (const std::invalid_argument& e) {
      recv_error = e.what();
    }
    CHECK(send_error.find("reserved for the ring collectives (>= 2^30 = 1073741824)") != std::string::npos);
    CHECK(recv_error.find("recv_async: tag") != std::string::npos);
  }
  CHECK(dist::gloo_algorithm_from_name("ring") == dist::GlooAlgorithm::Ring);
  CHECK(dist::gloo_algorithm_from_name("native") == dist::GlooAlgorithm::Native);
  CHECK_THROWS_AS(dist::gloo_algorithm_from_name("tree"), std::invalid_argument);
  CHECK(dist::collective_algorithm("gloo", dist::GlooAlgorithm::Ring, "all_gather").rfind("ring (send/recv, mpt)", 0) == 0);
  CHECK(dist::collective_algorithm("gloo", dist::GlooAlgorithm::Native, "all_gather") ==
        (compat::kTorch2 ? "gloo native (c10d ProcessGroupGloo::_allgather_base (all_gather_into_tensor))"
                         : "gloo native (c10d ProcessGroupGloo::allgather)"));
  CHECK(dist::collective_algorithm("gloo", dist::GlooAlgorithm::Native, "reduce_scatter").rfind(
            compat::kGlooHasReduceScatter ? "gloo native" : "ring (send/recv, mpt)", 0) == 0);
  CHECK(dist::collective_algorithm("nccl", dist::GlooAlgorithm::Ring, "reduce_scatter").rfind("nccl native", 0) == 0);
  // One rank: the ring is a copy, and nothing counts as sent.
  auto out = torch::empty({2});
  g->ring_reduce_scatter(torch::tensor({1.0f, 2.0f}), out);
  CHECK(torch::equal(out, torch::tensor({1.0f, 2.0f})));
  CHECK(g->uses_ring("reduce_scatter") == !compat::kGlooHasReduceScatter);  // 1.13: the ring, even on one rank
  CHECK_FALSE(g->uses_ring("all_gather"));
  g->reduce_scatter(torch::tensor({3.0f, 4.0f}), out);
  CHECK(torch::equal(out, torch::tensor({3.0f, 4.0f})));
}
