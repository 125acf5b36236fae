// Configuration: a typed schema per experiment (ConfigSpec), built-in defaults,
// a JSON file and `--set` overrides merged in that order, validated strictly.
//
// Errors name the source (file path or the --set argument), the JSON pointer
// (RFC 6901, e.g. /model/depth), what was expected and what was found, and suggest
// the nearest key for a misspelt one. All errors are mpt::ConfigError (exit code 2).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mpt {

using json = nlohmann::json;

/// Kinds of value a config parameter holds.
enum class ParamType { Bool, Int, Number, String, IntList, NumberList, StringList };

/// One leaf of a config schema.
struct Param {
  ParamType type = ParamType::Number;
  json default_value;
  std::string doc;                   ///< one line, shown by --help-config and docs
  std::optional<double> min, max;    ///< inclusive bounds for numbers (list elements too)
  std::vector<std::string> choices;  ///< allowed strings (String / StringList), empty = any
  bool scalar_or_list = false;       ///< Int/Number that also accepts a non-empty list (a sweep)
  std::optional<double> exclusive_min;  ///< strict lower bound (e.g. growth_factor > 1)
  std::optional<double> exclusive_max;  ///< strict upper bound (e.g. backoff_factor < 1)
  /// A list (or a scalar_or_list sweep) whose elements must be distinct: each names a row of a
  /// table (a recipe, a process count, a sweep value). Lists of strings with `choices` always are.
  bool unique = false;
  /// Number / NumberList: also accepts the strings "nan", "inf" and "-inf", as result files write
  /// non-finite numbers (ConfigSpec::non_finite); the bounds apply to finite values only.
  bool non_finite = false;
};

/// Schema of an experiment's config: leaves addressed by JSON pointer.
/// Objects between leaves are implied by the pointers. Mirrors how nccl-tests and
/// google/benchmark keep one flat table of options, but nested for readability.
class ConfigSpec {
 public:
  /// Adds a leaf; throws std::logic_error on a duplicate or malformed pointer.
  ConfigSpec& add(const std::string& pointer, Param p);
  /// Marks the list (or sweep) at `pointer` as one whose elements must be distinct (Param::unique):
  /// a repeated element is a config error naming it. Throws std::logic_error for an unknown pointer.
  ConfigSpec& distinct(const std::string& pointer);
  /// Lets the number (list) at `pointer` hold "nan", "inf" and "-inf" (Param::non_finite); Config::number
  /// and Config::numbers read them as NaN and ±infinity. Throws std::logic_error for an unknown pointer
  /// or a leaf that is not a Number / NumberList.
  ConfigSpec& non_finite(const std::string& pointer);

  // Shorthands. Bounds are inclusive unless noted.
  ConfigSpec& boolean(const std::string& ptr, bool def, std::string doc);
  ConfigSpec& integer(const std::string& ptr, long long def, std::string doc,
                      std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt);
  ConfigSpec& number(const std::string& ptr, double def, std::string doc,
                     std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt);
  ConfigSpec& choice(const std::string& ptr, std::string def, std::vector<std::string> choices, std::string doc);
  ConfigSpec& string(const std::string& ptr, std::string def, std::string doc);
  ConfigSpec& integers(const std::string& ptr, std::vector<long long> def, std::string doc,
                       std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt);
  ConfigSpec& numbers(const std::string& ptr, std::vector<double> def, std::string doc,
                      std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt);
  ConfigSpec& strings(const std::string& ptr, std::vector<std::string> def, std::vector<std::string> choices,
                      std::string doc);

  /// The defaults as one JSON object.
  json defaults() const;
  /// The leaf at `pointer`, or nullptr.
  const Param* find(const std::string& pointer) const;
  /// All leaves, ordered by pointer.
  const std::map<std::string, Param>& params() const { return params_; }

  /// Validates a (partial) config object from `source` against the schema.
  /// Throws ConfigError naming source, pointer, expectation and finding.
  void validate(const json& partial, const std::string& source) const;
  /// Validates one value for the leaf at `pointer`; throws ConfigError.
  void validate_value(const std::string& pointer, const json& value, const std::string& source) const;

 private:
  bool is_object_prefix(const std::string& pointer) const;
  std::vector<std::string> child_keys(const std::string& object_pointer) const;
  void validate_object(const json& obj, const std::string& pointer, const std::string& source) const;
  std::map<std::string, Param> params_;
};

/// A resolved, validated configuration with typed accessors.
/// Accessors throw std::logic_error for a pointer missing from the schema (a bug, not user input).
class Config {
 public:
  Config(const ConfigSpec* spec, json resolved) : spec_(spec), json_(std::move(resolved)) {}

