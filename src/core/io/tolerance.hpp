// Tolerance files: per-key tolerances for `mpt compare --tol-file`, each derived from a
// floating-point error bound written in the file itself rather than a number picked to pass.
//
//   # PATTERN (fnmatch glob on compare's leaf paths; "quoted" when it holds spaces)    RULE
//   /results/formats/*                                  exact
//   /results/gradients/*/mean_abs                       rel 2*gamma(fp32, 8*6+8)
//   /checks/*micro*/value                               abs 4*gamma(fp32, 64)*1.0
//
// RULE is `exact`, `unbounded` (not compared: no bound can be derived; the file says why and
// which bounded statistic stands in), `rel EXPR`, `abs EXPR` or `rel EXPR abs EXPR`; EXPR is a sum (`+`) of products (`*`)
// of numbers, `u(F)` (the unit roundoff of format F: 2^-24 fp32, 2^-11 fp16, 2^-8 bf16, 2^-53
// fp64) and `gamma(F, N)` = N·u/(1 − N·u), Higham's bound on the relative error of N
// accumulated roundings (Accuracy and Stability of Numerical Algorithms, 2nd ed., §3.1), with
// N itself a sum of products of integers (e.g. 2*7*10 + 8 + 8). docs/results.md states the policy and each file's header the
// derivation. Everything after `#` is a comment. Words are separated by spaces or tabs. A
// bound must be finite: an expression that overflows (1e300*1e300) is refused with file and line.
#pragma once

#include <string>
#include <vector>

#include "core/io/compare.hpp"

namespace mpt {

/// Unit roundoff u = 2^-p of a format named fp64, fp32, tf32, fp16 or bf16 (p = significand
/// bits including the implicit one). Throws ConfigError for another name.
double unit_roundoff(const std::string& format);

/// Evaluates a tolerance expression (see the file comment), e.g. "2*gamma(fp32, 784*3)".
/// Throws ConfigError naming `where` and what was expected, for malformed input, when
/// N·u >= 1 (the bound is then void) or when the value is not finite (e.g. 1e300*1e300).
double eval_tolerance_expr(const std::string& expr, const std::string& where);

/// Parses the text of a tolerance file into rules, in file order (first match wins).
/// `name` is used in error messages ("FILE:LINE: ..."). Throws ConfigError.
std::vector<KeyTolerance> parse_tolerance_text(const std::string& text, const std::string& name);

/// Reads and parses a tolerance file. Throws ConfigError when it cannot be read or parsed.
std::vector<KeyTolerance> read_tolerance_file(const std::string& path);

}  // namespace mpt
