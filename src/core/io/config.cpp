// Config schema, merge and strict validation: ConfigSpec, Config's typed reads, and resolving a
// config from defaults, a file and --set. See config.hpp; JSON text itself (reading, checked
// parsing, printable messages): config_json.cpp.
#include "core/io/config.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "core/errors.hpp"
#include "core/io/config_detail.hpp"

namespace mpt {

namespace {

using config_detail::config_error;
using config_detail::parse_rejecting_duplicates;
using config_detail::TooDeep;
using config_detail::Overflow;
using config_detail::Underflow;
using config_detail::valid_utf8;

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
  return printable_json(v);
}

// "a string \"abc\"", "an integer 7", "null": what a value is, then the value itself.
std::string got(const json& v) {
  const std::string s = shown(v);
  return s.empty() ? json_kind(v) : json_kind(v) + " " + s;
}

// A bound exactly as it is (1048576, not 1.04858e+06): integers in full, else the shortest
// text that reads back as the same double.
std::string exact_number(double d) {
  if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e18) return fmt::format("{}", static_cast<long long>(d));
  return fmt::format("{}", d);
}

std::string bounds_text(const Param& p) {
  std::string s;
  auto num = [](double d) { return exact_number(d); };
  if (p.exclusive_min) s += " > " + num(*p.exclusive_min);
  if (p.min) s += (s.empty() ? " >= " : " and >= ") + num(*p.min);
  if (p.exclusive_max) s += (s.empty() ? " < " : " and < ") + num(*p.exclusive_max);
  if (p.max) s += (s.empty() ? " <= " : " and <= ") + num(*p.max);
  return s;
}


[[noreturn]] void fail(const std::string& source, const std::string& pointer, const std::string& msg) {
  config_error(fmt::format("{}: {}: {}", source, pointer.empty() ? "/" : printable_text(pointer, 120), msg));
}

// "nan", "inf", "-inf" as the result files write them (Param::non_finite), else nullopt.
std::optional<double> non_finite_value(const std::string& s) {
  if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf") return -std::numeric_limits<double>::infinity();
  return std::nullopt;
}

double as_number(const json& v) {
  if (v.is_string()) {
    if (auto d = non_finite_value(v.get<std::string>())) return *d;
  }
  return v.get<double>();
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
      if (!v.is_string()) {
        std::string list;  // a choice names its values: `true` for "on" is a wrong type and a wrong value at once
        for (const auto& c : p.choices) list += (list.empty() ? "" : ", ") + fmt::format("\"{}\"", c);
        fail(source, ptr, p.choices.empty() ? fmt::format("expected a string, got {}", got(v))
                                            : fmt::format("expected a string, one of {}, got {}", list, got(v)));
      }
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
      if (p.non_finite && v.is_string() && non_finite_value(v.get<std::string>())) return;
      bool ok = scalar == ParamType::Int ? is_integral(v) : v.is_number();
      if (!ok)
        fail(source, ptr, fmt::format("{}{}, got {}", expected, p.non_finite ? " or one of \"nan\", \"inf\", \"-inf\"" : "",
                                      got(v)));
      // An integer read back as long long must fit one (18446744073709551615 does not).
      if (scalar == ParamType::Int && v.is_number_unsigned() &&
          v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<long long>::max()))
        fail(source, ptr, fmt::format("{} (and at most {}), got {}", expected, std::numeric_limits<long long>::max(),
                                      shown(v)));
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

// Each element of a list whose elements name table rows appears once (an exit 2 before any work,
// not a table with two rows of one name at the end of the run).
void check_unique(const Param& p, const json& v, const std::string& source, const std::string& ptr) {
  if (!p.unique && !(p.type == ParamType::StringList && !p.choices.empty())) return;
  std::map<json, std::size_t> first;  // value -> its first index (n log n: lists hold up to kMaxListLength)
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto [it, fresh] = first.emplace(v[i], i);
    if (!fresh)
      fail(source, ptr + "/" + std::to_string(i),
           fmt::format("expected each value once, got {} again (also {}/{})", shown(v[i]), ptr, it->second));
  }
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

ConfigSpec& ConfigSpec::distinct(const std::string& pointer) {
  auto it = params_.find(pointer);
  if (it == params_.end()) throw std::logic_error("ConfigSpec::distinct: no such parameter " + pointer);
  it->second.unique = true;
  return *this;
}

