// Devices, kernel probes and the hardware fingerprint (core/runtime/runtime).
#include "catch.hpp"
#include "core/runtime/runtime.hpp"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>

using namespace mpt;

TEST_CASE("the hardware fingerprint names the CPU, its kernel-relevant ISA and the kernels' dispatch", "[runtime]") {
  json hw = hardware_fingerprint();
  REQUIRE(hw.contains("cpu"));
  CHECK(!hw["cpu"]["model"].get<std::string>().empty());
  for (const char* f : {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"})
    CHECK(hw["cpu"]["isa"][f].is_boolean());
  CHECK(hw["cpu"]["logical_cpus"].get<int>() >= 1);
  // ATen reports its dispatch level (DEFAULT, AVX2, AVX512, ...) in show_config.
  CHECK(hw["aten_cpu_capability"].get<std::string>() != "unknown");
  CHECK(!hw["onednn"]["isa"].get<std::string>().empty());
  CHECK(!hw["onednn"]["isa_source"].get<std::string>().empty());
  CHECK(hw["blas"]["build"].get<std::string>() != "unknown");
  CHECK(hw["threads"]["intra_op"].get<int>() == torch::get_num_threads());
  CHECK(hw["torch"].is_string());
  CHECK(hw["cuda"]["gpus"].is_array());
}

TEST_CASE("VML first calls: resolved before the tests, and an op split over threads equals it computed serially",
          "[runtime]") {
  // The listener in tests/test_setup.cpp resolved oneMKL's VML dispatch before the first test
  // case, as apply_threads does in every mpt process (pytorch/pytorch#188792).
  const json hw = hardware_fingerprint();
  CHECK(resolve_vml_dispatch() == at::hasMKL());
  if (at::hasMKL()) {
    CHECK(hw["blas"]["vml_first_calls"].get<std::string>().rfind("resolved", 0) == 0);
    CHECK(hw["blas"]["mkl_version"].get<std::string>() != "unknown");
  } else {
    CHECK(!hw["blas"].contains("vml_first_calls"));
  }
  // What the race broke: with 2 intra-op threads, each VML-routed op on 3 × 4096 elements
  // (past the VML kernels' grain of 2048, so split between the threads) must give, bit for bit,
  // what one thread gives. The race made one thread's chunk up to ~4000 ulp off.
  const int threads = at::get_num_threads();
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const auto x = torch::linspace(0.01, 0.99, 3 * 4096, torch::TensorOptions().dtype(dtype));
    for (const auto& op : vml_routed_ops()) {
      at::set_num_threads(2);
      const auto split = op.fn(x);
      at::set_num_threads(1);
      const auto serial = op.fn(x);
      INFO(op.name << " " << c10::toString(dtype));
      CHECK(torch::equal(split, serial));
    }
  }
  at::set_num_threads(threads);
  // The Python references warm the same ops (tests/parity/mpt_threads.py, VML_OPS).
  std::ifstream py(std::string(MPT_SOURCE_DIR) + "/tests/parity/mpt_threads.py");
  const std::string text((std::istreambuf_iterator<char>(py)), std::istreambuf_iterator<char>());
  const auto from = text.find("VML_OPS = ("), to = text.find(')', from);
  REQUIRE(from != std::string::npos);
  const std::string list = text.substr(from, to - from);
  std::size_t quoted = 0;
  for (char c : list) quoted += c == '"';
  CHECK(quoted == 2 * vml_routed_ops().size());
  for (const auto& op : vml_routed_ops()) CHECK(list.find('"' + std::string(op.name) + '"') != std::string::npos);
}

TEST_CASE("environment() carries the fingerprint and a reason for every emulated format", "[runtime]") {
  json env = environment(torch::Device(torch::kCPU));
  CHECK(env.contains("hardware"));
  for (const char* f : {"fp16", "bf16"}) {
    const std::string mode = env[std::string(f) + "_compute"];
    CHECK((mode == "native" || mode == "emulated"));
    // An emulated format says why (the failed probe); a native one has no reason.
    CHECK(env.contains(std::string(f) + "_compute_reason") == (mode == "emulated"));
  }
}

TEST_CASE("kernel probes: fp32 is native everywhere, results are cached and agree with native_matmul", "[runtime]") {
  torch::Device cpu(torch::kCPU);
  auto p = probe_kernels(cpu, torch::kFloat);
  CHECK(p.native());
  CHECK(p.reason.empty());
  for (auto dt : {torch::kHalf, torch::kBFloat16}) {
    auto a = probe_kernels(cpu, dt), b = probe_kernels(cpu, dt);
    CHECK(a.native() == b.native());
    CHECK(a.reason == b.reason);
    CHECK(native_matmul(cpu, dt) == a.native());
    CHECK(a.native() == a.reason.empty());
    CHECK((!a.fp32_accumulation || a.runs));
  }
}

// What the probe's accumulation check detects, shown directly: a sum of 384 products of 0.25 is
// 96 in fp32 accumulation, and stalls at 64 in bf16 accumulation (64 + 0.25 is a tie that rounds
// to even, 64). Whatever this CPU's bf16 kernels do, the probe's verdict must match it.
TEST_CASE("kernel probe: bf16 accumulation is detected as what the matmul actually does", "[runtime]") {
  torch::Device cpu(torch::kCPU);
  auto p = probe_kernels(cpu, torch::kBFloat16);
  if (!p.runs) {
    WARN("no bf16 matmul on this CPU: " << p.reason);
    return;
  }
  auto dy = torch::ones({256, 384}, torch::kBFloat16);
  auto w = torch::full({384, 128}, 0.25, torch::kBFloat16);
  const double got = torch::matmul(dy, w).to(torch::kDouble).max().item<double>();
  CHECK((got == 96.0 || got == 64.0));
  CHECK(p.fp32_accumulation == (got == 96.0));
  if (!p.fp32_accumulation) CHECK_THAT(p.reason, Catch::Contains("accumulate in"));
}

TEST_CASE("thread policy: the config's count as given, else the usable cores shared out among local processes",
          "[runtime]") {
  auto p = choose_threads(/*requested=*/0, /*cores=*/2, /*local_processes=*/1);
  CHECK(p.intra_op == 2);
  CHECK(p.source == "auto");
  CHECK(choose_threads(0, 2, 2).intra_op == 1);    // --nproc 2 on 2 cores: one each
  CHECK(choose_threads(0, 2, 4).intra_op == 1);    // never below one
  CHECK(choose_threads(0, 16, 3).intra_op == 5);   // floor(16 / 3): never more than the cores in all
  CHECK(choose_threads(0, 0, 0).intra_op == 1);    // nonsense counts are clamped to one
  p = choose_threads(/*requested=*/3, 2, 2);       // oversubscription on request is the user's call
  CHECK(p.intra_op == 3);
  CHECK(p.source == "config");
  const json j = to_json(p);
  CHECK(j["intra_op"] == 3);
  CHECK(j["cores"] == 2);
  CHECK(j["local_processes"] == 2);
  CHECK(j["source"] == "config");
  CHECK(j.contains("omp_wait_policy"));
  CHECK(usable_cores() >= 1);
  // OMP_NUM_THREADS counts when /threads does not say; a malformed value is ignored.
  p = choose_threads(0, 2, 1, "1");
  CHECK(p.intra_op == 1);
  CHECK(p.source == "OMP_NUM_THREADS");
  CHECK(choose_threads(3, 2, 1, "1").intra_op == 3);  // the config wins
  for (const char* bad : {"", "0", "two", "2x", "-1", "5000"}) {
    CAPTURE(bad);
    CHECK(choose_threads(0, 2, 1, bad).source == "auto");
    CHECK(choose_threads(0, 2, 1, bad).intra_op == 2);
  }
}

TEST_CASE("binding: each local process on its own intra_op CPUs, only where their threads fit", "[runtime]") {
  const std::vector<int> two{0, 1}, sparse{2, 3, 6, 7, 9};
  CHECK(bind_cpus(two, 0, 2, 1) == std::vector<int>{0});
  CHECK(bind_cpus(two, 1, 2, 1) == std::vector<int>{1});
  CHECK(bind_cpus(sparse, 0, 2, 2) == std::vector<int>{2, 3});  // the allowed set's own CPUs, in order
  CHECK(bind_cpus(sparse, 1, 2, 2) == std::vector<int>{6, 7});  // CPU 9 stays free: 2 x 2 of 5
  CHECK(bind_cpus(two, 0, 1, 2).empty());   // one process: nothing to separate
  CHECK(bind_cpus(two, 0, 2, 2).empty());   // 2 x 2 threads on 2 CPUs: bound, they would share anyway
  CHECK(bind_cpus(two, 0, 4, 1).empty());   // more processes than CPUs
  CHECK(bind_cpus(two, 2, 2, 1).empty());   // a local rank outside the processes
  CHECK(bind_cpus(two, -1, 2, 1).empty());  // no local rank known
  CHECK(bind_cpus({}, 0, 2, 1).empty());
}

TEST_CASE("the local rank comes from the launcher that local_processes_from_environment finds", "[runtime]") {
  const char* vars[] = {"MPT_RANK", "MPT_LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};
  std::map<std::string, std::string> saved;
  for (const char* v : vars)
    if (const char* x = std::getenv(v)) saved[v] = x;
  for (const char* v : vars) ::unsetenv(v);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("SLURM_LOCALID", "2", 1);
  CHECK(local_rank_from_environment() == -1);  // stray variables, no launcher
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  CHECK(local_rank_from_environment() == 2);
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  CHECK(local_rank_from_environment() == 1);  // torchrun before SLURM
  ::setenv("MPT_RANK", "0", 1);
  CHECK(local_rank_from_environment() == -1);  // mpt --nproc without MPT_LOCAL_RANK
  ::setenv("MPT_LOCAL_RANK", "0", 1);
  CHECK(local_rank_from_environment() == 0);
  for (const char* bad : {"", "x", "-1", "1.5"}) {
    CAPTURE(bad);
    ::setenv("MPT_LOCAL_RANK", bad, 1);
    CHECK(local_rank_from_environment() == -1);
  }
  for (const char* v : vars) ::unsetenv(v);
  for (const auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
}

TEST_CASE("local processes come from the launcher's environment", "[runtime]") {
  const char* vars[] = {"MPT_WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                        "MPT_RANK",       "RANK",             "WORLD_SIZE",            "SLURM_PROCID",
                        "SLURM_NTASKS"};
  std::map<std::string, std::string> saved;
  for (const char* v : vars)
    if (const char* x = std::getenv(v)) saved[v] = x;
  for (const char* v : vars) ::unsetenv(v);
  CHECK(local_processes_from_environment() == 1);
  // Each count alone, without its launcher's rank variables: a stray variable, not this run's processes.
  ::setenv("SLURM_TASKS_PER_NODE", "4(x2)", 1);
  ::setenv("SLURM_NTASKS_PER_NODE", "3", 1);
  ::setenv("LOCAL_WORLD_SIZE", "8", 1);
  ::setenv("MPT_WORLD_SIZE", "6", 1);
  CHECK(local_processes_from_environment() == 1);
  // An srun task: SLURM's counts (SLURM_NTASKS_PER_NODE first, else the compressed form).
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  CHECK(local_processes_from_environment() == 3);
  ::unsetenv("SLURM_NTASKS_PER_NODE");
  CHECK(local_processes_from_environment() == 4);  // "4(x2)": 4 tasks on each of 2 nodes
  // torchrun (RANK and WORLD_SIZE) comes before SLURM, as in dist::launch_from_environment.
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "16", 1);
  CHECK(local_processes_from_environment() == 8);
  ::setenv("LOCAL_WORLD_SIZE", "garbage", 1);  // malformed: ignored (a warning), 1
  CHECK(local_processes_from_environment() == 1);
  // mpt --nproc 6 (MPT_RANK): every rank on this machine.
  ::setenv("MPT_RANK", "1", 1);
  CHECK(local_processes_from_environment() == 6);
  for (const char* v : vars) ::unsetenv(v);
  for (const auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
}
