// core/io internals shared by config.cpp and config_json.cpp: the checked JSON parse behind
// config files and --set values, and the one way a config error is thrown. Private to
// src/core/io: not part of mpt's API.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "core/errors.hpp"
#include "core/io/config.hpp"

namespace mpt::config_detail {

// Thrown by the parser callback when the nesting gets too deep (before nlohmann builds, or
// anyone dumps or copies, a value deep enough to overflow the stack).
struct TooDeep {
  std::size_t depth;
};
/// A number literal with a non-zero digit that reads as 0: below the smallest double (about
/// 4.9e-324), so strtod underflows. Thrown by parse_rejecting_duplicates with the literal's JSON
/// pointer: a value read as 0 where the text says otherwise is refused, never used.
struct Underflow {
  std::string ptr;   ///< "/train/lr"
  std::string text;  ///< the literal, "1e-400"
};

/// A number literal beyond double's range (1e309): nlohmann's parser reports it without a place;
/// parse_rejecting_duplicates throws this instead, with the literal's JSON pointer.
struct Overflow {
  std::string ptr;   ///< "/train/tokens"
  std::string text;  ///< the literal, "1e309"
};

/// Whether `s` is valid UTF-8 (no overlong forms, surrogates or code points beyond U+10FFFF).
bool valid_utf8(const std::string& s);

// json::parse, and the JSON pointer of the first key that appears twice in one object
// ("" when none): nlohmann keeps the last value of a repeated key without a word. Linear in
// the text. Throws TooDeep for nesting beyond max_depth, Underflow for a non-zero number that
// reads as 0, Overflow for one beyond double's range, json::exception for other invalid JSON.
// `exact_integers`: see JsonLimits::exact_integers.
nlohmann::json parse_rejecting_duplicates(const std::string& text, std::string* duplicate, std::size_t max_depth,
                                          bool exact_integers = false);

// A message echoes user input (keys, values, file names): no control character of it reaches
// the terminal raw (each piece is cut and escaped where it is inserted; this is the safety net).
[[noreturn]] inline void config_error(const std::string& msg) {
  throw ConfigError(printable_text(msg, std::string::npos));
}

}  // namespace mpt::config_detail
