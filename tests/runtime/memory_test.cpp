// The memory meter counts what the allocator hands out (core/runtime/memory).
#include "catch.hpp"
#include "core/runtime/memory.hpp"
#include "core/runtime/runtime.hpp"

#include <cstdint>
#include <cstring>

#include <c10/core/CPUAllocator.h>

using namespace mpt;

TEST_CASE("CPU peak bytes of tensors of known size", "[memory]") {
  install_counting_allocator();
  torch::Device cpu(torch::kCPU);
  PeakScope scope(cpu);
  {
    auto a = torch::empty({1024, 256}, torch::kFloat);  // 1 MiB
    CHECK(scope.delta_bytes() >= 1024 * 256 * 4);
    auto b = torch::empty({512, 256}, torch::kFloat);   // 0.5 MiB
    CHECK(scope.peak_bytes() >= (1024 + 512) * 256 * 4);
  }
  // Freed again; the peak remains.
  CHECK(scope.delta_bytes() == 0);
  CHECK(scope.peak_bytes() >= (1024 + 512) * 256 * 4);
  CHECK(scope.peak_bytes() < (1024 + 512) * 256 * 4 + 64 * 1024);
}

TEST_CASE("a new scope starts its peak from what is live", "[memory]") {
  install_counting_allocator();
  torch::Device cpu(torch::kCPU);
  auto keep = torch::empty({256, 256}, torch::kFloat);  // 256 KiB live before the scope
  PeakScope scope(cpu);
  CHECK(scope.peak_bytes() == 0);
  { auto t = torch::empty({128}, torch::kDouble); CHECK(scope.peak_bytes() >= 1024); }
  CHECK(scope.peak_bytes() < 256 * 256 * 4);
}

// c10::Allocator's raw interface (raw_allocate / raw_deallocate) requires a DataPtr whose context
// is its data pointer and a raw deleter; oneDNN's bf16/AMX kernels take scratch memory through it.
// Before the fix, raw_allocate on the counting allocator failed LibTorch's internal assertion
// "dptr.get() == dptr.get_context()" (issue: bf16 crash on AVX-512 BF16 / AMX CPUs).
TEST_CASE("raw_allocate / raw_deallocate through the installed CPU allocator, counted exactly", "[memory]") {
  install_counting_allocator();
  torch::Device cpu(torch::kCPU);
  c10::Allocator* a = c10::GetCPUAllocator();
  REQUIRE(a->raw_deleter() != nullptr);
  const int64_t before = current_bytes(cpu);
  void* p = a->raw_allocate(1000);
  REQUIRE(p != nullptr);
  CHECK(current_bytes(cpu) - before == 1000);                   // the requested bytes, exactly
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);          // LibTorch's alignment kept
  std::memset(p, 0x5a, 1000);                                   // the whole block is usable
  void* q = a->raw_allocate(24);
  CHECK(current_bytes(cpu) - before == 1024);
  a->raw_deallocate(p);
  CHECK(current_bytes(cpu) - before == 24);
  a->raw_deallocate(q);
  CHECK(current_bytes(cpu) == before);
}

TEST_CASE("tensor storage is counted to the byte and its DataPtr is simple (context == data)", "[memory]") {
  install_counting_allocator();
  torch::Device cpu(torch::kCPU);
  PeakScope scope(cpu);
  {
    auto t = torch::empty({333}, torch::kFloat);
    CHECK(scope.delta_bytes() == 333 * 4);
    const auto& dp = t.storage().data_ptr();
    CHECK(dp.get() == dp.get_context());
    CHECK(dp.get_deleter() == c10::GetCPUAllocator()->raw_deleter());
    auto empty = torch::empty({0}, torch::kFloat);  // no storage, nothing counted
    CHECK(scope.delta_bytes() == 333 * 4);
  }
  CHECK(scope.delta_bytes() == 0);
  CHECK(scope.peak_bytes() == 333 * 4);
}

