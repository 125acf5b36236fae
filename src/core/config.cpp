// Config schema, merge and strict validation. See config.hpp.
#include "core/config.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "core/errors.hpp"

namespace mpt {

namespace {

const char* type_name(ParamType t) {
  switch (t) {
    case ParamType::Bool: return "a boolean";
    case ParamType::Int: return "an integer";
    case ParamType::Number: return "a number";
    case ParamType::String: return "a string";
    case ParamType::IntList: return "a list of integers";
    case ParamType::NumberList: return "a list of numbers";
    case ParamType::StringList: return "a list of strings";
  }
  return "?";
}

std::string json_kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "a list";
    case json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

std::string shown(const json& v) {
  if (v.is_null()) return "";  // json_kind already says "null"
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// "a string \"abc\"", "an integer 7", "null": what a value is, then the value itself.
std::string got(const json& v) {
  const std::string s = shown(v);
  return s.empty() ? json_kind(v) : json_kind(v) + " " + s;
}

std::string bounds_text(const Param& p) {
  std::string s;
  auto num = [](double d) { return fmt::format("{:g}", d); };
  if (p.exclusive_min) s += " > " + num(*p.exclusive_min);
  if (p.min) s += (s.empty() ? " >= " : " and >= ") + num(*p.min);
  if (p.exclusive_max) s += (s.empty() ? " < " : " and < ") + num(*p.exclusive_max);
  if (p.max) s += (s.empty() ? " <= " : " and <= ") + num(*p.max);
  return s;
}

[[noreturn]] void fail(const std::string& source, const std::string& pointer, const std::string& msg) {
  throw ConfigError(fmt::format("{}: {}: {}", source, pointer.empty() ? "/" : pointer, msg));
}

// An integer that JSON wrote as 12.0 is still accepted as an integer.
bool is_integral(const json& v) {
  if (v.is_number_integer()) return true;
  if (v.is_number_float()) {
    double d = v.get<double>();
    return std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15;
  }
  return false;
}

void check_scalar(const Param& p, ParamType scalar, const json& v, const std::string& source,
                  const std::string& ptr, const std::string& what) {
  const std::string expected = fmt::format("expected {}{}", what, bounds_text(p));
  switch (scalar) {
    case ParamType::Bool:
      if (!v.is_boolean()) fail(source, ptr, fmt::format("expected a boolean (true/false), got {}", got(v)));
      return;
    case ParamType::String:
      if (!v.is_string()) fail(source, ptr, fmt::format("expected a string, got {}", got(v)));
      if (!p.choices.empty() &&
          std::find(p.choices.begin(), p.choices.end(), v.get<std::string>()) == p.choices.end()) {
        std::string list;
        for (auto& c : p.choices) list += (list.empty() ? "" : ", ") + ("\"" + c + "\"");
        std::string hint = nearest(v.get<std::string>(), p.choices);
        fail(source, ptr, fmt::format("expected one of {}, got {}{}", list, shown(v),
                                      hint.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", hint)));
      }
      return;
    case ParamType::Int:
    case ParamType::Number: {
      bool ok = scalar == ParamType::Int ? is_integral(v) : v.is_number();
      if (!ok) fail(source, ptr, fmt::format("{}, got {}", expected, got(v)));
      double d = v.get<double>();
      if (!std::isfinite(d) || (p.min && d < *p.min) || (p.max && d > *p.max) ||
          (p.exclusive_min && d <= *p.exclusive_min) || (p.exclusive_max && d >= *p.exclusive_max))
        fail(source, ptr, fmt::format("{}, got {}", expected, shown(v)));
      return;
    }
    default: break;
  }
}

ParamType element_type(ParamType t) {
  switch (t) {
    case ParamType::IntList: return ParamType::Int;
    case ParamType::NumberList: return ParamType::Number;
    case ParamType::StringList: return ParamType::String;
    default: return t;
  }
}

bool is_list(ParamType t) {
  return t == ParamType::IntList || t == ParamType::NumberList || t == ParamType::StringList;
}

}  // namespace

// ---------------------------------------------------------------------------
// ConfigSpec
// ---------------------------------------------------------------------------

ConfigSpec& ConfigSpec::add(const std::string& pointer, Param p) {
  if (pointer.empty() || pointer[0] != '/' || pointer.back() == '/')
    throw std::logic_error("ConfigSpec: malformed pointer " + pointer);
  if (!params_.emplace(pointer, std::move(p)).second)
    throw std::logic_error("ConfigSpec: duplicate pointer " + pointer);
  return *this;
}

ConfigSpec& ConfigSpec::boolean(const std::string& ptr, bool def, std::string doc) {
  return add(ptr, Param{ParamType::Bool, def, std::move(doc)});
}
ConfigSpec& ConfigSpec::integer(const std::string& ptr, long long def, std::string doc, std::optional<double> min,
                                std::optional<double> max) {
  return add(ptr, Param{ParamType::Int, def, std::move(doc), min, max});
}
ConfigSpec& ConfigSpec::number(const std::string& ptr, double def, std::string doc, std::optional<double> min,
                               std::optional<double> max) {
  return add(ptr, Param{ParamType::Number, def, std::move(doc), min, max});
}
ConfigSpec& ConfigSpec::choice(const std::string& ptr, std::string def, std::vector<std::string> choices,
                               std::string doc) {
  Param p{ParamType::String, def, std::move(doc)};
  p.choices = std::move(choices);
  return add(ptr, std::move(p));
}
ConfigSpec& ConfigSpec::string(const std::string& ptr, std::string def, std::string doc) {
  return add(ptr, Param{ParamType::String, def, std::move(doc)});
}
ConfigSpec& ConfigSpec::integers(const std::string& ptr, std::vector<long long> def, std::string doc,
                                 std::optional<double> min, std::optional<double> max) {
  return add(ptr, Param{ParamType::IntList, def, std::move(doc), min, max});
}
ConfigSpec& ConfigSpec::numbers(const std::string& ptr, std::vector<double> def, std::string doc,
                                std::optional<double> min, std::optional<double> max) {
  return add(ptr, Param{ParamType::NumberList, def, std::move(doc), min, max});
}
ConfigSpec& ConfigSpec::strings(const std::string& ptr, std::vector<std::string> def,
                                std::vector<std::string> choices, std::string doc) {
  Param p{ParamType::StringList, def, std::move(doc)};
  p.choices = std::move(choices);
  return add(ptr, std::move(p));
}

json ConfigSpec::defaults() const {
  json out = json::object();
  for (const auto& [ptr, p] : params_) out[json::json_pointer(ptr)] = p.default_value;
  return out;
}

const Param* ConfigSpec::find(const std::string& pointer) const {
  auto it = params_.find(pointer);
  return it == params_.end() ? nullptr : &it->second;
}

bool ConfigSpec::is_object_prefix(const std::string& pointer) const {
  const std::string prefix = pointer + "/";
  auto it = params_.lower_bound(prefix);
  return it != params_.end() && it->first.compare(0, prefix.size(), prefix) == 0;
}

std::vector<std::string> ConfigSpec::child_keys(const std::string& object_pointer) const {
  std::vector<std::string> keys;
  const std::string prefix = object_pointer + "/";
  for (const auto& [ptr, p] : params_) {
    if (ptr.compare(0, prefix.size(), prefix) != 0) continue;
    std::string rest = ptr.substr(prefix.size());
    std::string key = rest.substr(0, rest.find('/'));
    if (keys.empty() || keys.back() != key) keys.push_back(key);
  }
  return keys;
}

void ConfigSpec::validate_value(const std::string& ptr, const json& v, const std::string& source) const {
  const Param* p = find(ptr);
  if (!p) throw std::logic_error("validate_value: no such parameter " + ptr);
  if (is_list(p->type)) {
    if (!v.is_array()) fail(source, ptr, fmt::format("expected {}, got {}", type_name(p->type), got(v)));
    if (v.empty()) fail(source, ptr, fmt::format("expected {} (non-empty), got []", type_name(p->type)));
    for (std::size_t i = 0; i < v.size(); ++i)
      check_scalar(*p, element_type(p->type), v[i], source, ptr + "/" + std::to_string(i),
                   type_name(element_type(p->type)));
    return;
  }
  if (p->scalar_or_list && v.is_array()) {
    if (v.empty()) fail(source, ptr, fmt::format("expected {} or a non-empty list of them, got []", type_name(p->type)));
    for (std::size_t i = 0; i < v.size(); ++i)
      check_scalar(*p, p->type, v[i], source, ptr + "/" + std::to_string(i), type_name(p->type));
    return;
  }
  check_scalar(*p, p->type, v, source, ptr,
               p->scalar_or_list ? std::string(type_name(p->type)) + " (or a list of them)" : type_name(p->type));
}

void ConfigSpec::validate_object(const json& obj, const std::string& pointer, const std::string& source) const {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string key = it.key();
    std::string escaped = key;
    // RFC 6901 escaping for the message: ~ -> ~0, / -> ~1.
    for (std::size_t i = 0; (i = escaped.find('~', i)) != std::string::npos; i += 2) escaped.replace(i, 1, "~0");
    for (std::size_t i = 0; (i = escaped.find('/', i)) != std::string::npos; i += 2) escaped.replace(i, 1, "~1");
    const std::string child = pointer + "/" + escaped;
    if (find(child)) {
      validate_value(child, it.value(), source);
    } else if (is_object_prefix(child)) {
      if (!it.value().is_object())
        fail(source, child, fmt::format("expected an object, got {}", got(it.value())));
      validate_object(it.value(), child, source);
    } else {
      auto keys = child_keys(pointer);
      std::string hint = nearest(key, keys);
      std::string known;
      for (auto& k : keys) known += (known.empty() ? "" : ", ") + k;
      fail(source, child,
           fmt::format("unknown key \"{}\"{}; known keys here: {}", key,
                       hint.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", hint), known));
    }
  }
}

void ConfigSpec::validate(const json& partial, const std::string& source) const {
  if (!partial.is_object()) fail(source, "", fmt::format("expected a JSON object at the top level, got {}", json_kind(partial)));
  validate_object(partial, "", source);
}

// ---------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------

const json& Config::at(const std::string& ptr) const {
  if (!spec_->find(ptr)) throw std::logic_error("Config: parameter not in schema: " + ptr);
  return json_.at(json::json_pointer(ptr));
}

bool Config::boolean(const std::string& ptr) const { return at(ptr).get<bool>(); }
long long Config::integer(const std::string& ptr) const { return static_cast<long long>(at(ptr).get<double>()); }
double Config::number(const std::string& ptr) const { return at(ptr).get<double>(); }
std::string Config::str(const std::string& ptr) const { return at(ptr).get<std::string>(); }

std::vector<long long> Config::integers(const std::string& ptr) const {
  const json& v = at(ptr);
  std::vector<long long> out;
  if (v.is_array())
    for (const auto& e : v) out.push_back(static_cast<long long>(e.get<double>()));
  else
    out.push_back(static_cast<long long>(v.get<double>()));
  return out;
}

std::vector<double> Config::numbers(const std::string& ptr) const {
  const json& v = at(ptr);
  std::vector<double> out;
  if (v.is_array())
    for (const auto& e : v) out.push_back(e.get<double>());
  else
    out.push_back(v.get<double>());
  return out;
}

std::vector<std::string> Config::strings(const std::string& ptr) const {
  return at(ptr).get<std::vector<std::string>>();
}

// ---------------------------------------------------------------------------
// Loading and merging
// ---------------------------------------------------------------------------

namespace {

// json::parse, and the JSON pointer of the first key that appears twice in one object
// ("" when none): nlohmann keeps the last value of a repeated key without a word.
json parse_rejecting_duplicates(const std::string& text, std::string* duplicate) {
  struct Frame {
    bool object = false;
    std::set<std::string> keys;
    std::string key;  // object: the current key
    long index = -1;  // array: the current element
  };
  std::vector<Frame> stack;
  auto escape = [](std::string k) {  // RFC 6901: '~' -> "~0", '/' -> "~1"
    std::string out;
    for (char c : k) out += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
    return out;
  };
  auto element_starts = [&] {
    if (!stack.empty() && !stack.back().object) ++stack.back().index;
  };
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
        element_starts();
        stack.push_back(Frame{true, {}, {}, -1});
        break;
      case json::parse_event_t::array_start:
        element_starts();
        stack.push_back(Frame{false, {}, {}, -1});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case json::parse_event_t::key: {
        auto& top = stack.back();
        top.key = parsed.get<std::string>();
        if (!top.keys.insert(top.key).second && duplicate->empty()) {
          std::string ptr;
          for (const auto& f : stack) ptr += "/" + (f.object ? escape(f.key) : std::to_string(f.index));
          *duplicate = ptr;
        }
        break;
      }
      case json::parse_event_t::value:
        element_starts();
        break;
    }
    return true;
  };
  return json::parse(text, cb);
}

}  // namespace

json read_json_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(fmt::format("{}: is a directory, not a {}", path, what));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open the {} ({})", path, what, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ConfigError(fmt::format("{}: cannot read the {}", path, what));
  try {
    std::string duplicate;
    json doc = parse_rejecting_duplicates(ss.str(), &duplicate);
    if (!duplicate.empty())
      throw ConfigError(fmt::format("{}: {}: duplicate key: expected each key once per object (JSON would silently "
                                    "keep only the last value)", path, duplicate));
    return doc;
  } catch (const json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 3, column 1: ..."
    // (or out_of_range.406 for a number beyond double's range, e.g. 1e400)
    std::string what = e.what();
    auto pos = what.find("] ");
    throw ConfigError(fmt::format("{}: invalid JSON: {}", path, pos == std::string::npos ? what : what.substr(pos + 2)));
  }
}

std::string to_pointer(const std::string& key) {
  if (key.empty()) throw ConfigError("--set: empty key");
  std::string ptr = key;
  if (key[0] != '/') {
    ptr = "/";
    for (char c : key) ptr += (c == '.') ? '/' : c;
  }
  if (ptr.find("//") != std::string::npos || ptr.back() == '/')
    throw ConfigError("--set '" + key + "': empty key segment in the path");
  return ptr;
}

Config resolve_config(const ConfigSpec& spec, const std::string& file, const std::vector<std::string>& sets) {
  json cfg = spec.defaults();
  if (!file.empty()) {
    json from_file = read_json_file(file);
    spec.validate(from_file, file);
    cfg.merge_patch(from_file);  // objects merge key by key; leaves (incl. lists) replace
  }
  for (const auto& s : sets) {
    auto eq = s.find('=');
    const std::string source = fmt::format("--set '{}'", s);
    if (eq == std::string::npos || eq == 0)
      throw ConfigError(fmt::format("{}: expected KEY=VALUE (e.g. model.depth=8)", source));
    const std::string ptr = to_pointer(s.substr(0, eq));
    try {
      json::json_pointer check(ptr);  // e.g. a stray '~' is not a valid JSON pointer
    } catch (const json::exception&) {
      throw ConfigError(fmt::format("{}: {}: not a valid key path", source, ptr));
    }
    const std::string text = s.substr(eq + 1);
    json value;
    std::string duplicate;
    try {
      value = parse_rejecting_duplicates(text, &duplicate);
    } catch (const json::exception&) {
      value = text;  // not JSON (or a number beyond double's range): a plain string
    }
    if (!duplicate.empty())
      throw ConfigError(fmt::format("{}: {}{}: duplicate key: expected each key once per object", source, ptr,
                                    duplicate));
    if (!spec.find(ptr)) {
      // Reuse the object walk for a precise message (unknown key, with a suggestion).
      json probe = json::object();
      probe[json::json_pointer(ptr)] = value;
      spec.validate(probe, source);
      throw ConfigError(fmt::format("{}: {}: not a settable leaf (it is an object)", source, ptr));
    }
    spec.validate_value(ptr, value, source);
    cfg[json::json_pointer(ptr)] = value;
  }
  return Config(&spec, std::move(cfg));
}

// ---------------------------------------------------------------------------
// Suggestions
// ---------------------------------------------------------------------------

std::size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment distance: insertions, deletions, substitutions and
  // transpositions of neighbours ("fp61" is one edit from "fp16") each cost 1.
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  // Like ninja's "did you mean": only close matches (a third of the length, at least 2 edits allowed).
  std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  return best_d <= limit ? best : std::string();
}

}  // namespace mpt
