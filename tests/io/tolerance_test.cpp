// Tolerance files for `mpt compare --tol-file` (core/io/tolerance).
#include "catch.hpp"
#include "core/errors.hpp"
#include "core/io/tolerance.hpp"

#include <cmath>

using namespace mpt;

TEST_CASE("unit roundoff of each format", "[tolerance]") {
  CHECK(unit_roundoff("fp32") == std::ldexp(1.0, -24));
  CHECK(unit_roundoff("bf16") == std::ldexp(1.0, -8));
  CHECK(unit_roundoff("fp16") == std::ldexp(1.0, -11));
  CHECK(unit_roundoff("fp64") == std::ldexp(1.0, -53));
  CHECK_THROWS_AS(unit_roundoff("fp61"), ConfigError);
}

TEST_CASE("tolerance expressions: numbers, u(F) and Higham's gamma_n", "[tolerance]") {
  const double u = std::ldexp(1.0, -24);
  CHECK(eval_tolerance_expr("0", "t") == 0);
  CHECK(eval_tolerance_expr("u(fp32)", "t") == u);
  CHECK(eval_tolerance_expr("2*gamma(fp32, 784)", "t") == Approx(2 * 784 * u / (1 - 784 * u)).epsilon(1e-15));
  CHECK(eval_tolerance_expr("3 * gamma(fp32, 8*6) * 0.5", "t") == Approx(1.5 * 48 * u / (1 - 48 * u)).epsilon(1e-15));
  CHECK(eval_tolerance_expr("gamma(fp32, 2*7*10 + 8 + 8)", "t") == Approx(156 * u / (1 - 156 * u)).epsilon(1e-15));
  CHECK(eval_tolerance_expr("u(fp32) + 2*u(fp16)", "t") == Approx(u + 2 * std::ldexp(1.0, -11)).epsilon(1e-15));
  CHECK_THROWS_WITH(eval_tolerance_expr("gamma(bf16, 256)", "f:3"), Catch::Contains("N*u >= 1"));
  CHECK_THROWS_WITH(eval_tolerance_expr("gamma(fp32, 2.5)", "f:3"), Catch::Contains("positive integer"));
  CHECK_THROWS_WITH(eval_tolerance_expr("sqrt(2)", "f:3"), Catch::Contains("unknown function"));
  CHECK_THROWS_WITH(eval_tolerance_expr("-1", "f:3"), Catch::Contains(">= 0"));
  CHECK_THROWS_WITH(eval_tolerance_expr("1e-6 junk", "f:3"), Catch::Contains("unexpected text"));
  CHECK_THROWS_WITH(eval_tolerance_expr("u(fp61)", "f:3"), Catch::Contains("f:3") && Catch::Contains("fp61"));
}

TEST_CASE("tolerance files: rules in order, comments, errors with file and line", "[tolerance]") {
  const double u = std::ldexp(1.0, -24);
  auto rules = parse_tolerance_text("# header\n"
                                    "/results/formats/*   exact   # format facts\n"
                                    "\n"
                                    "/results/g/*/mean    rel 2*gamma(fp32, 10)\n"
                                    "/checks/*/value      abs 4*u(fp32)\n"
                                    "/results/loss/*      rel u(fp32) abs 1e-9\n"
                                    "\"/checks/max |a - b|/value\"  abs u(fp32)  # a quoted glob\n",
                                    "x.tol");
  REQUIRE(rules.size() == 5);
  CHECK(rules[4].pattern == "/checks/max |a - b|/value");
  CHECK(rules[4].atol == u);
  CHECK(rules[0].pattern == "/results/formats/*");
  CHECK(rules[0].rtol == 0);
  CHECK(rules[0].atol == 0);
  CHECK(rules[1].rtol == Approx(2 * 10 * u / (1 - 10 * u)));
  CHECK(rules[1].atol == 0);
  CHECK(rules[2].rtol == 0);
  CHECK(rules[2].atol == 4 * u);
  CHECK(rules[3].rtol == u);
  CHECK(rules[3].atol == 1e-9);
  CHECK_THROWS_WITH(parse_tolerance_text("/a  roughly 1e-6\n", "x.tol"), Catch::Contains("x.tol:1"));
  CHECK_THROWS_WITH(parse_tolerance_text("\n\nresults/a exact\n", "x.tol"), Catch::Contains("x.tol:3"));
  CHECK_THROWS_WITH(parse_tolerance_text("/a rel\n", "x.tol"), Catch::Contains("x.tol:1"));
  CHECK_THROWS_WITH(parse_tolerance_text("\"/a b  exact\n", "x.tol"), Catch::Contains("unterminated"));
  CHECK_THROWS_AS(read_tolerance_file("/no/such/file.tol"), ConfigError);
}

