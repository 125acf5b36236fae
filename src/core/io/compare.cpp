// Result comparison. See compare.hpp.
#include "core/io/compare.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "core/io/config.hpp"
#include "core/errors.hpp"

namespace mpt {

namespace {

// Rows join by name only when every row has a distinct string "name"; with a repeated
// name (e.g. a sweep that lists a value twice) they join by position, so no row hides another.
bool all_named(const json& arr) {
  if (!arr.is_array() || arr.empty()) return false;
  std::unordered_set<std::string_view> seen;
  seen.reserve(arr.size());
  for (const auto& e : arr) {
    if (!e.is_object()) return false;
    auto name = e.find("name");
    if (name == e.end() || !name->is_string() || !seen.insert(name->get_ref<const std::string&>()).second)
      return false;
  }
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
std::optional<double> json_number(const json& v) {
  if (const std::string literal = exact_integer_literal(v); !literal.empty()) return std::strtod(literal.c_str(), nullptr);
  try {
    if (v.is_number() || v.is_string()) return decode_nonfinite(v);
  } catch (const std::invalid_argument&) {
  }
  return std::nullopt;
}

std::string kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "a number " + printable_json(v);
    case json::value_t::string: return "a string " + printable_json(v);
    case json::value_t::binary: return "a number " + printable_json(v);  // an integer beyond 64 bits
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

// --- exact integers -------------------------------------------------------------------

// An integer leaf held exactly: sign and decimal magnitude without leading zeros ("0" for 0).
struct ExactInteger {
  bool negative = false;
  std::string digits;
};

// The exact value of a JSON integer (int64, uint64) or of an integer literal beyond 64 bits
// (JsonLimits::exact_integers); nullopt for anything else.
std::optional<ExactInteger> exact_integer(const json& v) {
  std::string text;
  if (v.is_number_unsigned()) text = std::to_string(v.get<std::uint64_t>());
  else if (v.is_number_integer()) text = std::to_string(v.get<std::int64_t>());
  else text = exact_integer_literal(v);
  if (text.empty()) return std::nullopt;
  ExactInteger r;
  r.negative = text[0] == '-';
  const std::size_t first = text.find_first_not_of("-0");
  r.digits = first == std::string::npos ? "0" : text.substr(first);
  if (r.digits == "0") r.negative = false;  // -0 is 0
  return r;
}

// Compares two decimal magnitudes: <0, 0, >0.
int compare_magnitude(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a.compare(b);
}

// |a| + |b| and |a| - |b| (|a| >= |b|) of decimal magnitudes, schoolbook.
std::string add_magnitudes(const std::string& a, const std::string& b) {
  std::string r;
  int carry = 0;
  for (std::size_t i = 0; i < std::max(a.size(), b.size()) || carry; ++i) {
    int d = carry;
    if (i < a.size()) d += a[a.size() - 1 - i] - '0';
    if (i < b.size()) d += b[b.size() - 1 - i] - '0';
    r.push_back(static_cast<char>('0' + d % 10));
    carry = d / 10;
  }
  std::reverse(r.begin(), r.end());
  return r;
}
std::string subtract_magnitudes(const std::string& a, const std::string& b) {
  std::string r;
  int borrow = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    int d = a[a.size() - 1 - i] - '0' - borrow - (i < b.size() ? b[b.size() - 1 - i] - '0' : 0);
    borrow = d < 0;
    r.push_back(static_cast<char>('0' + (d + 10) % 10));
  }
  while (r.size() > 1 && r.back() == '0') r.pop_back();
  std::reverse(r.begin(), r.end());
  return r;
}

// |w - u| of two exact integers, as a decimal magnitude.
std::string distance(const ExactInteger& u, const ExactInteger& w) {
  if (u.negative != w.negative) return add_magnitudes(u.digits, w.digits);
  return compare_magnitude(u.digits, w.digits) >= 0 ? subtract_magnitudes(u.digits, w.digits)
                                                    : subtract_magnitudes(w.digits, u.digits);
}

// --- the join -------------------------------------------------------------------------

// How flatten() treats a value: a leaf, an object (its keys), a list of distinctly named rows
// (their names), another list (its indices); `absent`: not on this side.
enum class Shape { absent, leaf, object, named, list };

// A node of the tree flatten() walks: a JSON value, or a named row, which is the object of its
// fields other than "name".
struct Node {
  const json* v = nullptr;
  bool row = false;
};

Shape shape_of(const Node& n) {
  if (!n.v) return Shape::absent;
  if (n.row || n.v->is_object()) return Shape::object;
  if (all_named(*n.v)) return Shape::named;
  if (n.v->is_array()) return Shape::list;
  return Shape::leaf;
}

const std::string& row_name(const json& row) { return row.find("name")->get_ref<const std::string&>(); }

// Joins two result trees leaf by leaf, as flatten() on both sides and a join by path would,
// in time linear in their size: it walks both trees at once and builds a path only as a
// running buffer (and a string only for a leaf that differs). Objects are std::maps (keys in
// order) and join by a merge; lists by index; named rows in the same order pairwise, else
// through a hash table. A key or row name that holds '/' can make two different walks end
// at the same path; below such a node both sides are flattened and joined by path instead.
class Joiner {
 public:
  Joiner(const CompareOptions& opt, Comparison& c) : opt_(opt), c_(c) {}

