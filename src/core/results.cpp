// Report rendering (text tables, histograms) and the atomic result writer. See results.hpp.
#include "core/results.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

namespace mpt {

// ---------------------------------------------------------------------------
// Checks and JSON encoding
// ---------------------------------------------------------------------------

void Report::check(const std::string& name, double value, double tolerance, const std::string& detail) {
  checks.push_back(Check{name, value, tolerance, value <= tolerance, detail});
}

bool Report::all_checks_ok() const {
  return std::all_of(checks.begin(), checks.end(), [](const Check& c) { return c.ok; });
}

json num(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  return d;
}

json encode_nonfinite(const json& v) {
  if (v.is_number_float()) return num(v.get<double>());
  if (v.is_array() || v.is_object()) {
    json out = v;
    for (auto it = out.begin(); it != out.end(); ++it) *it = encode_nonfinite(*it);
    return out;
  }
  return v;
}

double decode_nonfinite(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
    if (s == "nan") return NAN;
  }
  throw std::invalid_argument("not a number or \"inf\"/\"-inf\"/\"nan\": " + v.dump());
}

json table_json(const Table& t) {
  json rows = json::array();
  for (const auto& r : t.rows) rows.push_back(encode_nonfinite(r));
  return rows;
}

json histogram_json(const Histogram& h) {
  json markers = json::array();
  for (const auto& m : h.markers) markers.push_back({{"label", m.label}, {"at", num(m.at)}});
  json edges = json::array();
  for (double e : h.edges) edges.push_back(num(e));
  return {{"axis", h.axis},     {"edges", edges},         {"counts", h.counts},
          {"zeros", h.zeros}, {"open_ends", h.open_ends}, {"markers", markers}};
}

// ---------------------------------------------------------------------------
// Text rendering
// ---------------------------------------------------------------------------

std::string format_cell(const Column& c, const json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (c.kind == ColKind::Text || s == "inf" || s == "-inf" || s == "nan") return s;
    return s;
  }
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (!v.is_number()) return v.dump();
  double d = v.get<double>();
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  switch (c.kind) {
    case ColKind::Int:
      return v.is_number_integer() ? fmt::format("{}", v.get<long long>()) : fmt::format("{:.0f}", d);
    case ColKind::Percent: return fmt::format("{:.{}f}", d * 100.0, c.precision);
    case ColKind::Sci: return fmt::format("{:.{}e}", d, std::max(0, c.precision - 1));
    case ColKind::Float:
    case ColKind::Text:
    default: return fmt::format("{:.{}g}", d, std::max(1, c.precision));
  }
}

