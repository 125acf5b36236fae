// What an experiment returns (Report: tables, histograms, checks, timings), how it
// is printed (aligned tables in the style of nccl-tests) and how it is stored
// (the result document of docs/results.md, written atomically).
//
// Non-finite numbers are data here (overflow is what mpt studies): in JSON they are
// the strings "inf", "-inf" and "nan", and read back as doubles by decode_nonfinite().
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <variant>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mpt {

using json = nlohmann::json;

/// How a column's values are printed.
enum class ColKind {
  Text,     ///< strings as they are
  Int,      ///< integers
  Float,    ///< adaptive precision: fixed when it fits the width, else scientific
  Sci,      ///< always scientific (magnitudes that span many decades)
  Percent,  ///< a fraction in [0,1] printed as a percentage
};

/// One column: JSON key in each row, header text, unit row text, kind, width.
struct Column {
  std::string key;
  std::string header;
  std::string unit;  ///< printed in the units row ("-" when unitless); e.g. "s", "bytes", "%"
  ColKind kind = ColKind::Float;
  int width = 0;      ///< 0 = fit to header/unit/values (at least 6)
  int precision = 4;  ///< significant digits for Float/Sci; decimals for Percent
};

/// Where the result document stores a table (google/benchmark's rule: one report, printed and
/// stored; deterministic values under `results`, run-dependent ones under `timings`).
enum class Store {
  Results,        ///< results.<name>: the array of rows
  Timings,        ///< timings.<name>: the array of rows (times, throughput: they vary run to run)
  TimingsByName,  ///< timings.<name>: an object of the rows keyed by each row's "name" (joined across runs)
};

/// A named table: rows are JSON objects keyed by Column::key. Each row should carry a
/// stable "name" (or the first column) so result files can be joined row by row. A row may
/// hold more keys than the columns print (they are stored, not printed).
struct Table {
  std::string name;   ///< key under `results` (or `timings`, see store) in the JSON (snake_case)
  std::string title;  ///< printed header line
  std::vector<Column> columns;
  std::vector<json> rows;
  std::vector<std::string> notes;  ///< printed under the table (not stored)
  Store store = Store::Results;    ///< where the result document keeps the rows
};

/// A histogram with vertical markers (format limits), printed as a text bar chart.
struct Histogram {
  std::string name;   ///< key under `results`
  std::string title;
  std::string axis;   ///< what a bin is, e.g. "log2 |g|"
  std::vector<double> edges;         ///< bin edges, size = counts.size() + 1
  std::vector<long long> counts;
  long long zeros = 0;               ///< values that are exactly zero (no log2)
  bool open_ends = true;             ///< first/last bins also count values beyond the edges
  struct Marker { std::string label; double at; };
  std::vector<Marker> markers;       ///< e.g. {"fp16 min subnormal", -24}
};

/// A correctness check the experiment made on its own numbers (nccl-tests' "#wrong").
struct Check {
  std::string name;
  double value = 0;      ///< measured (e.g. max abs difference)
  double tolerance = 0;  ///< the bound it must not exceed
  bool ok = true;
  std::string detail;    ///< one line for humans
};

/// A free-form text block (e.g. a Gantt chart), printed verbatim and not stored.
struct TextBlock {
  std::string title;
  std::string text;
};

/// Everything an experiment returns. Experiments never print: the harness prints
/// `sections` in order and stores tables (under `results` or `timings`, as each table's
/// `store` says) and histograms (under `results`).
struct Report {
  std::vector<std::variant<Table, Histogram, TextBlock>> sections;
  json results = json::object();  ///< extra deterministic values (merged under `results`)
  std::vector<Check> checks;
  json timings = json::object();  ///< run-dependent values (seconds, throughput)
  json env = json::object();      ///< extra environment facts (merged under `env`)

  void add(Table t) { sections.emplace_back(std::move(t)); }
  /// Adds a table stored where `where` says (e.g. Store::Timings for measured times): printed
  /// in order like any table.
  void add(Table t, Store where) {
    t.store = where;
    sections.emplace_back(std::move(t));
  }
  void add(Histogram h) { sections.emplace_back(std::move(h)); }
  void add(TextBlock b) { sections.emplace_back(std::move(b)); }
  /// Records a check `value <= tolerance` (NaN fails).
  void check(const std::string& name, double value, double tolerance, const std::string& detail = "");
  bool all_checks_ok() const;
};

/// The first index of `values` (e.g. a loss per step) that is NaN or ±inf; -1 when all are finite.
std::int64_t first_nonfinite(const std::vector<double>& values);

/// Says so when a training run diverged: if a loss of `losses` (one per step; losses[0] is step
/// `first_step`, as the experiment's tables count: 0 or 1) is not finite, adds to `t` the note "diverged: <run>'s loss became <nan|inf> at step <s>; ..."
/// and to report.results["diverged"] the row {"name": run, "table": t.name, "step": s, "loss":
/// "nan"|"inf"|"-inf"}; nothing when every loss is finite (a run that converges keeps its result
/// file unchanged). Returns whether the run diverged. Comparisons with such a run are NaN (core/models/mlp'
/// max_abs_diff, nan_max), so its equivalence checks fail rather than pass on the finite part.
bool note_divergence(Report& report, Table& t, const std::string& run, const std::vector<double>& losses,
                     std::int64_t first_step = 0);

/// The same for a run whose training losses stayed finite but whose evaluation `what` (e.g. "test
/// loss") came out `value`, not finite (the last update overflowed the weights, or the evaluation
/// did): the note "diverged: <run>'s <what> is <nan|inf> after training; ..." and a
/// report.results["diverged"] row {"name", "table", "step": null, "loss"}. Nothing for a finite
/// `value`. Returns whether it noted.
bool note_eval_divergence(Report& report, Table& t, const std::string& run, const std::string& what, double value);

/// Replaces non-finite doubles by "inf"/"-inf"/"nan" everywhere in `v` (recursively).
json encode_nonfinite(const json& v);
/// Inverse of encode_nonfinite for a single value: "inf"/"-inf"/"nan" strings or numbers to double.
/// Throws std::invalid_argument for anything else.
double decode_nonfinite(const json& v);

/// A double as JSON, with non-finite values as strings.
json num(double d);

/// Renders a table as text (header with '#', units row, fixed-width columns).
std::string render_table(const Table& t);
/// Renders a histogram as a horizontal text bar chart with marker lines.
std::string render_histogram(const Histogram& h, int bar_width = 50);
/// Renders the checks footer ("# checks: 3 OK" or the failing ones).
std::string render_checks(const std::vector<Check>& checks);

/// Formats one value for a column (exposed for tests).
std::string format_cell(const Column& c, const json& v);

/// The JSON of a Table (array of rows, non-finite encoded) and of a Histogram.
json table_json(const Table& t);
/// The JSON of a Table as an object of its rows keyed by each row's "name" (Store::TimingsByName).
/// Throws std::logic_error when a row has no string "name" or two rows share one.
json table_json_by_name(const Table& t);
json histogram_json(const Histogram& h);

/// Writes `text` to `path` atomically: a temporary file in the same directory, flushed
/// and fsync'ed, then rename(2) over the target; parent directories are created.
/// Symbolic links are followed: the temporary file goes beside the last link's target and
/// replaces the target, so the links stay links. An existing file keeps its permission bits
/// (new files get 0644). Character devices, FIFOs and sockets (/dev/null, a named pipe) are
/// written into directly, never replaced, and so are this process's own descriptors named by
/// path (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N): the output goes where the
/// descriptor goes (a pipe, a terminal, the file a shell redirected it to).
/// Throws std::runtime_error (with errno text) on failure; the target is untouched then.
void write_file_atomic(const std::string& path, const std::string& text);

/// Writes several files (path, text) all or nothing, as far as a file system allows: every
/// regular file's text goes first into a temporary file beside it (as write_file_atomic), then
/// the streams and descriptors are written, then the temporary files are renamed over their
/// targets. A failure before the renames replaces no file (the temporary files are removed); a
/// rename that fails (the directory changed under the run) leaves those renamed before it.
/// Used for a result file and its trace (--out, --trace). Throws std::runtime_error naming the
/// path that failed.
void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files);