// A bf16 product large enough that LibTorch hands it to oneDNN where the CPU has native bf16
// (AVX-512 BF16, AMX: blocked kernels with scratchpads from raw_allocate), and the same in the
// backward of a linear layer. bf16 products of these small integers are exact and the fp32
// accumulation of 512 of them too, so the result is known exactly on every CPU.
TEST_CASE("bf16 matmul and linear backward past oneDNN's size threshold run under the counting allocator", "[memory]") {
  install_counting_allocator();
  torch::Device cpu(torch::kCPU);
  PeakScope scope(cpu);
  auto a = (torch::arange(512 * 512, torch::kFloat).remainder(7) - 3).to(torch::kBFloat16).reshape({512, 512});
  auto b = (torch::arange(512 * 512, torch::kFloat).remainder(5) - 2).to(torch::kBFloat16).reshape({512, 512});
  auto c = torch::matmul(a, b);
  auto ref = torch::matmul(a.to(torch::kDouble), b.to(torch::kDouble));
  // Products and sums are integers below 2^12 in magnitude, exact in fp32 accumulation; the bf16
  // output rounds them to 8 significant bits, so compare with the double result rounded to bf16.
  CHECK(torch::equal(c.to(torch::kDouble), ref.to(torch::kBFloat16).to(torch::kDouble)));
  CHECK(scope.peak_bytes() >= 512 * 512 * 2);  // at least the output, counted

  auto x = torch::full({256, 512}, 0.5, torch::kBFloat16).requires_grad_(true);
  auto w = torch::full({384, 512}, 0.25, torch::kBFloat16).requires_grad_(true);
  auto y = torch::nn::functional::linear(x, w);
  y.sum().backward();
  CHECK(y.to(torch::kDouble).eq(64.0).all().item<bool>());          // 512 * 0.125
  // 384 * 0.25 = 96 with fp32 accumulation; 64 where the bf16 GEMM accumulates in bf16 (Debian's
  // 1.13 without AVX-512: core/runtime/runtime's probe reports it and compute=auto emulates there).
  const double dx = probe_kernels(cpu, torch::kBFloat16).fp32_accumulation ? 96.0 : 64.0;
  CHECK(x.grad().to(torch::kDouble).eq(dx).all().item<bool>());
  CHECK(w.grad().to(torch::kDouble).eq(128.0).all().item<bool>());  // 256 * 0.5
}

// ---------------------------------------------------------------------------
// Estimates before allocating (issue 15, defect 7: a config too large for the machine was
// OOM-killed without a word; now it exits 2 naming its keys)
// ---------------------------------------------------------------------------

#include <cstdlib>

#include "core/errors.hpp"
#include "app/registry.hpp"

TEST_CASE("MLP parameter count and the training-step terms follow the documented formula", "[memory]") {
  CHECK(mlp_param_count({784, 128, 10}) == 784.0 * 128 + 128 + 128.0 * 10 + 10);
  CHECK(mlp_param_count({5}) == 0);
  MemoryEstimate e;
  add_mlp_training(e, "net", {4, 8, 2}, /*batch=*/16, /*copies=*/3, /*saved=*/2, "/w", "/b");
  REQUIRE(e.terms.size() == 2);
  CHECK(e.terms[0].bytes == 3 * (4.0 * 8 + 8 + 8 * 2 + 2) * 4);
  CHECK(e.terms[1].bytes == 16 * (4 + 2.0 * (8 + 2)) * 4);
  CHECK(e.total() == e.terms[0].bytes + e.terms[1].bytes);
  e.times(2, "processes");
  CHECK(e.terms[0].bytes == 2 * 3 * (4.0 * 8 + 8 + 8 * 2 + 2) * 4);
}

TEST_CASE("MemAvailable is read from /proc/meminfo's text", "[memory]") {
  CHECK(parse_meminfo_available("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n") ==
        2048 * 1024);
  CHECK(parse_meminfo_available("MemTotal: 1 kB\n") == -1);
  CHECK(parse_meminfo_available("MemAvailable: x kB\n") == -1);
}

TEST_CASE("MPT_MEMORY_LIMIT_BYTES caps the memory, 0 turns the check off, garbage is a config error", "[memory]") {
  std::string source;
  ::setenv("MPT_MEMORY_LIMIT_BYTES", "12345", 1);
  CHECK(available_memory_bytes(&source) == 12345);
  CHECK(source == "MPT_MEMORY_LIMIT_BYTES");
  ::setenv("MPT_MEMORY_LIMIT_BYTES", "0", 1);
  CHECK(available_memory_bytes() == -1);
  ::setenv("MPT_MEMORY_LIMIT_BYTES", "4GB", 1);
  CHECK_THROWS_AS(available_memory_bytes(), ConfigError);
  ::unsetenv("MPT_MEMORY_LIMIT_BYTES");
  CHECK(available_memory_bytes(&source) > 0);  // this machine's MemAvailable
  CHECK(source == "MemAvailable in /proc/meminfo");
}