ConfigSpec& ConfigSpec::non_finite(const std::string& pointer) {
  auto it = params_.find(pointer);
  if (it == params_.end()) throw std::logic_error("ConfigSpec::non_finite: no such parameter " + pointer);
  if (it->second.type != ParamType::Number && it->second.type != ParamType::NumberList)
    throw std::logic_error("ConfigSpec::non_finite: not a number (list): " + pointer);
  it->second.non_finite = true;
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
    if (v.size() > kMaxListLength)
      fail(source, ptr, fmt::format("expected {} of at most {} elements, got a list of {}", type_name(p->type),
                                    kMaxListLength, v.size()));
    for (std::size_t i = 0; i < v.size(); ++i)
      check_scalar(*p, element_type(p->type), v[i], source, ptr + "/" + std::to_string(i),
                   type_name(element_type(p->type)));
    check_unique(*p, v, source, ptr);
    return;
  }
  if (p->scalar_or_list && v.is_array()) {
    if (v.empty()) fail(source, ptr, fmt::format("expected {} or a non-empty list of them, got []", type_name(p->type)));
    if (v.size() > kMaxListLength)
      fail(source, ptr, fmt::format("expected {} or a list of at most {} of them, got a list of {}",
                                    type_name(p->type), kMaxListLength, v.size()));
    for (std::size_t i = 0; i < v.size(); ++i)
      check_scalar(*p, p->type, v[i], source, ptr + "/" + std::to_string(i), type_name(p->type));
    check_unique(*p, v, source, ptr);
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
           fmt::format("unknown key \"{}\"{}; known keys here: {}", printable_text(key),
                       hint.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", hint), known));
    }
  }
}

