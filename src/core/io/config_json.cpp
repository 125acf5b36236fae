// JSON text for configs and result files: capped file reads, the checked parse (depth limit,
// repeated keys, exact big integers: a SAX builder), printable previews of text and values for
// messages, and the nearest-name suggestions. See config.hpp; the schema and merging: config.cpp.
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
#include <type_traits>
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

}  // namespace

namespace config_detail {

bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0, n; i < s.size(); i += n)
    if ((n = utf8_length(s, i)) == 0) return false;
  return true;
}

}  // namespace config_detail

namespace {

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
    // strtod reads a literal below the smallest double (1e-400) as 0: refuse it, naming where
    if (v == 0) {
      const std::string mantissa = text.substr(0, text.find_first_of("eE"));
      if (mantissa.find_first_of("123456789") != std::string::npos) throw Underflow{pointer(), text};
    }
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
    if (!inserted && duplicate_->empty()) *duplicate_ = pointer();
    return true;
  }
  bool end_object() { return stack_.pop_back(), true; }
  bool start_array(std::size_t) { return open(json::array()), true; }
  bool end_array() { return stack_.pop_back(), true; }
  template <typename Exception>
  bool parse_error(std::size_t, const std::string& last_token, const Exception& ex) {
    // out_of_range.406, a number beyond double's range (1e309): where it stands, not only what
    if constexpr (std::is_same_v<Exception, json::out_of_range>)
      if (ex.id == 406) throw Overflow{pointer(), last_token};
    throw ex;  // json::parse's message: "parse error at line L, column C: ..."
  }

 private:
  struct Frame {
    json* value;
    const std::string* key = nullptr;  // an object's current key (held by the object)
    long index = -1;                   // an array's current element
  };
  // The JSON pointer of where the document is at: the key just read, or an array's next element.
  std::string pointer() const {
    std::string ptr;
    for (const auto& f : stack_) {
      const long index = f.value->is_array() && &f == &stack_.back() ? f.index + 1 : f.index;
      ptr += "/" + (f.key ? escape(*f.key) : std::to_string(index));
    }
    return printable_text(ptr, 120);
  }
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

}  // namespace

namespace config_detail {

json parse_rejecting_duplicates(const std::string& text, std::string* duplicate, std::size_t max_depth,
                                bool exact_integers) {
  json doc;
  CheckedDomBuilder sax(doc, duplicate, max_depth, exact_integers);
  json::sax_parse(text, &sax);
  return doc;
}

}  // namespace config_detail

namespace {

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
  } catch (const Underflow& u) {
    config_error(fmt::format("{}: {}: expected a number that is 0 or at least 4.9e-324 in magnitude (a double), got {}: "
                             "it would read as 0", name, u.ptr.empty() ? "/" : u.ptr, printable_text(u.text, 60)));
  } catch (const Overflow& o) {
    config_error(fmt::format("{}: {}: expected a number within double's range (magnitude at most 1.8e308), got {}",
                             name, o.ptr.empty() ? "/" : o.ptr, printable_text(o.text, 60)));
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
