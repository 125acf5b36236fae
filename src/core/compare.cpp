// Result comparison. See compare.hpp.
#include "core/compare.hpp"

#include <fnmatch.h>

#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/errors.hpp"

namespace mpt {

namespace {

// Rows join by name only when every row has a distinct string "name"; with a repeated
// name (e.g. a sweep that lists a value twice) they join by position, so no row hides another.
bool all_named(const json& arr) {
  if (!arr.is_array() || arr.empty()) return false;
  std::set<std::string> seen;
  for (const auto& e : arr)
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !seen.insert(e["name"].get<std::string>()).second)
      return false;
  return true;
}

void flatten_into(const json& v, const std::string& path, std::vector<std::pair<std::string, json>>& out) {
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) flatten_into(it.value(), path + "/" + it.key(), out);
  } else if (all_named(v)) {
    for (const auto& e : v) {
      const std::string row = path + "/" + e["name"].get<std::string>();
      for (auto it = e.begin(); it != e.end(); ++it)
        if (it.key() != "name") flatten_into(it.value(), row + "/" + it.key(), out);
    }
  } else if (v.is_array()) {
    for (std::size_t i = 0; i < v.size(); ++i) flatten_into(v[i], path + "/" + std::to_string(i), out);
  } else {
    out.emplace_back(path, v);
  }
}

// A number, or one of the non-finite encodings.
std::optional<double> as_number(const json& v) {
  try {
    if (v.is_number() || v.is_string()) return decode_nonfinite(v);
  } catch (const std::invalid_argument&) {
  }
  return std::nullopt;
}

std::pair<double, double> tolerance_for(const std::string& path, const CompareOptions& opt) {
  for (const auto& k : opt.per_key)
    if (fnmatch(k.pattern.c_str(), path.c_str(), 0) == 0) return {k.rtol, k.atol};
  return {opt.rtol, opt.atol};
}

bool is_unbounded(const std::string& path, const CompareOptions& opt) {
  for (const auto& k : opt.per_key)
    if (fnmatch(k.pattern.c_str(), path.c_str(), 0) == 0) return k.unbounded;
  return false;
}

// The checks array joins by check name as well.
json checks_by_name(const json& doc) {
  json out = json::object();
  if (doc.contains("checks") && doc["checks"].is_array())
    for (const auto& c : doc["checks"])
      if (c.is_object() && c.contains("name") && c["name"].is_string()) out[c["name"].get<std::string>()] = c;
  return out;
}

}  // namespace

std::vector<std::pair<std::string, json>> flatten(const json& v, const std::string& prefix) {
  std::vector<std::pair<std::string, json>> out;
  flatten_into(v, prefix, out);
  return out;
}

Comparison compare_results(const json& base, const json& now, const CompareOptions& opt) {
  for (const char* key : {"schema_version", "experiment"}) {
    if (!base.contains(key) || !now.contains(key))
      throw ConfigError(fmt::format("not an mpt result file: \"{}\" is missing", key));
    if (base[key] != now[key])
      throw ConfigError(fmt::format("cannot compare: {} differs ({} vs {})", key, base[key].dump(), now[key].dump()));
  }
  if (!base.contains("results") || !now.contains("results"))
    throw ConfigError("not an mpt result file: \"results\" is missing");

  Comparison c;
  auto collect = [](const json& doc) {
    std::map<std::string, json> m;
    for (auto& [p, v] : flatten(doc["results"], "/results")) m[p] = v;
    for (auto& [p, v] : flatten(checks_by_name(doc), "/checks")) m[p] = v;
    return m;
  };
  auto a = collect(base), b = collect(now);
  std::map<std::string, std::pair<json, json>> joined;
  for (auto& [p, v] : a) joined[p].first = v;
  for (auto& [p, v] : b) joined[p].second = v;
  for (auto& [path, pr] : joined) {
    const json &x = pr.first, &y = pr.second;
    if (is_unbounded(path, opt)) {
      ++c.unbounded;
      continue;
    }
    ++c.compared;
    LeafDiff d{path, x, y};
    if (!a.count(path) || !b.count(path)) {  // present on one side only
      d.ok = false;
    } else {
      auto nx = as_number(x), ny = as_number(y);
      if (nx && ny && (x.is_number() || y.is_number())) {
        const double u = *nx, w = *ny;
        if (std::isnan(u) || std::isnan(w)) {
          d.ok = std::isnan(u) && std::isnan(w);
          d.abs_diff = d.rel_diff = d.ok ? 0.0 : NAN;
        } else if (std::isinf(u) || std::isinf(w)) {
          d.ok = u == w;
          d.abs_diff = d.rel_diff = d.ok ? 0.0 : INFINITY;
        } else {
          auto [rtol, atol] = tolerance_for(path, opt);
          d.abs_diff = std::fabs(w - u);
          d.rel_diff = u != 0 ? d.abs_diff / std::fabs(u) : (d.abs_diff == 0 ? 0.0 : INFINITY);
          d.ok = d.abs_diff <= atol + rtol * std::fabs(u);
        }
      } else {
        d.ok = x == y;
      }
    }
    if (!d.ok) c.diffs.push_back(d);
  }
  if (opt.timings && base.contains("timings") && now.contains("timings")) {
    std::map<std::string, json> tb;
    for (auto& [p, v] : flatten(now["timings"], "/timings")) tb[p] = v;
    for (auto& [p, v] : flatten(base["timings"], "/timings")) {
      auto it = tb.find(p);
      auto u = as_number(v);
      if (it == tb.end() || !u) continue;
      auto w = as_number(it->second);
      if (!w) continue;
      LeafDiff d{p, v, it->second, std::fabs(*w - *u), *u != 0 ? (*w - *u) / std::fabs(*u) : 0.0, true};
      c.timings.push_back(d);
    }
  }
  return c;
}

Table comparison_table(const Comparison& c, const std::string& title) {
  Table t{"diffs", title,
          {text_col("path", "path"), text_col("base", "base"), text_col("new", "new"), sci_col("abs_diff", "abs diff"),
           sci_col("rel_diff", "rel diff", "-", 3)}};
  auto show = [](const json& v) { return v.is_null() ? std::string("(missing)") : v.is_string() ? v.get<std::string>() : v.dump(); };
  for (const auto& d : c.diffs)
    t.rows.push_back({{"path", d.path}, {"base", show(d.base)}, {"new", show(d.now)}, {"abs_diff", num(d.abs_diff)},
                      {"rel_diff", num(d.rel_diff)}});
  return t;
}

}  // namespace mpt