  bool boolean(const std::string& ptr) const;
  long long integer(const std::string& ptr) const;
  double number(const std::string& ptr) const;
  std::string str(const std::string& ptr) const;
  /// Int list; a scalar_or_list parameter given as a scalar reads as one element.
  std::vector<long long> integers(const std::string& ptr) const;
  /// Number list; a scalar_or_list parameter given as a scalar reads as one element.
  std::vector<double> numbers(const std::string& ptr) const;
  std::vector<std::string> strings(const std::string& ptr) const;

  /// The whole resolved config, as echoed into the result file.
  const json& json_value() const { return json_; }

 private:
  const json& at(const std::string& ptr) const;
  const ConfigSpec* spec_;
  json json_;
};

/// Bounds on what a JSON input may hold, so that a hostile or mistaken file (/dev/zero, a
/// 100,000-deep nesting) fails fast with exit 2 instead of exhausting memory or the stack.
struct JsonLimits {
  std::size_t max_bytes;  ///< the file is read with this cap (a device has no size to stat)
  std::size_t max_depth;  ///< nesting of arrays and objects; deeper is refused while parsing
  /// Integer literals beyond int64/uint64 (which JSON allows and nlohmann would round to a
  /// double) are kept exactly, as a binary value of subtype kExactIntegerSubtype holding the
  /// literal's text ("-" and decimal digits); JSON text has no binary values of its own.
  bool exact_integers = false;
};
/// Subtype of the binary values that hold exact integer literals (JsonLimits::exact_integers).
inline constexpr std::uint8_t kExactIntegerSubtype = 0x49;  // 'I'
/// The decimal text of an exact integer literal read with JsonLimits::exact_integers, or ""
/// when `v` is no such value.
inline std::string exact_integer_literal(const json& v) {
  if (!v.is_binary() || !v.get_binary().has_subtype() || v.get_binary().subtype() != kExactIntegerSubtype) return "";
  return std::string(v.get_binary().begin(), v.get_binary().end());
}
/// Limits for `--config` files and `--set` values: configs are small and at most a few levels deep.
inline constexpr JsonLimits kConfigLimits{16u << 20, 64};
/// Limits for result files read by `mpt compare`; their integers beyond 64 bits are kept exactly.
inline constexpr JsonLimits kResultLimits{256u << 20, 256, true};
/// Most elements a list in a config may hold (a sweep over more values is a mistake).
inline constexpr std::size_t kMaxListLength = 10000;

/// Reads a JSON file; throws ConfigError for a missing, unreadable or invalid file (with
/// line/column from the parser), a directory, a file larger than limits.max_bytes (read
/// with that cap, never whole), nesting deeper than limits.max_depth, or a key repeated
/// within one object. `what` names the file in messages ("config file", "result file").
/// Reads a whole text file of at most `max_bytes` (devices such as /dev/zero included: it stops
/// reading past the cap). `what` names it in messages. Throws ConfigError for a directory, an
/// unreadable file or one over the cap.
std::string read_text_file(const std::string& path, const std::string& what, std::size_t max_bytes);

json read_json_file(const std::string& path, const std::string& what = "config file",
                    const JsonLimits& limits = kConfigLimits);

/// Parses JSON `text` under `limits` (size, depth) and rejecting repeated keys; `source`
/// names the input in messages. Throws ConfigError. read_json_file without the file.
json parse_json_text(const std::string& text, const std::string& source, const JsonLimits& limits = kConfigLimits);

/// `text` made safe and short for a message: control characters escaped (\0, \t, \n,
/// \x1b, ...), bytes that are not UTF-8 as \xNN, and cut after about `limit` bytes with
/// "… (N bytes)" appended.
std::string printable_text(const std::string& text, std::size_t limit = 80);

/// A JSON value for a message: dumped with at most about `limit` characters (long strings
/// and containers cut, deep nesting elided, invalid UTF-8 replaced), never recursing deeply.
std::string printable_json(const json& v, std::size_t limit = 60);

/// Merges defaults ← file (if non-empty path) ← `--set` overrides ("a.b=VALUE" or
/// "/a/b=VALUE"; VALUE parsed as JSON, else taken as a string), validating each layer.
/// Throws ConfigError.
Config resolve_config(const ConfigSpec& spec, const std::string& file, const std::vector<std::string>& sets);

/// resolve_config with the config file's text given directly (`source` names it in
/// messages); used by the fuzz target tests/fuzz/fuzz_config.cpp. Throws ConfigError.
Config resolve_config_text(const ConfigSpec& spec, const std::string& text, const std::string& source,
                           const std::vector<std::string>& sets);

/// Levenshtein edit distance (for "did you mean").
std::size_t edit_distance(const std::string& a, const std::string& b);

/// The candidate nearest to `word` if it is close enough to be a likely typo, else "".
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

/// Converts "a.b.c" or "/a/b/c" to the JSON pointer "/a/b/c"; throws ConfigError if empty.
std::string to_pointer(const std::string& dotted_or_pointer);

}  // namespace mpt