TEST_CASE("compare: tolerance rules apply first match first, unbounded leaves are left out and counted", "[tolerance]") {
  auto doc = [](double loss, double frac, double grad) {
    return nlohmann::json{{"schema_version", 1},
                          {"experiment", "x"},
                          {"results", {{"loss", loss}, {"underflow_fraction", frac}, {"grad", grad}}},
                          {"checks", nlohmann::json::array()}};
  };
  CompareOptions opt;
  opt.per_key = parse_tolerance_text("/results/loss                rel 2*gamma(fp32, 100)\n"
                                     "/results/underflow_fraction  unbounded\n",
                                     "t.tol");
  // loss: 1e-6 relative is inside 2*gamma_100 (~1.2e-5), 1e-4 is not; grad: exact by default.
  auto ok = compare_results(doc(2.0, 0.25, 0.5), doc(2.0 * (1 + 1e-6), 0.0, 0.5), opt);
  CHECK(ok.ok());
  CHECK(ok.unbounded == 1);
  CHECK(ok.compared == 2);
  CHECK_FALSE(compare_results(doc(2.0, 0.25, 0.5), doc(2.0 * (1 + 1e-4), 0.25, 0.5), opt).ok());
  CHECK_FALSE(compare_results(doc(2.0, 0.25, 0.5), doc(2.0, 0.25, 0.5 + 1e-12), opt).ok());
}

TEST_CASE("a tolerance that overflows to infinity is refused with file and line", "[tolerance]") {
  // Each number is finite; the product is not. Accepted, it failed equal values (inf * 0 is NaN).
  CHECK_THROWS_WITH(parse_tolerance_text("# header\n/results/a  rel 1e300*1e300\n", "x.tol"),
                    Catch::Contains("x.tol:2") && Catch::Contains("not finite"));
  CHECK_THROWS_WITH(parse_tolerance_text("/a  abs 1e308 + 1e308\n", "y.tol"),
                    Catch::Contains("y.tol:1") && Catch::Contains("not finite"));
  CHECK_THROWS_WITH(parse_tolerance_text("/a  rel 1e-6 abs 1e200*1e200*u(fp32)\n", "z.tol"),
                    Catch::Contains("z.tol:1") && Catch::Contains("not finite"));
  CHECK(eval_tolerance_expr("1e300*1e8", "f:1") == 1e308);  // large but finite is a tolerance
}

TEST_CASE("tolerance files: a tab between a rule and its value", "[tolerance]") {
  const double u = std::ldexp(1.0, -24);
  auto rules = parse_tolerance_text("/results/a\trel\t2*u(fp32)\n"
                                    "/results/b\tabs\t1e-9\n"
                                    "/results/c\trel u(fp32)\tabs\t1e-9\t# tab-aligned\n"
                                    "/results/d\t\texact\n",
                                    "t.tol");
  REQUIRE(rules.size() == 4);
  CHECK(rules[0].rtol == 2 * u);
  CHECK(rules[1].atol == 1e-9);
  CHECK(rules[2].rtol == u);
  CHECK(rules[2].atol == 1e-9);
  CHECK(rules[3].rtol == 0);
  CHECK(rules[3].atol == 0);
  // A word run into its value is still no rule.
  CHECK_THROWS_WITH(parse_tolerance_text("/a rel1e-6\n", "t.tol"), Catch::Contains("t.tol:1"));
  CHECK_THROWS_WITH(parse_tolerance_text("/a rel 1e-6 abs1e-9\n", "t.tol"), Catch::Contains("t.tol:1"));
}