  /// Joins the subtrees `a` (base) and `b` (new) found at `prefix`.
  void run(const std::string& prefix, const Node& a, const Node& b) {
    path_ = prefix;
    join(a, b);
  }

 private:
  // Appends "/" + segment to the path for the duration of one call of `f`.
  template <typename F>
  void under(std::string_view segment, F&& f) {
    const std::size_t n = path_.size();
    path_ += '/';
    path_.append(segment.data(), segment.size());
    f();
    path_.resize(n);
  }

  static bool has_slash(const Node& n, Shape s) {
    if (s == Shape::object) {
      for (auto it = n.v->begin(); it != n.v->end(); ++it)
        if (it.key().find('/') != std::string::npos) return true;
    } else if (s == Shape::named) {
      for (const auto& e : *n.v)
        if (row_name(e).find('/') != std::string::npos) return true;
    }
    return false;
  }

  // The (segment, child) pairs of a container node, in flatten()'s order; `storage` holds the
  // index segments of a list.
  static void children(const Node& n, Shape s, std::vector<std::pair<std::string_view, Node>>& out,
                       std::vector<std::string>& storage) {
    if (s == Shape::object) {
      for (auto it = n.v->begin(); it != n.v->end(); ++it)
        if (!(n.row && it.key() == "name")) out.emplace_back(it.key(), Node{&it.value()});
    } else if (s == Shape::named) {
      for (const auto& e : *n.v) out.emplace_back(row_name(e), Node{&e, true});
    } else if (s == Shape::list) {
      storage.reserve(n.v->size());  // no reallocation: the views point into it
      for (std::size_t i = 0; i < n.v->size(); ++i) {
        storage.push_back(std::to_string(i));
        out.emplace_back(storage.back(), Node{&(*n.v)[i]});
      }
    }
  }