void ConfigSpec::validate(const json& partial, const std::string& source) const {
  if (!partial.is_object())
    fail(source, "", fmt::format("expected a JSON object at the top level, got {}", json_kind(partial)));
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
namespace {
// Exact for JSON integers (no detour through double, which rounds above 2^53); validation
// keeps integral doubles below 9e15 and integers within long long.
long long as_integer(const json& v) {
  return v.is_number_integer() ? v.get<long long>() : static_cast<long long>(v.get<double>());
}
}  // namespace

long long Config::integer(const std::string& ptr) const { return as_integer(at(ptr)); }
double Config::number(const std::string& ptr) const { return as_number(at(ptr)); }
std::string Config::str(const std::string& ptr) const { return at(ptr).get<std::string>(); }

std::vector<long long> Config::integers(const std::string& ptr) const {
  const json& v = at(ptr);
  std::vector<long long> out;
  if (v.is_array())
    for (const auto& e : v) out.push_back(as_integer(e));
  else
    out.push_back(as_integer(v));
  return out;
}

std::vector<double> Config::numbers(const std::string& ptr) const {
  const json& v = at(ptr);
  std::vector<double> out;
  if (v.is_array())
    for (const auto& e : v) out.push_back(as_number(e));
  else
    out.push_back(as_number(v));
  return out;
}

std::vector<std::string> Config::strings(const std::string& ptr) const {
  return at(ptr).get<std::vector<std::string>>();
}

// ---------------------------------------------------------------------------
// Loading and merging
// ---------------------------------------------------------------------------

namespace {



// Parses one --set value: JSON when it parses, else the text as a string. Throws ConfigError
// for a too deep value, a repeated key, or text that is not UTF-8 (it could not be stored).
json parse_set_value(const std::string& text, const std::string& source, const std::string& ptr) {
  std::string duplicate;
  json value;
  try {
    value = parse_rejecting_duplicates(text, &duplicate, kConfigLimits.max_depth);
  } catch (const TooDeep&) {
    fail(source, ptr, fmt::format("the value is nested deeper than {} levels, the most a config may have",
                                  kConfigLimits.max_depth));
  } catch (const Underflow& u) {
    fail(source, ptr + u.ptr, fmt::format("expected a number that is 0 or at least 4.9e-324 in magnitude (a double), "
                                          "got {}: it would read as 0", printable_text(u.text, 60)));
  } catch (const Overflow& o) {
    fail(source, ptr + o.ptr, fmt::format("expected a number within double's range (magnitude at most 1.8e308), got {}",
                                          printable_text(o.text, 60)));
  } catch (const json::exception&) {
    // A JSON number that does not parse is one beyond double's range (1e400): an error, not the
    // string "1e400" that a later check would call "a string" (found by the stop-28 probe).
    static const std::regex number(R"(\s*-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?\s*)");
    if (std::regex_match(text, number))
      fail(source, ptr, fmt::format("expected a number within double's range (magnitude at most 1.8e308), got {}",
                                    printable_text(text, 60)));
    value = text;  // not JSON: a plain string
    // A string that is not UTF-8 could be neither printed nor stored in the result file.
    if (!valid_utf8(text)) fail(source, ptr, "expected UTF-8 text, got bytes that are not UTF-8");
  }
  if (!duplicate.empty())
    config_error(fmt::format("{}: {}{}: duplicate key: expected each key once per object", source,
                             printable_text(ptr, 120), duplicate));
  return value;
}

// The tokens of a JSON pointer that json::json_pointer accepted ("~1" -> "/", "~0" -> "~").
std::vector<std::string> pointer_tokens(const std::string& ptr) {
  std::vector<std::string> tokens;
  std::size_t start = 1;
  while (start <= ptr.size()) {
    std::size_t end = ptr.find('/', start);
    if (end == std::string::npos) end = ptr.size();
    std::string t;
    for (std::size_t i = start; i < end; ++i) {
      if (ptr[i] == '~' && i + 1 < end) {
        t += ptr[i + 1] == '1' ? '/' : '~';
        ++i;
      } else {
        t += ptr[i];
      }
    }
    tokens.push_back(t);
    start = end + 1;
  }
  return tokens;
}

Config resolve(const ConfigSpec& spec, const json* from_file, const std::string& file_source,
               const std::vector<std::string>& sets) {
  json cfg = spec.defaults();
  if (from_file) {
    spec.validate(*from_file, file_source);
    cfg.merge_patch(*from_file);  // objects merge key by key; leaves (incl. lists) replace
  }
  for (const auto& s : sets) {
    auto eq = s.find('=');
    const std::string source = fmt::format("--set '{}'", printable_text(s));
    if (eq == std::string::npos || eq == 0)
      config_error(fmt::format("{}: expected KEY=VALUE (e.g. model.depth=8)", source));
    const std::string ptr = to_pointer(s.substr(0, eq));
    try {
      json::json_pointer check(ptr);  // e.g. a stray '~' is not a valid JSON pointer
    } catch (const json::exception&) {
      fail(source, ptr, "not a valid key path");
    }
    const json value = parse_set_value(s.substr(eq + 1), source, ptr);
    if (!spec.find(ptr)) {
      // Reuse the object walk for a precise message (unknown key, with a suggestion). Built
      // key by key: json_pointer would make "/a/99999999" an array of 10^8 nulls.
      json probe = json::object();
      json* at = &probe;
      for (const auto& t : pointer_tokens(ptr)) {
        (*at)[t] = json::object();
        at = &(*at)[t];
      }
      *at = value;
      spec.validate(probe, source);
      fail(source, ptr, "not a settable leaf (it is an object)");
    }
    spec.validate_value(ptr, value, source);
    cfg[json::json_pointer(ptr)] = value;
  }
  // An integer written 12.0 was accepted as 12 (is_integral): stored as 12, so that
  // --print-config and the result's config echo the value the run uses, not its spelling.
  for (const auto& [ptr, p] : spec.params()) {
    if (p.type != ParamType::Int && p.type != ParamType::IntList) continue;
    const json::json_pointer at(ptr);
    if (!cfg.contains(at)) continue;
    json& v = cfg[at];
    auto as_int = [](json& x) {
      if (x.is_number_float()) x = static_cast<long long>(x.get<double>());
    };
    if (v.is_array())
      for (auto& x : v) as_int(x);
    else
      as_int(v);
  }
  return Config(&spec, std::move(cfg));
}

}  // namespace

std::string to_pointer(const std::string& key) {
  if (key.empty()) config_error("--set: empty key");
  std::string ptr = key;
  if (key[0] != '/') {
    ptr = "/";
    for (char c : key) ptr += (c == '.') ? '/' : c;
  }
  if (ptr.find("//") != std::string::npos || ptr.back() == '/')
    config_error("--set '" + printable_text(key) + "': empty key segment in the path");
  return ptr;
}

Config resolve_config(const ConfigSpec& spec, const std::string& file, const std::vector<std::string>& sets) {
  if (file.empty()) return resolve(spec, nullptr, "", sets);
  const json from_file = read_json_file(file);
  return resolve(spec, &from_file, printable_text(file, 200), sets);
}

Config resolve_config_text(const ConfigSpec& spec, const std::string& text, const std::string& source,
                           const std::vector<std::string>& sets) {
  const json from_file = parse_json_text(text, source);
  return resolve(spec, &from_file, printable_text(source, 200), sets);
}

}  // namespace mpt