TEST_CASE("check_memory refuses an estimate above the limit, naming the keys of the largest terms", "[memory]") {
  MemoryEstimate e;
  e.add("parameters", "/model/width, /model/depth", 300.0 * (1LL << 30));
  e.add("activations", "/data/batch", 1.0 * (1LL << 20));
  CHECK_NOTHROW(check_memory(e, -1, "none"));                     // unknown: no check
  CHECK_NOTHROW(check_memory(e, 400LL * (1LL << 30), "test cap"));  // fits
  try {
    check_memory(e, 4LL * (1LL << 30), "test cap");
    FAIL("no error");
  } catch (const ConfigError& err) {
    const std::string m = err.what();
    CHECK(m.rfind("/model/width, /model/depth: this config needs about 300 GiB", 0) == 0);
    CHECK(m.find("/data/batch:") == std::string::npos);  // 0.0003% of the total: not what to change
    CHECK(m.find("more than the 4.00 GiB available (test cap)") != std::string::npos);
  }
  CHECK(human_bytes(512) == "512 bytes");
  CHECK(human_bytes(1536) == "1.50 KiB");
}

TEST_CASE("every experiment whose sizes are user-set estimates its memory, and defaults are small", "[memory]") {
  for (const char* name : {"underflow", "lossscale", "checkpoint", "accumulate", "dataparallel", "pipeline", "fp8", "fp4",
                           "shard", "collectives", "tensorparallel"}) {
    const Experiment* exp = find_experiment(name);
    REQUIRE(exp);
    INFO(name);
    REQUIRE(exp->memory);
    ConfigSpec spec = exp->spec();
    Config cfg = resolve_config(spec, "", {});
    const double bytes = exp->memory(cfg, 1).total();
    CHECK(bytes > 0);
    CHECK(bytes < 1024.0 * 1024 * 1024);  // the default configs run on a laptop
  }
  // The probe's case: checkpoint with width 65536 and depth 4 holds 4 x 2^32 weights (64 GiB
  // in fp32) before gradients; the estimate must see at least that.
  const Experiment* ckpt = find_experiment("checkpoint");
  ConfigSpec spec = ckpt->spec();
  Config big = resolve_config(spec, "", {"model.width=65536", "model.depth=4", "data.batch=8"});
  CHECK(ckpt->memory(big, 1).total() > 64.0 * (1LL << 30));
  // fp8's GPT section (the probe's case: 21.8 GB RSS): 8 blocks of width 2048 on 64 x 1024 tokens keep
  // L·s·b·h·(34 + 5as/h) x 2 (fp32) x 2 (quantized copies) = 8·1024·64·2048·74·4 bytes of activations.
  const Experiment* fp8 = find_experiment("fp8");
  ConfigSpec fp8_spec = fp8->spec();
  Config gpt = resolve_config(fp8_spec, "", {"gpt.enabled=true", "gpt.model.width=2048", "gpt.model.heads=16",
                                             "gpt.model.layers=8", "gpt.model.context=1024", "gpt.batch=64"});
  CHECK(fp8->memory(gpt, 1).total() >= 8.0 * 1024 * 64 * 2048 * 74 * 4);
}

TEST_CASE("gpt_activation_bytes: Korthikanti et al.'s per-block count in fp32, times the copies, plus the logits", "[memory]") {
  // 2 blocks, s = 8, b = 4, h = 16, a = 2, V = 10: per block 8·4·16·(34 + 5·2·8/16) = 19968 bytes
  // for 16-bit values; fp32 doubles it; the logits and their gradient: 3·4·8·10 fp32 values.
  CHECK(gpt_activation_bytes(2, 8, 4, 16, 2, 10) == 2 * 2 * 19968.0 + 3 * 4 * 8 * 10 * 4);
  CHECK(gpt_activation_bytes(2, 8, 4, 16, 2, 10, 2) == 2 * 2 * 2 * 19968.0 + 3 * 4 * 8 * 10 * 4);
}
