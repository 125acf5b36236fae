// Result comparison (core/io/compare): rows join by name, tolerances, non-finite values.
#include "catch.hpp"
#include "core/io/compare.hpp"
#include "core/io/config.hpp"
#include "core/errors.hpp"

#include <functional>
#include <map>
#include <random>
#include <set>

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

// --- issue 38, item 10: exact integers beyond 64 bits; the join equals a join of flattened paths ---

TEST_CASE("integers beyond 64 bits compare exactly (2^64 + 1 vs 2^64 + 2 differ)", "[compare][hostile]") {
  auto read = [](const std::string& results) {
    return parse_json_text(R"({"schema_version": 1, "experiment": "underflow", "results": )" + results + "}",
                           "r.json", kResultLimits);
  };
  const json a = read(R"({"big": 18446744073709551617, "neg": -18446744073709551617, "mixed": 18446744073709551616})");
  const json b = read(R"({"big": 18446744073709551618, "neg": -18446744073709551617, "mixed": 18446744073709551615})");
  CHECK(compare_results(a, a, {}).ok());
  auto c = compare_results(a, b, {});
  CHECK(c.compared == 3);
  REQUIRE(c.diffs.size() == 2);  // "neg" is equal
  CHECK(c.diffs[0].path == "/results/big");
  CHECK(c.diffs[0].abs_diff == 1.0);
  CHECK(c.diffs[1].path == "/results/mixed");  // beyond 64 bits vs a uint64: still exact
  CHECK(c.diffs[1].abs_diff == 1.0);
  const std::string table = render_table(comparison_table(c, "t"));
  CHECK_THAT(table, Catch::Contains("18446744073709551617") && Catch::Contains("18446744073709551618"));
  CompareOptions loose;
  loose.atol = 1;
  CHECK(compare_results(a, b, loose).ok());
  // Far beyond 64 bits, and of opposite signs: the distance is exact too.
  const json x = read(R"({"v": 100000000000000000000000000000000000000001})");
  const json y = read(R"({"v": -100000000000000000000000000000000000000001})");
  auto far = compare_results(x, y, {});
  REQUIRE(far.diffs.size() == 1);
  CHECK(far.diffs[0].abs_diff == Approx(2e41));
  CHECK(far.diffs[0].rel_diff == Approx(2.0));
  // A float of the same magnitude is a number like any other (compared as doubles).
  CHECK(compare_results(read(R"({"v": 1e20})"), read(R"({"v": 100000000000000000000})"), {}).ok());
}

// The join by path that compare_results must equal: flatten() both sides, join the paths (a
// later leaf at the same path replaces an earlier one), a leaf differs when it is missing on
// one side or its values differ.
static std::pair<std::size_t, std::vector<std::string>> join_of_flattened(const json& a, const json& b) {
  std::map<std::string, std::pair<json, json>> joined;
  std::set<std::string> in_a, in_b;
  for (auto& [p, v] : flatten(a["results"], "/results")) joined[p].first = v, in_a.insert(p);
  for (auto& [p, v] : flatten(b["results"], "/results")) joined[p].second = v, in_b.insert(p);
  std::vector<std::string> differ;
  for (auto& [p, xy] : joined)
    if (!in_a.count(p) || !in_b.count(p) || xy.first != xy.second) differ.push_back(p);
  return {joined.size(), differ};
}

TEST_CASE("the join equals a join of flattened paths, '/' in keys and names included", "[compare][hostile]") {
  // Keys and names with '/' make different trees flatten to the same path; rows named as list
  // indices; a named list on one side and an object on the other; a leaf against a container.
  // In a, "/results/a/b" is both a["a"]["b"] (1) and a["a/b"] (2): the later leaf, 2, stands.
  json a = doc({{"a/b", 2}, {"a", {{"b", 1}, {"c", 3}}}, {"rows", {{{"name", "x"}, {"v", 1}}, {{"name", "y/z"}, {"v", 2}}}}});
  json b = doc({{"a", {{"b", 2}, {"c", 4}}}, {"rows", {{"x", {{"v", 1}}}, {"y", {{"z", {{"v", 2}}}}}}}});
  auto expected = join_of_flattened(a, b);
  auto c = compare_results(a, b, {});
  std::vector<std::string> got;
  for (const auto& d : c.diffs) got.push_back(d.path);
  CHECK(c.compared == expected.first);
  CHECK(got == expected.second);
  CHECK(c.compared == 4);
  CHECK(got == std::vector<std::string>{"/results/a/c"});

  // Random documents over a small alphabet of keys, names and values.
  std::mt19937 rng(38);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  const std::vector<std::string> keys = {"0", "1", "a", "b", "a/b", "b/0", "name"};
  const std::vector<json> leaves = {0, 1, 1.5, "x", true, nullptr};
  std::function<json(int)> gen = [&](int depth) -> json {
    const int kind = depth >= 3 ? 0 : pick(4);
    if (kind == 0) return leaves[static_cast<std::size_t>(pick(6))];
    json v = kind == 1 ? json::object() : json::array();
    const int n = pick(4);
    for (int i = 0; i < n; ++i) {
      if (kind == 1) {
        v[keys[static_cast<std::size_t>(pick(7))]] = gen(depth + 1);
      } else if (kind == 2) {  // rows, usually distinctly named
        json row = {{"name", keys[static_cast<std::size_t>(pick(6))]}};
        row[keys[static_cast<std::size_t>(pick(6))]] = gen(depth + 1);
        v.push_back(row);
      } else {
        v.push_back(gen(depth + 1));
      }
    }
    return v;
  };
  int checked = 0;
  for (int t = 0; t < 3000; ++t) {
    json x = doc(json::object()), y = doc(json::object());
    x["results"] = json::object({{"r", gen(0)}, {"s", gen(1)}});
    y["results"] = t % 3 == 0 ? x["results"] : json::object({{"r", gen(0)}, {"s", gen(1)}});
    if (t % 3 == 1) y["results"]["s"] = x["results"]["s"];
    auto want = join_of_flattened(x, y);
    auto have = compare_results(x, y, {});
    std::vector<std::string> paths;
    for (const auto& d : have.diffs) paths.push_back(d.path);
    INFO("base " << x["results"].dump() << "\nnew  " << y["results"].dump());
    REQUIRE(have.compared == want.first);
    REQUIRE(paths == want.second);
    ++checked;
  }
  CHECK(checked == 3000);
}
