// Result comparison (core/compare): rows join by name, tolerances, non-finite values.
#include "catch.hpp"
#include "core/compare.hpp"
#include "core/errors.hpp"

using namespace mpt;

static json doc(json results, json checks = json::array()) {
  return {{"schema_version", 1}, {"experiment", "underflow"}, {"results", results}, {"checks", checks},
          {"timings", {{"wall_s", 1.0}}}};
}

TEST_CASE("rows join by name, not position", "[compare]") {
  json a = doc({{"t", {{{"name", "x"}, {"v", 1.0}}, {{"name", "y"}, {"v", 2.0}}}}});
  json b = doc({{"t", {{{"name", "y"}, {"v", 2.0}}, {{"name", "x"}, {"v", 1.0}}}}});
  auto c = compare_results(a, b, {});
  CHECK(c.ok());
  CHECK(c.compared == 2);
  auto flat = flatten(a["results"], "/results");
  CHECK(flat[0].first == "/results/t/x/v");
}

TEST_CASE("strict by default; rtol, atol and per-key globs loosen it", "[compare]") {
  json a = doc({{"g", {{{"name", "L1"}, {"mean", 1.0}, {"max", 10.0}}}}});
  json b = doc({{"g", {{{"name", "L1"}, {"mean", 1.0 + 1e-12}, {"max", 10.0}}}}});
  auto strict = compare_results(a, b, {});
  REQUIRE(strict.diffs.size() == 1);
  CHECK(strict.diffs[0].path == "/results/g/L1/mean");
  CHECK(strict.diffs[0].abs_diff == Approx(1e-12).epsilon(1e-3));
  CompareOptions loose;
  loose.rtol = 1e-9;
  CHECK(compare_results(a, b, loose).ok());
  CompareOptions per_key;
  per_key.per_key.push_back({"/results/g/*/mean", 0, 1e-11});
  CHECK(compare_results(a, b, per_key).ok());
  per_key.per_key[0].pattern = "/results/g/*/max";
  CHECK_FALSE(compare_results(a, b, per_key).ok());
}

TEST_CASE("non-finite values compare equal to themselves only", "[compare]") {
  json a = doc({{"x", "inf"}, {"y", "nan"}, {"z", 1.0}});
  CHECK(compare_results(a, a, {}).ok());
  json b = doc({{"x", 1.0}, {"y", "nan"}, {"z", "inf"}});
  auto c = compare_results(a, b, {});
  CHECK(c.diffs.size() == 2);
}

TEST_CASE("missing leaves, strings and checks are compared", "[compare]") {
  json a = doc({{"x", 1.0}, {"cls", "zero"}}, {{{"name", "c1"}, {"value", 0.0}, {"ok", true}}});
  json b = doc({{"cls", "subnormal"}}, {{{"name", "c1"}, {"value", 0.5}, {"ok", false}}});
  auto c = compare_results(a, b, {});
  std::vector<std::string> paths;
  for (auto& d : c.diffs) paths.push_back(d.path);
  CHECK(std::find(paths.begin(), paths.end(), "/results/x") != paths.end());
  CHECK(std::find(paths.begin(), paths.end(), "/results/cls") != paths.end());
  CHECK(std::find(paths.begin(), paths.end(), "/checks/c1/ok") != paths.end());
  CHECK(std::find(paths.begin(), paths.end(), "/checks/c1/value") != paths.end());
}

TEST_CASE("different experiments or schema versions are not comparable", "[compare]") {
  json a = doc({{"x", 1.0}});
  json b = a;
  b["experiment"] = "lossscale";
  CHECK_THROWS_AS(compare_results(a, b, {}), ConfigError);
  b = a;
  b["schema_version"] = 2;
  CHECK_THROWS_AS(compare_results(a, b, {}), ConfigError);
  CHECK_THROWS_AS(compare_results(a, json::object(), {}), ConfigError);
}

TEST_CASE("timings are reported, never failing", "[compare]") {
  json a = doc({{"x", 1.0}}), b = doc({{"x", 1.0}});
  b["timings"]["wall_s"] = 2.0;
  CompareOptions o;
  o.timings = true;
  auto c = compare_results(a, b, o);
  CHECK(c.ok());
  REQUIRE(c.timings.size() == 1);
  CHECK(c.timings[0].rel_diff == Approx(1.0));
}