  void join(const Node& a, const Node& b) {
    const Shape sa = shape_of(a), sb = shape_of(b);
    if (sa == Shape::leaf || sb == Shape::leaf) {
      // A leaf at this path; a container on the other side has its leaves below it, at other paths.
      leaf(sa == Shape::leaf ? a.v : nullptr, sb == Shape::leaf ? b.v : nullptr);
      if (sa != Shape::leaf && sa != Shape::absent) join(a, Node{});
      if (sb != Shape::leaf && sb != Shape::absent) join(Node{}, b);
      return;
    }
    if (has_slash(a, sa) || has_slash(b, sb)) return join_flat(a, b);
    if (sa == Shape::object && sb == Shape::object) {  // a merge of two sorted key sequences
      auto skip = [](const Node& n, json::const_iterator it) {
        while (n.row && it != n.v->end() && it.key() == "name") ++it;
        return it;
      };
      auto i = skip(a, a.v->begin()), j = skip(b, b.v->begin());
      while (i != a.v->end() || j != b.v->end()) {
        const int order = i == a.v->end() ? 1 : j == b.v->end() ? -1 : i.key().compare(j.key());
        if (order <= 0) {
          under(i.key(), [&] { join(Node{&i.value()}, order == 0 ? Node{&j.value()} : Node{}); });
          i = skip(a, std::next(i));
          if (order == 0) j = skip(b, std::next(j));
        } else {
          under(j.key(), [&] { join(Node{}, Node{&j.value()}); });
          j = skip(b, std::next(j));
        }
      }
      return;
    }
    if (sa == Shape::list && sb == Shape::list) {
      for (std::size_t i = 0; i < std::max(a.v->size(), b.v->size()); ++i)
        under(std::to_string(i), [&] {
          join(i < a.v->size() ? Node{&(*a.v)[i]} : Node{}, i < b.v->size() ? Node{&(*b.v)[i]} : Node{});
        });
      return;
    }
    if (sa == Shape::named && sb == Shape::named && a.v->size() == b.v->size() &&
        std::equal(a.v->begin(), a.v->end(), b.v->begin(),
                   [](const json& x, const json& y) { return row_name(x) == row_name(y); })) {
      for (std::size_t i = 0; i < a.v->size(); ++i)  // the same rows in the same order: pairwise
        under(row_name((*a.v)[i]), [&] { join(Node{&(*a.v)[i], true}, Node{&(*b.v)[i], true}); });
      return;
    }
    // Any other pair (rows reordered, a list on one side and an object on the other, or one side
    // absent): by segment, through a hash table of the base's.
    std::vector<std::pair<std::string_view, Node>> ca, cb;
    std::vector<std::string> storage_a, storage_b;
    if (sa != Shape::absent) children(a, sa, ca, storage_a);
    if (sb != Shape::absent) children(b, sb, cb, storage_b);
    std::unordered_map<std::string_view, std::size_t> index;
    index.reserve(ca.size());
    for (std::size_t k = 0; k < ca.size(); ++k) index.emplace(ca[k].first, k);
    std::vector<bool> matched(ca.size(), false);
    for (const auto& segment_child : cb) {  // a pair, not a structured binding: lambdas capture it (C++17)
      const Node& child = segment_child.second;
      auto it = index.find(segment_child.first);
      Node other;
      if (it != index.end()) other = ca[it->second].second, matched[it->second] = true;
      under(segment_child.first, [&] { join(other, child); });
    }
    for (std::size_t k = 0; k < ca.size(); ++k)
      if (!matched[k]) under(ca[k].first, [&] { join(ca[k].second, Node{}); });
  }

  // flatten() of a node into path -> leaf (a later leaf at the same path replaces an earlier one).
  static void flatten_node(const Node& n, const std::string& path, std::map<std::string, const json*>& out) {
    if (!n.v) return;
    if (n.row) {
      for (auto it = n.v->begin(); it != n.v->end(); ++it)
        if (it.key() != "name") flatten_node(Node{&it.value()}, path + "/" + it.key(), out);
    } else if (n.v->is_object()) {
      for (auto it = n.v->begin(); it != n.v->end(); ++it) flatten_node(Node{&it.value()}, path + "/" + it.key(), out);
    } else if (all_named(*n.v)) {
      for (const auto& e : *n.v) flatten_node(Node{&e, true}, path + "/" + row_name(e), out);
    } else if (n.v->is_array()) {
      for (std::size_t i = 0; i < n.v->size(); ++i) flatten_node(Node{&(*n.v)[i]}, path + "/" + std::to_string(i), out);
    } else {
      out[path] = n.v;
    }
  }

  // Below a key or name with '/': both sides flattened and joined by path.
  void join_flat(const Node& a, const Node& b) {
    std::map<std::string, const json*> fa, fb;
    flatten_node(a, path_, fa);
    flatten_node(b, path_, fb);
    std::map<std::string, std::pair<const json*, const json*>> joined;
    for (const auto& [p, v] : fa) joined[p].first = v;
    for (const auto& [p, v] : fb) joined[p].second = v;
    const std::string saved = path_;
    for (const auto& [p, pr] : joined) {
      path_ = p;
      leaf(pr.first, pr.second);
    }
    path_ = saved;
  }

  // The first tolerance rule whose pattern matches the current path, or nullptr.
  const KeyTolerance* rule() const {
    for (const auto& k : opt_.per_key)
      if (fnmatch(k.pattern.c_str(), path_.c_str(), 0) == 0) return &k;
    return nullptr;
  }

