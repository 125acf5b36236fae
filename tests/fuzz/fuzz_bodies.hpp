// The bodies of mpt's fuzz targets, shared by the libFuzzer binaries (tests/fuzz/fuzz_*.cpp,
// built by scripts/fuzz.sh with clang's -fsanitize=fuzzer,address,undefined) and by the Catch2
// test that replays tests/fuzz/regressions/ and the seed corpus in the ordinary build.
//
// Each body feeds one input through the code that reads hostile input and checks the contract
// of the exit codes (README.md, "Exit codes"): the only exception that may leave is ConfigError (exit 2), and its
// message is short and printable (no control character, valid UTF-8). A broken invariant throws
// std::logic_error, which libFuzzer reports as a crash (uncaught exception: abort).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/io/compare.hpp"
#include "core/io/config.hpp"
#include "core/errors.hpp"
#include "core/io/results.hpp"

namespace mpt::fuzz {

/// Record separator between the parts of one input (config text, then each --set string;
/// base result, then new result). A byte that JSON text never needs.
inline constexpr char kSeparator = '\x1e';

/// Splits `data` at kSeparator.
inline std::vector<std::string> split_input(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> parts(1);
  for (std::size_t i = 0; i < size; ++i) {
    if (static_cast<char>(data[i]) == kSeparator) parts.emplace_back();
    else parts.back() += static_cast<char>(data[i]);
  }
  return parts;
}

/// Throws std::logic_error unless `text` is valid UTF-8 without control characters except
/// '\n' (allowed only when `lines`), and at most `max_bytes` long.
inline void require_printable(const std::string& text, std::size_t max_bytes, bool lines, const char* what) {
  if (text.size() > max_bytes)
    throw std::logic_error(std::string(what) + ": " + std::to_string(text.size()) + " bytes, more than " +
                           std::to_string(max_bytes));
  if (printable_text(text, std::string::npos) != text) {
    // printable_text escapes exactly the control characters and the bytes that are not UTF-8.
    bool only_newlines = lines;
    for (char c : text)
      if (static_cast<unsigned char>(c) < 0x20 && c != '\n') only_newlines = false;
    std::string rest;
    for (char c : text) rest += c == '\n' ? ' ' : c;
    if (!only_newlines || printable_text(rest, std::string::npos) != rest)
      throw std::logic_error(std::string(what) + " has a control character or is not UTF-8: " +
                             printable_text(text, 300));
  }
}

/// A schema resembling a real experiment's: integers (with and without bounds, one scalar or
/// list), numbers (inclusive and exclusive bounds), choices, free strings, lists of each
/// kind, booleans, objects nested two and three levels deep.
inline const ConfigSpec& fuzz_spec() {
  static const ConfigSpec spec = [] {
    ConfigSpec s;
    s.integer("/seed", 1, "seed", 0);
    s.integer("/nproc", 4, "processes", 1, 64);
    s.add("/model/depth", [] {
      Param p{ParamType::Int, 7, "layers (a list sweeps)", 1.0, 64.0};
      p.scalar_or_list = true;
      return p;
    }());
    s.integer("/model/width", 256, "units", 1, 1 << 20);
    s.choice("/model/init", "kaiming", {"kaiming", "xavier", "normal"}, "initialisation");
    s.integer("/data/batch", 64, "batch", 1, 1 << 20);
    s.string("/data/dir", "/usr/share/datasets/fashion-mnist", "data folder");
    s.boolean("/data/shuffle", true, "shuffle");
    s.strings("/cast/formats", {"fp16", "bf16"}, {"fp32", "fp16", "bf16", "fp8"}, "formats");
    s.strings("/tags", {"a"}, {}, "free strings");
    s.integers("/train/nprocs", {1, 2, 4}, "group sizes", 1, 64);
    s.numbers("/train/lrs", {0.1, 0.01}, "learning rates", 0.0, 10.0);
    s.number("/train/lr", 0.05, "lr", 0.0);
    s.number("/dist/timeout_s", 30.0, "timeout", 0.1, 3600.0);
    s.number("/histogram/min_log2", -40.0, "lowest bin", -200.0, 0.0);
    s.integer("/fault/rank", -1, "failing rank", -1, 63);
    Param growth{ParamType::Number, 2.0, "growth factor"};
    growth.exclusive_min = 1.0;
    s.add("/scaler/growth_factor", growth);
    Param backoff{ParamType::Number, 0.5, "backoff factor"};
    backoff.exclusive_min = 0.0;
    backoff.exclusive_max = 1.0;
    s.add("/scaler/backoff_factor", backoff);
    s.integer("/pipeline/schedule/stages", 2, "stages", 1, 1 << 20);
    s.choice("/pipeline/schedule/kind", "1f1b", {"gpipe", "1f1b", "interleaved"}, "schedule");
    return s;
  }();
  return spec;
}

/// Config loader and merger: part 0 is the --config text (absent when the input has a
/// separator first and part 0 is empty), parts 1.. are --set strings.
inline void fuzz_config_one(const std::uint8_t* data, std::size_t size) {
  auto parts = split_input(data, size);
  const std::string text = parts[0];
  const std::vector<std::string> sets(parts.begin() + 1, parts.end());
  const ConfigSpec& spec = fuzz_spec();
  try {
    Config cfg = text.empty() && !sets.empty() ? resolve_config(spec, "", sets)
                                               : resolve_config_text(spec, text, "fuzz.json", sets);
    // A valid config reads back through every typed accessor and is stored in the result file.
    for (const auto& [ptr, p] : spec.params()) {
      switch (p.type) {
        case ParamType::Bool: (void)cfg.boolean(ptr); break;
        case ParamType::Int: p.scalar_or_list ? (void)cfg.integers(ptr) : (void)cfg.integer(ptr); break;
        case ParamType::Number: p.scalar_or_list ? (void)cfg.numbers(ptr) : (void)cfg.number(ptr); break;
        case ParamType::String: (void)cfg.str(ptr); break;
        case ParamType::IntList: (void)cfg.integers(ptr); break;
        case ParamType::NumberList: (void)cfg.numbers(ptr); break;
        case ParamType::StringList: (void)cfg.strings(ptr); break;
      }
    }
    (void)cfg.json_value().dump(2);  // throws on text that is not UTF-8
  } catch (const ConfigError& e) {
    require_printable(e.what(), 4096, false, "config error message");
  }
}

/// Result reader of `mpt compare`: part 0 the base result file, part 1 the new one; the
/// first byte of part 2 (if any) picks the tolerances and --timings.
inline void fuzz_compare_one(const std::uint8_t* data, std::size_t size) {
  auto parts = split_input(data, size);
  if (parts.size() < 2) parts.push_back(parts[0]);
  CompareOptions opt;
  if (parts.size() > 2 && !parts[2].empty()) {
    const unsigned char b = static_cast<unsigned char>(parts[2][0]);
    opt.timings = b & 1;
    if (b & 2) opt.rtol = 1e-6;
    if (b & 4) opt.atol = 1e-9;
    if (b & 8) opt.per_key.push_back({"/results/*", 0.5, 0.0});
  }
  try {
    const json a = parse_json_text(parts[0], "base.json", kResultLimits);
    const json b = parse_json_text(parts[1], "new.json", kResultLimits);
    Comparison c = compare_results(a, b, opt, "base.json", "new.json");
    if (c.ok() != c.diffs.empty()) throw std::logic_error("ok() disagrees with diffs");
    require_printable(render_table(comparison_table(c, "Differences")), std::string::npos, true, "diff table");
    require_printable(render_table(timings_table(c)), std::string::npos, true, "timings table");
  } catch (const ConfigError& e) {
    require_printable(e.what(), 4096, false, "compare error message");
  }
}

}  // namespace mpt::fuzz
