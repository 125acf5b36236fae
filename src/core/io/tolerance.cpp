// Tolerance files for `mpt compare`. See tolerance.hpp.
#include "core/io/tolerance.hpp"

#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/io/config.hpp"
#include "core/numerics/bounds.hpp"
#include "core/errors.hpp"

namespace mpt {

double unit_roundoff(const std::string& format) {
  try {
    return bounds::unit_roundoff(format);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
}

namespace {

// A tiny recursive-descent reader over one expression string.
struct Reader {
  const std::string& s;
  const std::string& where;
  std::size_t i = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(fmt::format("{}: tolerance \"{}\": {} at column {}", where, printable_text(s), what, i + 1));
  }
  void skip() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool eat(char c) {
    skip();
    if (i < s.size() && s[i] == c) return ++i, true;
    return false;
  }
  std::string word() {
    skip();
    std::size_t b = i;
    while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
    return s.substr(b, i - b);
  }
  double number() {
    skip();
    const char* begin = s.c_str() + i;
    char* end = nullptr;
    double v = std::strtod(begin, &end);
    if (end == begin) fail("expected a number, u(F) or gamma(F, N)");
    i += static_cast<std::size_t>(end - begin);
    if (!std::isfinite(v) || v < 0) fail("expected a finite number >= 0");
    return v;
  }
  double factor() {
    skip();
    if (i < s.size() && std::isalpha(static_cast<unsigned char>(s[i]))) {
      std::string fn = word();
      if (fn != "u" && fn != "gamma") fail("unknown function \"" + printable_text(fn) + "\" (expected u or gamma)");
      if (!eat('(')) fail("expected '('");
      std::string f = word();
      double u = 0;
      try {
        u = unit_roundoff(f);
      } catch (const ConfigError& e) {
        fail(e.what());
      }
      double r = u;
      if (fn == "gamma") {
        if (!eat(',')) fail("expected ', N'");
        // N: a sum of products of integers, e.g. 2*10*18 + 64*10 + 64 (the rounding count of a path).
        const double n = sum_of_products([this] { return number(); });
        if (n != std::floor(n) || n < 1) fail("N must be a positive integer");
        if (n * u >= 1) fail("N*u >= 1: the bound is void");
        r = n * u / (1 - n * u);
      }
      if (!eat(')')) fail("expected ')'");
      return r;
    }
    return number();
  }
  // ATOM { * ATOM } { + ATOM { * ATOM } }: the shape of both an EXPR and a gamma's N.
  template <typename Atom>
  double sum_of_products(Atom atom) {
    double sum = 0;
    do {
      double term = atom();
      while (eat('*')) term *= atom();
      sum += term;
    } while (eat('+'));
    return sum;
  }
  // EXPR = TERM { + TERM }, TERM = FACTOR { * FACTOR }: bounds of independent error sources add.
  double expression() {
    const double sum = sum_of_products([this] { return factor(); });
    skip();
    if (i != s.size()) fail("unexpected text");
    // Each number is finite, but a product or sum of them may overflow (1e300*1e300): an
    // infinite bound would pass everything but equal infinities and fail equal values (inf·0).
    if (!std::isfinite(sum)) fail("the value is not finite (tolerances must be finite numbers >= 0)");
    return sum;
  }
};

}  // namespace

double eval_tolerance_expr(const std::string& expr, const std::string& where) {
  Reader r{expr, where};
  return r.expression();
}

std::vector<KeyTolerance> parse_tolerance_text(const std::string& text, const std::string& name) {
  std::vector<KeyTolerance> rules;
  std::istringstream in(text);
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    const std::string where = fmt::format("{}:{}", name, lineno);
    // PATTERN: one word, or "a quoted glob" (check names hold spaces); then RULE; then # comment.
    std::size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line[i] == '#') continue;  // blank or comment
    std::string pattern, rest;
    if (line[i] == '"') {
      auto close = line.find('"', i + 1);
      if (close == std::string::npos) throw ConfigError(fmt::format("{}: unterminated \" in the pattern", where));
      pattern = line.substr(i + 1, close - i - 1);
      rest = line.substr(close + 1);
    } else {
      auto end = line.find_first_of(" \t", i);
      pattern = line.substr(i, end == std::string::npos ? std::string::npos : end - i);
      rest = end == std::string::npos ? "" : line.substr(end);
    }
    if (auto hash = rest.find('#'); hash != std::string::npos) rest.erase(hash);
    if (pattern.empty() || (pattern[0] != '/' && pattern[0] != '*'))
      throw ConfigError(fmt::format("{}: pattern \"{}\": expected a path glob starting with / or *", where,
                                    printable_text(pattern)));
    KeyTolerance kt{pattern};
    // RULE: exact | rel EXPR | abs EXPR | rel EXPR abs EXPR
    auto trim = [](std::string v) {
      v.erase(0, v.find_first_not_of(" \t"));
      v.erase(v.find_last_not_of(" \t\r") + 1);
      return v;
    };
    rest = trim(rest);
    if (rest == "exact") {
      rules.push_back(kt);
      continue;
    }
    if (rest == "unbounded") {
      kt.unbounded = true;
      rules.push_back(kt);
      continue;
    }
    // Words are separated by blanks: spaces or tabs (a tab-aligned file reads as it looks).
    auto blank = [](char c) { return c == ' ' || c == '\t'; };
    auto take = [&](const std::string& kw) -> bool {
      if (rest.size() <= kw.size() || rest.compare(0, kw.size(), kw) != 0 || !blank(rest[kw.size()])) return false;
      rest = trim(rest.substr(kw.size() + 1));
      return true;
    };
    // Where the word "abs" starts in `rest` (blanks on both sides), or npos.
    auto abs_word = [&]() -> std::size_t {
      for (std::size_t at = rest.find("abs"); at != std::string::npos; at = rest.find("abs", at + 1))
        if (at > 0 && blank(rest[at - 1]) && at + 3 < rest.size() && blank(rest[at + 3])) return at;
      return std::string::npos;
    };
    bool any = false;
    if (take("rel")) {
      const std::size_t abs_at = abs_word();
      kt.rtol = eval_tolerance_expr(trim(rest.substr(0, abs_at)), where);
      rest = abs_at == std::string::npos ? "" : trim(rest.substr(abs_at));
      any = true;
    }
    if (take("abs")) {
      kt.atol = eval_tolerance_expr(rest, where);
      rest.clear();
      any = true;
    }
    if (!any || !rest.empty())
      throw ConfigError(fmt::format("{}: expected PATTERN followed by exact, unbounded, rel EXPR, abs EXPR or rel EXPR abs EXPR",
                                    where));
    rules.push_back(kt);
  }
  return rules;
}

std::vector<KeyTolerance> read_tolerance_file(const std::string& path) {
  return parse_tolerance_text(read_text_file(path, "tolerance file", 1u << 20), printable_text(path, 200));
}

}  // namespace mpt
