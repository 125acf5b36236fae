// Floating-point error bounds: the one place for a format's unit roundoff, Higham's γ_n and the
// bound on two summation orders of the same terms. Tolerance files (io/tolerance), ZeRO's
// reduction check (parallel/zero) and tensor parallelism's checks (parallel/tp) all read them.
// Source: N. J. Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed. (2002), §2.1
// (unit roundoff), §3.1 (γ_n) and eq. 3.5 (recursive summation).
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

namespace mpt::bounds {

/// Unit roundoff u = 2^−p of a format with p significand bits (the implicit one included):
/// fp64 2^−53, fp32 2^−24, tf32 and fp16 2^−11, bf16 2^−8. Throws std::invalid_argument for any
/// other name ("fp64", "fp32", "tf32", "fp16", "bf16").
double unit_roundoff(const std::string& format);

/// unit_roundoff of a floating dtype (kDouble, kFloat, kHalf, kBFloat16); throws
/// std::invalid_argument for any other.
double unit_roundoff(torch::ScalarType dtype);

/// fp32's unit roundoff, 2^−24.
inline constexpr double kFp32UnitRoundoff = 1.0 / 16777216.0;

/// γ_n = n·u / (1 − n·u) (Higham §3.1): n successive roundings with unit roundoff u multiply a
/// value by some (1 + θ), |θ| ≤ γ_n. Throws std::invalid_argument when n·u ≥ 1 (no bound).
double gamma(int64_t n, double u = kFp32UnitRoundoff);

/// The reordering bound: a sum of n terms computed in any order is within γ_{n−1}·Σ|x_i| of the
/// exact sum (Higham eq. 3.5), so two orders differ by at most 2·γ_{n−1}·Σ|x_i|. `abs_sum` is
/// Σ|x_i| (any units; the bound has the same). n ≤ 1 sums exactly: 0.
double reorder(int64_t n, double abs_sum, double u = kFp32UnitRoundoff);

}  // namespace mpt::bounds
