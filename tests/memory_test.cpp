// The memory meter counts what the allocator hands out (core/memory).
#include "catch.hpp"
#include "core/memory.hpp"

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
