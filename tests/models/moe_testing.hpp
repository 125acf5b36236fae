// Helpers of the mixture-of-experts tests (tests/models/moe_test.cpp, tests/parallel/ep_test.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "core/models/moe.hpp"

namespace mpt::testing {

/// An integer tensor's values, in order (any integer dtype, any shape).
inline std::vector<int64_t> int_values(const torch::Tensor& t) {
  auto c = t.contiguous().to(torch::kLong);
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

/// A MoeConfig of E experts, top-k, capacity factor cf and balancing b (the other fields default).
inline moe::MoeConfig moe_config(int64_t E, int64_t k, double cf, moe::Balance b = moe::Balance::None) {
  moe::MoeConfig m;
  m.experts = E;
  m.top_k = k;
  m.capacity_factor = cf;
  m.balance = b;
  return m;
}

}  // namespace mpt::testing