/// Checks before a run that write_file_atomic(path, ...) can succeed: `path` does not name a
/// folder by its form (ends in '/', or in "." or ".."), (after its symbolic links) is not a
/// directory, its parent directories exist or can be created (they are created), and a file
/// can be made in the parent (a probe file, removed at once). A device, pipe or own descriptor
/// passes. Returns the directories it created, outermost first (for remove_created_dirs when
/// the run then fails). Throws std::runtime_error naming `path` and the reason otherwise; it
/// leaves no folder or file behind then (a path too long part of the way down included).
std::vector<std::string> check_writable(const std::string& path);

/// For a signal handler (SIGINT, SIGTERM, SIGHUP) of a run that ends before its result is
/// written: removes the temporary files that write_files_atomic and check_writable have made
/// and not yet renamed or removed (a result staged while a FIFO --trace blocks the write would
/// otherwise stay as ".NAME.tmp.XXXXXX"). Async-signal-safe: reads fixed slots, calls unlink(2).
void remove_temp_files_on_signal() noexcept;

/// Removes the directories check_writable created, innermost first, each only if it is
/// still empty (rmdir(2)); errors are ignored. For a run that ends without a result.
void remove_created_dirs(const std::vector<std::string>& dirs);

}  // namespace mpt

namespace mpt {

// Column shorthands (header doubles as the unit-less label; unit "-" when empty).
inline Column text_col(std::string key, std::string header) {
  return Column{std::move(key), std::move(header), "-", ColKind::Text};
}
inline Column int_col(std::string key, std::string header, std::string unit = "-") {
  return Column{std::move(key), std::move(header), std::move(unit), ColKind::Int};
}
inline Column float_col(std::string key, std::string header, std::string unit = "-", int digits = 4) {
  return Column{std::move(key), std::move(header), std::move(unit), ColKind::Float, 0, digits};
}
inline Column sci_col(std::string key, std::string header, std::string unit = "-", int digits = 4) {
  return Column{std::move(key), std::move(header), std::move(unit), ColKind::Sci, 0, digits};
}
inline Column pct_col(std::string key, std::string header, int decimals = 2) {
  return Column{std::move(key), std::move(header), "%", ColKind::Percent, 0, decimals};
}

}  // namespace mpt