  // Compares the leaf at the current path; `x` or `y` is nullptr when that side has none.
  void leaf(const json* x, const json* y) {
    const KeyTolerance* r = rule();
    if (r && r->unbounded) {
      ++c_.unbounded;
      return;
    }
    ++c_.compared;
    const double rtol = r ? r->rtol : opt_.rtol, atol = r ? r->atol : opt_.atol;
    bool ok;
    double abs_diff = NAN, rel_diff = NAN;
    std::string why = "beyond tolerance";
    if (!x || !y) {  // present on one side only
      ok = false;
      why = x ? "only in base" : "only in new";
    } else if (x->is_number_integer() && y->is_number_integer()) {
      // Exactly, as integers: doubles would take 2^53 + 1 for 2^53.
      const __int128 u = as_int128(*x), w = as_int128(*y);
      const __int128 diff = w > u ? w - u : u - w;
      const double base_abs = std::fabs(static_cast<double>(u));
      abs_diff = static_cast<double>(diff);
      rel_diff = u != 0 ? abs_diff / base_abs : (diff == 0 ? 0.0 : INFINITY);
      ok = diff == 0 || abs_diff <= atol + rtol * base_abs;
    } else if (auto u = exact_integer(*x), w = exact_integer(*y); u && w) {
      // An integer beyond 64 bits on either side: exactly, in decimal.
      const std::string diff = distance(*u, *w);
      const double base_abs = std::strtod(u->digits.c_str(), nullptr);
      abs_diff = std::strtod(diff.c_str(), nullptr);
      rel_diff = u->digits != "0" ? abs_diff / base_abs : (diff == "0" ? 0.0 : INFINITY);
      ok = diff == "0" || abs_diff <= atol + rtol * base_abs;
    } else {
      auto nx = json_number(*x), ny = json_number(*y);
      if (nx && ny && (is_numeric(*x) || is_numeric(*y))) {
        const double u = *nx, w = *ny;
        if (std::isnan(u) || std::isnan(w)) {
          ok = std::isnan(u) && std::isnan(w);
          abs_diff = rel_diff = ok ? 0.0 : NAN;
        } else if (std::isinf(u) || std::isinf(w)) {
          ok = u == w;
          abs_diff = rel_diff = ok ? 0.0 : INFINITY;
        } else {
          abs_diff = std::fabs(w - u);
          rel_diff = u != 0 ? abs_diff / std::fabs(u) : (abs_diff == 0 ? 0.0 : INFINITY);
          ok = abs_diff <= atol + rtol * std::fabs(u);
        }
      } else {
        ok = *x == *y;  // no numeric difference to show
        why = nx && ny ? "differs" : "not numbers";
      }
    }
    if (ok) return;
    LeafDiff d{path_, x ? *x : json(), y ? *y : json(), abs_diff, rel_diff, false, why};
    c_.diffs.push_back(std::move(d));
  }

  // A JSON number or an integer literal beyond 64 bits.
  static bool is_numeric(const json& v) { return v.is_number() || !exact_integer_literal(v).empty(); }

  // An integer of JSON (signed or unsigned) held exactly.
  static __int128 as_int128(const json& v) {
    return v.is_number_unsigned() ? static_cast<__int128>(v.get<std::uint64_t>())
                                  : static_cast<__int128>(v.get<std::int64_t>());
  }

  const CompareOptions& opt_;
  Comparison& c_;
  std::string path_;  // the path of the node being joined
};

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
  Joiner joiner(opt, c);
  joiner.run("/results", Node{&base["results"]}, Node{&now["results"]});
  const json checks_a = checks_by_name(base), checks_b = checks_by_name(now);
  joiner.run("/checks", Node{&checks_a}, Node{&checks_b});
  // In path order, as a join of flattened paths lists them.
  std::sort(c.diffs.begin(), c.diffs.end(), [](const LeafDiff& x, const LeafDiff& y) { return x.path < y.path; });
  if (opt.timings && base.contains("timings") && now.contains("timings")) {
    std::map<std::string, json> tb;
    for (auto& [p, v] : flatten(now["timings"], "/timings")) tb[p] = v;
    for (auto& [p, v] : flatten(base["timings"], "/timings")) {
      auto it = tb.find(p);
      auto u = json_number(v);
      if (it == tb.end() || !u) continue;
      auto w = json_number(it->second);
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
