// Config schema, merge and strict validation. See config.hpp.
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

namespace mpt {

namespace {

// Length of the UTF-8 sequence starting at s[i] (1-4), or 0 when it is not valid UTF-8
// (overlong forms, surrogates and code points beyond U+10FFFF included).
std::size_t utf8_length(const std::string& s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned cp;
  if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07;
  else return 0;
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return 0;
  return n;
}


bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0, n; i < s.size(); i += n)
    if ((n = utf8_length(s, i)) == 0) return false;
  return true;
}

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

// A message echoes user input (keys, values, file names): no control character of it reaches
// the terminal raw (each piece is cut and escaped where it is inserted; this is the safety net).
[[noreturn]] void config_error(const std::string& msg) {
  throw ConfigError(printable_text(msg, std::string::npos));
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

// Thrown by the parser callback when the nesting gets too deep (before nlohmann builds, or
// anyone dumps or copies, a value deep enough to overflow the stack).
struct TooDeep {
  std::size_t depth;
};

// The SAX handler behind parse_rejecting_duplicates: builds the document as json::parse
// does, refusing nesting beyond max_depth before it is built, noting the first repeated key
// (the insertion into the object finds it, at no extra cost) and, when asked, keeping integer
// literals beyond 64 bits exactly. json::parse with a callback could do the checks, but its
// DOM builder scans the whole enclosing container for discarded values after each object:
// quadratic in the rows of a result file (200,000 rows took seconds, a file at the 256 MiB
// cap did not finish in minutes).
class CheckedDomBuilder {
 public:
  CheckedDomBuilder(json& root, std::string* duplicate, std::size_t max_depth, bool exact_integers)
      : root_(root), duplicate_(duplicate), max_depth_(max_depth), exact_integers_(exact_integers) {}

  bool null() { return add(nullptr), true; }
  bool boolean(bool v) { return add(v), true; }
  bool number_integer(json::number_integer_t v) { return add(v), true; }
  bool number_unsigned(json::number_unsigned_t v) { return add(v), true; }
  bool number_float(json::number_float_t v, const json::string_t& text) {
    // The lexer hands an integer literal beyond int64/uint64 over as a double: keep its digits.
    if (exact_integers_ && text.find_first_of(".eE") == std::string::npos)
      add(json::binary(std::vector<std::uint8_t>(text.begin(), text.end()), kExactIntegerSubtype));
    else
      add(v);
    return true;
  }
  bool string(json::string_t& v) { return add(v), true; }
  bool binary(json::binary_t& v) { return add(json::binary(v)), true; }
  bool start_object(std::size_t) { return open(json::object()), true; }
  bool key(json::string_t& k) {
    auto [it, inserted] = stack_.back().value->get_ref<json::object_t&>().emplace(k, nullptr);
    stack_.back().key = &it->first;
    slot_ = &it->second;
    if (!inserted && duplicate_->empty()) {
      std::string ptr;
      for (const auto& f : stack_) ptr += "/" + (f.key ? escape(*f.key) : std::to_string(f.index));
      *duplicate_ = printable_text(ptr, 120);
    }
    return true;
  }
  bool end_object() { return stack_.pop_back(), true; }
  bool start_array(std::size_t) { return open(json::array()), true; }
  bool end_array() { return stack_.pop_back(), true; }
  template <typename Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& ex) {
    throw ex;  // json::parse's message: "parse error at line L, column C: ..."
  }

 private:
  struct Frame {
    json* value;
    const std::string* key = nullptr;  // an object's current key (held by the object)
    long index = -1;                   // an array's current element
  };
  static std::string escape(const std::string& k) {  // RFC 6901: '~' -> "~0", '/' -> "~1"
    std::string out;
    for (char c : k) out += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
    return out;
  }
  // Places v where the document is at: the root, the next element of an array, or the value of
  // the key just read. Returns where it went (stable: a container's elements are only added to
  // while it is open, and its parent's while it is not).
  json* add(json v) {
    if (stack_.empty()) return &(root_ = std::move(v));
    Frame& top = stack_.back();
    if (top.value->is_array()) {
      ++top.index;
      auto& elements = top.value->get_ref<json::array_t&>();
      elements.push_back(std::move(v));
      return &elements.back();
    }
    return &(*slot_ = std::move(v));
  }
  void open(json empty) {
    if (stack_.size() >= max_depth_) throw TooDeep{stack_.size() + 1};
    stack_.push_back(Frame{add(std::move(empty))});
  }

  json& root_;
  std::vector<Frame> stack_;
  json* slot_ = nullptr;  // the value of the key just read
  std::string* duplicate_;
  std::size_t max_depth_;
  bool exact_integers_;
};

// json::parse, and the JSON pointer of the first key that appears twice in one object
// ("" when none): nlohmann keeps the last value of a repeated key without a word. Linear in
// the text. Throws TooDeep for nesting beyond max_depth, json::exception for invalid JSON.
// `exact_integers`: see JsonLimits::exact_integers.
json parse_rejecting_duplicates(const std::string& text, std::string* duplicate, std::size_t max_depth,
                                bool exact_integers = false) {
  json doc;
  CheckedDomBuilder sax(doc, duplicate, max_depth, exact_integers);
  json::sax_parse(text, &sax);
  return doc;
}

std::string mib(std::size_t bytes) { return fmt::format("{} MiB", bytes >> 20); }

