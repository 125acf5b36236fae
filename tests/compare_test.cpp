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

TEST_CASE("strict by default, rtol, atol and per-key globs loosen it", "[compare]") {
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

// --- hostile or odd result files (issue 15: defects 4, 11) ---

TEST_CASE("a malformed results, checks or document is not comparable (exit 2)", "[compare][hostile]") {
  json a = doc({{"x", 1.0}});
  for (json bad : {json("x"), json(3), json::array({1})}) {
    json b = a;
    b["results"] = bad;
    try {
      compare_results(a, b, {}, "a.json", "b.json");
      FAIL("expected a ConfigError");
    } catch (const ConfigError& e) {
      CHECK_THAT(e.what(), Catch::Contains("b.json: /results: expected an object"));
    }
  }
  json b = a;
  b["checks"] = "none";
  CHECK_THROWS_AS(compare_results(a, b, {}), ConfigError);
  CHECK_THROWS_WITH(compare_results(json::array({1}), a, {}, "a.json"),
                    Catch::Contains("a.json: /: expected a JSON object"));
}

TEST_CASE("missing and non-numeric leaves show as differing, not as a difference of 0", "[compare][hostile]") {
  json a = doc({{"x", 1.0}, {"s", "p"}}), b = doc({{"s", "q"}, {"y", 2}});
  auto c = compare_results(a, b, {});
  REQUIRE(c.diffs.size() == 3);
  std::string table = render_table(comparison_table(c, "t"));
  CHECK_THAT(table, Catch::Contains("only in base"));
  CHECK_THAT(table, Catch::Contains("only in new"));
  CHECK_THAT(table, Catch::Contains("not numbers"));
  CHECK_THAT(table, !Catch::Contains("0.000e+00"));
  for (const auto& d : c.diffs) CHECK(std::isnan(d.abs_diff));
}

TEST_CASE("integers above 2^53 compare exactly", "[compare][hostile]") {
  json a = doc({{"n", 9007199254740993LL}, {"u", 18446744073709551615ULL}});
  json b = doc({{"n", 9007199254740992LL}, {"u", 18446744073709551614ULL}});
  auto c = compare_results(a, b, {});
  REQUIRE(c.diffs.size() == 2);
  CHECK(c.diffs[0].abs_diff == 1.0);
  CHECK(compare_results(a, a, {}).ok());
  CompareOptions loose;
  loose.atol = 1;
  CHECK(compare_results(a, b, loose).ok());
}

TEST_CASE("a timing whose base is 0 shows n/a, not a change of 0", "[compare][hostile]") {
  json a = doc({{"x", 1.0}}), b = a;
  a["timings"]["zero_s"] = 0;
  b["timings"]["zero_s"] = 0.5;
  CompareOptions o;
  o.timings = true;
  auto c = compare_results(a, b, o);
  std::string table = render_table(timings_table(c));
  CHECK_THAT(table, Catch::Contains("n/a"));
}

TEST_CASE("control characters in result keys and values are escaped in the table", "[compare][hostile]") {
  json a = doc({{"\x1b[31mred", "\x1b[2J"}}), b = doc({{"\x1b[31mred", "x"}});
  std::string table = render_table(comparison_table(compare_results(a, b, {}), "t"));
  CHECK(table.find('\x1b') == std::string::npos);
  CHECK_THAT(table, Catch::Contains("\\x1b[31mred"));
}
