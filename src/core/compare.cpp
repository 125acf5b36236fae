// Result comparison. See compare.hpp.
#include "core/compare.hpp"

#include <fnmatch.h>

#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/config.hpp"
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

// An integer of JSON (signed or unsigned) held exactly.
__int128 as_int128(const json& v) {
  return v.is_number_unsigned() ? static_cast<__int128>(v.get<std::uint64_t>())
                                : static_cast<__int128>(v.get<std::int64_t>());
}

std::string kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "a number " + printable_json(v);
    case json::value_t::string: return "a string " + printable_json(v);
    case json::value_t::array: return "a list";
    case json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
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

Comparison compare_results(const json& base, const json& now, const CompareOptions& opt, const std::string& base_name,
                           const std::string& new_name) {
  const std::string names[2] = {printable_text(base_name, 200), printable_text(new_name, 200)};
  const json* docs[2] = {&base, &now};
  for (int i = 0; i < 2; ++i) {
    const json& d = *docs[i];
    if (!d.is_object())
      throw ConfigError(fmt::format("{}: /: expected a JSON object (an mpt result file), got {}", names[i], kind(d)));
    for (const char* key : {"schema_version", "experiment", "results"})
      if (!d.contains(key))
        throw ConfigError(fmt::format("{}: not an mpt result file: \"{}\" is missing", names[i], key));
    if (!d["results"].is_object())
      throw ConfigError(fmt::format("{}: /results: expected an object, got {}", names[i], kind(d["results"])));
    if (d.contains("checks") && !d["checks"].is_array())
      throw ConfigError(fmt::format("{}: /checks: expected a list, got {}", names[i], kind(d["checks"])));
  }
  for (const char* key : {"schema_version", "experiment"})
    if (base[key] != now[key])
      throw ConfigError(fmt::format("cannot compare: {} differs ({} vs {})", key, printable_json(base[key]),
                                    printable_json(now[key])));

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
      d.abs_diff = d.rel_diff = NAN;
      d.why = a.count(path) ? "only in base" : "only in new";
    } else if (x.is_number_integer() && y.is_number_integer()) {
      // Exactly, as integers: doubles would take 2^53 + 1 for 2^53.
      const __int128 u = as_int128(x), w = as_int128(y);
      const __int128 diff = w > u ? w - u : u - w;
      auto [rtol, atol] = tolerance_for(path, opt);
      const double base_abs = std::fabs(static_cast<double>(u));
      d.abs_diff = static_cast<double>(diff);
      d.rel_diff = u != 0 ? d.abs_diff / base_abs : (diff == 0 ? 0.0 : INFINITY);
      d.ok = diff == 0 || d.abs_diff <= atol + rtol * base_abs;
      d.why = "beyond tolerance";
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
        d.why = "beyond tolerance";
      } else {
        d.ok = x == y;
        d.abs_diff = d.rel_diff = NAN;  // no numeric difference to show
        d.why = nx && ny ? "differs" : "not numbers";
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
      // A base of 0 has no relative change (unless nothing changed): NaN, shown as "n/a".
      const double change = *u != 0 ? (*w - *u) / std::fabs(*u) : (*w == *u ? 0.0 : NAN);
      LeafDiff d{p, v, it->second, std::fabs(*w - *u), change, true};
      c.timings.push_back(d);
    }
  }
  return c;
}

Table comparison_table(const Comparison& c, const std::string& title) {
  Table t{"diffs", title,
          {text_col("path", "path"), text_col("base", "base"), text_col("new", "new"), sci_col("abs_diff", "abs diff"),
           sci_col("rel_diff", "rel diff", "-", 3)}};
  t.columns.push_back(text_col("why", "why"));
  auto show = [](const json& v, bool missing) {
    return missing ? std::string("(missing)") : v.is_string() ? printable_text(v.get<std::string>()) : printable_json(v);
  };
  // NaN marks "no numeric difference" (a missing or non-numeric leaf): "-", not a number.
  auto diff = [](const LeafDiff& d, double x) { return std::isnan(x) && d.why != "beyond tolerance" ? json() : num(x); };
  for (const auto& d : c.diffs)
    t.rows.push_back({{"path", printable_text(d.path, 200)},
                      {"base", show(d.base, d.why == "only in new")},
                      {"new", show(d.now, d.why == "only in base")},
                      {"abs_diff", diff(d, d.abs_diff)},
                      {"rel_diff", diff(d, d.rel_diff)},
                      {"why", d.why}});
  return t;
}

Table timings_table(const Comparison& c) {
  Table t{"timings", "Timings (informational): relative change new vs base",
          {text_col("path", "path"), float_col("base", "base"), float_col("new", "new"), pct_col("change", "change", 1)}};
  for (const auto& d : c.timings)
    t.rows.push_back({{"path", printable_text(d.path, 200)},
                      {"base", d.base.is_string() ? json(printable_text(d.base.get<std::string>())) : d.base},
                      {"new", d.now.is_string() ? json(printable_text(d.now.get<std::string>())) : d.now},
                      {"change", std::isnan(d.rel_diff) ? json("n/a") : json(d.rel_diff)}});
  return t;
}

}  // namespace mpt