std::string render_table(const Table& t) {
  const std::size_t n = t.columns.size();
  std::vector<std::vector<std::string>> cells;
  std::vector<std::size_t> width(n, 0);
  for (std::size_t j = 0; j < n; ++j) {
    const Column& c = t.columns[j];
    width[j] = std::max<std::size_t>({static_cast<std::size_t>(std::max(c.width, 4)), c.header.size(),
                                      (c.unit.empty() ? std::size_t{1} : c.unit.size())});
  }
  for (const auto& row : t.rows) {
    std::vector<std::string> line;
    for (std::size_t j = 0; j < n; ++j) {
      const Column& c = t.columns[j];
      json v = row.contains(c.key) ? row.at(c.key) : json();
      line.push_back(format_cell(c, v));
      width[j] = std::max(width[j], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  std::string out;
  out += "# " + t.title + "\n";
  std::string head = "#", units = "#";
  for (std::size_t j = 0; j < n; ++j) {
    head += fmt::format("  {:>{}}", t.columns[j].header, width[j]);
    units += fmt::format("  {:>{}}", t.columns[j].unit.empty() ? "-" : t.columns[j].unit, width[j]);
  }
  out += head + "\n" + units + "\n";
  for (const auto& line : cells) {
    std::string s = " ";
    for (std::size_t j = 0; j < n; ++j) s += fmt::format("  {:>{}}", line[j], width[j]);
    out += s + "\n";
  }
  for (const auto& note : t.notes) out += "# " + note + "\n";
  return out;
}

std::string render_histogram(const Histogram& h, int bar_width) {
  std::string out = "# " + h.title + "\n";
  long long maxc = 1;
  for (auto c : h.counts) maxc = std::max(maxc, c);
  std::size_t first = 0, last = h.counts.size();
  while (first < last && h.counts[first] == 0) ++first;
  while (last > first && h.counts[last - 1] == 0) --last;
  // Keep markers visible: widen the printed range to include them.
  for (const auto& m : h.markers)
    for (std::size_t i = 0; i < h.counts.size(); ++i)
      if (h.edges[i] <= m.at && m.at < h.edges[i + 1]) first = std::min(first, i), last = std::max(last, i + 1);
  out += fmt::format("# {:>12}  {:<{}}  {}\n", h.axis, "", bar_width, "count");
  for (std::size_t i = first; i < last; ++i) {
    for (const auto& m : h.markers)
      if (h.edges[i] <= m.at && m.at < h.edges[i + 1])
        out += fmt::format("  {:>12}  {}\n", "", fmt::format("---- {} ({:g}) ----", m.label, m.at));
    int len = static_cast<int>(std::lround(static_cast<double>(h.counts[i]) * bar_width / maxc));
    if (h.counts[i] > 0 && len == 0) len = 1;
    // The end bins are open: values beyond the edges are counted there.
    std::string label = i == 0 && h.open_ends ? fmt::format("<{:g}", h.edges[i + 1])
                        : i + 1 == h.counts.size() && h.open_ends ? fmt::format(">={:g}", h.edges[i])
                                                                  : fmt::format("[{:g},{:g})", h.edges[i], h.edges[i + 1]);
    out += fmt::format("  {:>12}  {:<{}}  {}\n", label, std::string(len, '#'), bar_width, h.counts[i]);
  }
  out += fmt::format("  {:>12}  {:<{}}  {}\n", "exact zero", "", bar_width, h.zeros);
  return out;
}

std::string render_checks(const std::vector<Check>& checks) {
  if (checks.empty()) return "";
  std::size_t bad = 0;
  std::string lines;
  for (const auto& c : checks) {
    if (!c.ok) ++bad;
    lines += fmt::format("#   {:<40} {:>12.4g} <= {:<10.4g} {}{}\n", c.name, c.value, c.tolerance,
                         c.ok ? "OK" : "FAILED", c.detail.empty() ? "" : "  (" + c.detail + ")");
  }
  return fmt::format("# Checks\n{}# {}: {} of {} checks passed\n", lines, bad ? "FAILED" : "OK",
                     checks.size() - bad, checks.size());
}

// ---------------------------------------------------------------------------
// Atomic file writing
// ---------------------------------------------------------------------------

namespace {

// A new file beside `path` (named ".<name><suffix>XXXXXX", mkstemp), its parent directories
// created first. Returns the open descriptor and the file's name; throws std::runtime_error
// naming `path` when the directory or the file cannot be made.
std::pair<int, std::string> temp_file_beside(const std::string& path, const char* suffix) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error(fmt::format("{}: cannot create directory {}: {}", path, dir.string(), ec.message()));
  std::string tmpl = (dir / ("." + target.filename().string() + suffix + "XXXXXX")).string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  int fd = mkstemp(name.data());
  if (fd < 0)
    throw std::runtime_error(fmt::format("{}: cannot create a file in {}: {}", path, dir.string(), std::strerror(errno)));
  return {fd, std::string(name.data())};
}

}  // namespace

void check_writable(const std::string& path) {
  if (path.empty()) throw std::runtime_error("empty result path");
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) return;
    if (S_ISDIR(st.st_mode)) throw std::runtime_error(fmt::format("{}: is a directory (expected a file path)", path));
  }
  const auto probe = temp_file_beside(path, ".probe.");
  ::close(probe.first);
  ::unlink(probe.second.c_str());
}

void write_file_atomic(const std::string& path, const std::string& text) {
  if (path.empty()) throw std::runtime_error("empty result path");
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) {
    // A device or pipe (--out /dev/null, /dev/stdout): write into it, never replace it.
    int fd = ::open(path.c_str(), O_WRONLY);
    if (fd < 0) throw std::runtime_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    const char* p = text.data();
    std::size_t left = text.size();
    while (left > 0) {
      ssize_t w = ::write(fd, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        int err = errno;
        ::close(fd);
        throw std::runtime_error(fmt::format("{}: write failed: {}", path, std::strerror(err)));
      }
      p += w;
      left -= static_cast<std::size_t>(w);
    }
    ::close(fd);
    return;
  }
  const auto tmp = temp_file_beside(path, ".tmp.");
  const int fd = tmp.first;
  const std::string& name = tmp.second;
  auto fail = [&](const char* what) {
    int err = errno;
    ::close(fd);
    ::unlink(name.data());
    throw std::runtime_error(fmt::format("{}: {}: {}", path, what, std::strerror(err)));
  };
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write failed");
    }
    p += w;
    left -= static_cast<std::size_t>(w);
  }
  if (::fchmod(fd, 0644) != 0) fail("chmod failed");
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    ::unlink(name.data());
    throw std::runtime_error(fmt::format("{}: close failed: {}", path, std::strerror(errno)));
  }
  if (::rename(name.data(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(name.data());
    throw std::runtime_error(fmt::format("{}: rename failed: {}", path, std::strerror(err)));
  }
}

}  // namespace mpt