// Reads at most max_bytes (+1 to tell a larger file) of `path`: a device such as /dev/zero
// has no size to check beforehand and never ends.
std::string read_capped(const std::string& path, const std::string& what, std::size_t max_bytes) {
  const std::string name = printable_text(path, 200);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) config_error(fmt::format("{}: is a directory, not a {}", name, what));
  std::ifstream in(path, std::ios::binary);
  if (!in) config_error(fmt::format("{}: cannot open the {} ({})", name, what, std::strerror(errno)));
  std::string text;
  char chunk[1 << 16];
  while (in) {
    in.read(chunk, sizeof(chunk));
    text.append(chunk, static_cast<std::size_t>(in.gcount()));
    if (text.size() > max_bytes)
      config_error(fmt::format("{}: the {} is larger than {}, the most mpt reads for a {} (is it the right file?)",
                               name, what, mib(max_bytes), what));
  }
  if (in.bad()) config_error(fmt::format("{}: cannot read the {}", name, what));
  return text;
}

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

json parse_json_text(const std::string& text, const std::string& source, const JsonLimits& limits) {
  const std::string name = printable_text(source, 200);
  if (text.size() > limits.max_bytes)
    config_error(fmt::format("{}: larger than {}, the most mpt reads here", name, mib(limits.max_bytes)));
  // nlohmann's lexer takes a NUL byte for the end of the input and would ignore what follows.
  if (auto nul = text.find('\0'); nul != std::string::npos)
    config_error(fmt::format("{}: invalid JSON: a NUL byte at offset {} (JSON text has none)", name, nul));
  try {
    std::string duplicate;
    json doc = parse_rejecting_duplicates(text, &duplicate, limits.max_depth, limits.exact_integers);
    if (!duplicate.empty())
      config_error(fmt::format("{}: {}: duplicate key: expected each key once per object (JSON would silently "
                               "keep only the last value)", name, duplicate));
    return doc;
  } catch (const TooDeep&) {
    config_error(fmt::format("{}: nested deeper than {} levels (arrays and objects), the most mpt reads here",
                             name, limits.max_depth));
  } catch (const json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 3, column 1: ..."
    // (or out_of_range.406 for a number beyond double's range, e.g. 1e400)
    std::string what = e.what();
    auto pos = what.find("] ");
    config_error(fmt::format("{}: invalid JSON: {}", name,
                             printable_text(pos == std::string::npos ? what : what.substr(pos + 2), 300)));
  }
}

std::string read_text_file(const std::string& path, const std::string& what, std::size_t max_bytes) {
  return read_capped(path, what, max_bytes);
}

json read_json_file(const std::string& path, const std::string& what, const JsonLimits& limits) {
  return parse_json_text(read_capped(path, what, limits.max_bytes), path, limits);
}

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

// ---------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------

std::string printable_text(const std::string& text, std::size_t limit) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    if (i >= limit) {
      out += fmt::format("\u2026 ({} bytes)", text.size());
      break;
    }
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const std::size_t n = utf8_length(text, i);
    if (n == 0) {
      out += fmt::format("\\x{:02x}", c);
      i += 1;
    } else if (n == 1 && (c < 0x20 || c == 0x7f)) {
      out += c == 0 ? std::string("\\0") : c == '\t' ? std::string("\\t") : c == '\n' ? std::string("\\n")
             : c == '\r' ? std::string("\\r") : fmt::format("\\x{:02x}", c);
      i += 1;
    } else if (n == 2 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {  // C1 controls (CSI 0x9b)
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(text[i + 1]));
      i += 2;
    } else {
      out.append(text, i, n);
      i += n;
    }
  }
  return out;
}

namespace {

void preview_into(const json& v, std::string& out, std::size_t limit, int depth) {
  if (out.size() > limit) return;
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s.size() <= limit) {
      out += v.dump(-1, ' ', false, json::error_handler_t::replace);
    } else {
      std::size_t cut = limit;
      while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // a whole UTF-8 character
      out += json(s.substr(0, cut)).dump(-1, ' ', false, json::error_handler_t::replace);
      out += fmt::format("\u2026 ({} bytes)", s.size());
    }
  } else if (v.is_array() || v.is_object()) {
    const bool obj = v.is_object();
    if (v.empty()) {
      out += obj ? "{}" : "[]";
      return;
    }
    if (depth >= 8) {
      out += obj ? "{...}" : "[...]";
      return;
    }
    out += obj ? '{' : '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (out.size() > limit) {
        out += ",...";
        break;
      }
      if (!first) out += ',';
      first = false;
      if (obj) {
        preview_into(json(it.key()), out, limit, depth + 1);
        out += ':';
      }
      preview_into(it.value(), out, limit, depth + 1);
    }
    out += obj ? '}' : ']';
  } else if (const std::string literal = exact_integer_literal(v); !literal.empty()) {
    out += literal;  // an integer beyond 64 bits, as written (JsonLimits::exact_integers)
  } else {
    out += v.dump();
  }
}

}  // namespace

std::string printable_json(const json& v, std::size_t limit) {
  std::string out;
  preview_into(v, out, limit, 0);
  if (out.size() > limit + 40) {  // cut what is left over, at a character boundary
    std::size_t cut = limit;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
    out = out.substr(0, cut) + "...";
  }
  return printable_text(out, std::string::npos);
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
  // A long word is no typo of a short key (and the distance table would be |word| x |key|).
  if (word.size() > 256) return "";
  // Case is no edit: "BF16" means "bf16" (as typed it is two edits from both "bf16" and "fp16", and
  // the first listed won; in lower case it is none from "bf16").
  auto lower = [](std::string s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  const std::string w = lower(word);
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(w, lower(c));
    if (d < best_d) best_d = d, best = c;
  }
  // Like ninja's "did you mean": only close matches (a third of the length, at least 2 edits allowed).
  std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  return best_d <= limit ? best : std::string();
}

}  // namespace mpt
