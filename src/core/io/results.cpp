// Report rendering (text tables, histograms) and the atomic result writer. See results.hpp.
#include "core/io/results.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
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

std::int64_t first_nonfinite(const std::vector<double>& values) {
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i])) return static_cast<std::int64_t>(i);
  return -1;
}

bool note_divergence(Report& report, Table& t, const std::string& run, const std::vector<double>& losses,
                     std::int64_t first_step) {
  const std::int64_t i = first_nonfinite(losses);
  if (i < 0) return false;
  const json loss = num(losses[static_cast<std::size_t>(i)]);
  const std::int64_t step = first_step + i;
  t.notes.push_back(fmt::format("diverged: {}'s loss became {} at step {}; from there its numbers, and comparisons "
                                "with it, mean nothing (a nan on either side is a mismatch)",
                                run, loss.get<std::string>(), step));
  if (!report.results.contains("diverged")) report.results["diverged"] = json::array();
  report.results["diverged"].push_back({{"name", run}, {"table", t.name}, {"step", step}, {"loss", loss}});
  return true;
}

bool note_eval_divergence(Report& report, Table& t, const std::string& run, const std::string& what, double value) {
  if (std::isfinite(value)) return false;
  const json v = num(value);
  t.notes.push_back(fmt::format("diverged: {}'s {} is {} after training (every training loss was finite); its numbers, "
                                "and comparisons with it, mean nothing (a nan on either side is a mismatch)",
                                run, what, v.get<std::string>()));
  if (!report.results.contains("diverged")) report.results["diverged"] = json::array();
  report.results["diverged"].push_back({{"name", run}, {"table", t.name}, {"step", nullptr}, {"loss", v}});
  return true;
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

json table_json_by_name(const Table& t) {
  json out = json::object();
  for (const auto& r : t.rows) {
    if (!r.contains("name") || !r.at("name").is_string())
      throw std::logic_error("table '" + t.name + "': every row needs a string \"name\" to be stored by name");
    const std::string key = r.at("name").get<std::string>();
    if (out.contains(key)) throw std::logic_error("table '" + t.name + "': two rows are named '" + key + "'");
    out[key] = encode_nonfinite(r);
  }
  return out;
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
  std::size_t bad = 0, width = 40;  // the name column: 40 wide, or the longest name
  for (const auto& c : checks) width = std::max(width, c.name.size());
  std::string lines;
  for (const auto& c : checks) {
    if (!c.ok) ++bad;
    lines += fmt::format("#   {:<{}} {:>12.4g} <= {:<10.4g} {}{}\n", c.name, width, c.value, c.tolerance,
                         c.ok ? "OK" : "FAILED", c.detail.empty() ? "" : "  (" + c.detail + ")");
  }
  return fmt::format("# Checks\n{}# {}: {} of {} checks passed\n", lines, bad ? "FAILED" : "OK",
                     checks.size() - bad, checks.size());
}

// ---------------------------------------------------------------------------
// Atomic file writing
// ---------------------------------------------------------------------------

namespace {

namespace fs = std::filesystem;

// Where a result path leads once symbolic links are followed.
struct OutputTarget {
  enum Kind { File, Stream, Descriptor } kind = File;
  fs::path path;  // File: the file to replace (the last link's target); Stream: the device or FIFO
  int fd = -1;    // Descriptor: this process's open descriptor that the path names
};

// The descriptor N when `p` names one of this process's own open descriptors: /dev/stdout,
// /dev/stderr, /dev/fd/N, /proc/self/fd/N, /proc/thread-self/fd/N, /proc/<our pid>/fd/N.
std::optional<int> own_descriptor(const fs::path& p) {
  const std::string s = p.lexically_normal().string();
  int fd = -1;
  if (s == "/dev/stdout") fd = 1;
  else if (s == "/dev/stderr") fd = 2;
  else {
    for (const std::string& prefix : {std::string("/dev/fd/"), std::string("/proc/self/fd/"),
                                      std::string("/proc/thread-self/fd/"),
                                      "/proc/" + std::to_string(::getpid()) + "/fd/"}) {
      if (s.size() <= prefix.size() || s.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string n = s.substr(prefix.size());
      if (n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
      fd = std::stoi(n);
      break;
    }
  }
  if (fd < 0 || ::fcntl(fd, F_GETFD) < 0) return std::nullopt;
  return fd;
}

// Follows `path` through symbolic links (relative targets against the link's folder, at most
// 40 hops as the kernel's ELOOP) to what a write must go into. A path that does not exist
// (yet) is a File there. Throws std::runtime_error naming `path` on a link loop or unreadable link.
OutputTarget resolve_output(const std::string& path) {
  // A name that can only be a folder ("out/", ".", "x/..") would become one when its parents are
  // made, and the result's rename over it fails after the whole run (issue 38: --out DIR/).
  const fs::path given(path);
  const std::string last = given.filename().string();
  if (last.empty() || last == "." || last == "..")
    throw std::runtime_error(fmt::format("{}: names a folder ({}): expected a file path, e.g. {}{}result.json", path,
                                         last.empty() ? "it ends in '/'" : "'" + last + "'", path,
                                         last.empty() ? "" : "/"));
  fs::path p(path);
  for (int hops = 0;; ++hops) {
    if (auto fd = own_descriptor(p)) return {OutputTarget::Descriptor, p, *fd};
    struct stat st{};
    if (::lstat(p.c_str(), &st) != 0) return {OutputTarget::File, p};
    if (S_ISLNK(st.st_mode)) {
      if (hops == 40) throw std::runtime_error(fmt::format("{}: too many levels of symbolic links", path));
      std::error_code ec;
      fs::path to = fs::read_symlink(p, ec);
      if (ec) throw std::runtime_error(fmt::format("{}: cannot read the symbolic link {}: {}", path, p.string(), ec.message()));
      p = to.is_absolute() ? to : p.parent_path() / to;
      continue;
    }
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) return {OutputTarget::Stream, p};
    if (S_ISDIR(st.st_mode)) {
      const std::string via = p.string() == path ? "" : " (via the symbolic link to " + p.string() + ")";
      throw std::runtime_error(fmt::format("{}: is a directory{} (expected a file path)", path, via));
    }
    return {OutputTarget::File, p};
  }
}

// Creates the missing folders of `dir`, outermost first, and returns the ones it made (so a
// failed run can take them away again). Throws std::runtime_error naming `path` on failure.
std::vector<std::string> create_parents(const fs::path& dir, const std::string& path) {
  std::vector<fs::path> missing;
  std::error_code ec;
  for (fs::path d = dir; !d.empty() && !fs::exists(d, ec); d = d.parent_path()) {
    missing.push_back(d);
    if (d == d.parent_path()) break;
  }
  std::vector<std::string> made;
  // A failure part of the way down (a name too long for the file system, a path over PATH_MAX)
  // takes away the folders made so far (issue 38: 20 nested folders stayed behind a refused --out).
  auto fail = [&](const std::string& d, const std::string& why) {
    for (auto m = made.rbegin(); m != made.rend(); ++m) ::rmdir(m->c_str());
    throw std::runtime_error(fmt::format("{}: cannot create directory {}: {}", path, d, why));
  };
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (::mkdir(it->c_str(), 0777) == 0) made.push_back(it->string());
    else if (errno != EEXIST) fail(it->string(), std::strerror(errno));
  }
  if (!fs::is_directory(dir, ec)) fail(dir.string(), fs::exists(dir) ? "Not a directory" : "No such file or directory");
  return made;
}

// The temporary files this process has made and not yet renamed or removed, for
// remove_temp_files_on_signal: fixed slots of names, so that a signal handler reads them without
// allocating or locking (a slot is filled before it is marked used, and unmarked before reuse).
constexpr int kTempSlots = 16;
char g_temp_names[kTempSlots][PATH_MAX];
volatile std::sig_atomic_t g_temp_used[kTempSlots];
std::mutex g_temp_mu;  // slot allocation between threads (never taken by the handler)

// Records `name` for remove_temp_files_on_signal; returns its slot (-1: no free slot, or a name
// longer than PATH_MAX: that file is then not removed on a signal).
int remember_temp(const std::string& name) {
  if (name.size() >= PATH_MAX) return -1;
  std::lock_guard<std::mutex> lock(g_temp_mu);
  for (int i = 0; i < kTempSlots; ++i) {
    if (g_temp_used[i]) continue;
    std::memcpy(g_temp_names[i], name.c_str(), name.size() + 1);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    g_temp_used[i] = 1;
    return i;
  }
  return -1;
}

// Forgets a slot of remember_temp (after its file was renamed or removed). No-op for -1.
void forget_temp(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(g_temp_mu);
  g_temp_used[slot] = 0;
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

// A temporary file of temp_file_beside: its open descriptor, its name, the folders made for it
// (outermost first) and its remember_temp slot.
struct TempFile {
  int fd = -1;
  std::string name;
  std::vector<std::string> made;
  int slot = -1;
};

// A new file beside `target` (named ".<name><suffix>XXXXXX", mkstemp), its parent directories
// created first, remembered for remove_temp_files_on_signal until forget_temp(slot). Throws
// std::runtime_error naming `path` (as the user gave it) when the directory or the file cannot
// be made; the folders it made are gone again then.
TempFile temp_file_beside(const fs::path& target, const std::string& path, const char* suffix) {
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  TempFile t;
  t.made = create_parents(dir, path);
  std::string tmpl = (dir / ("." + target.filename().string() + suffix + "XXXXXX")).string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  t.fd = mkstemp(name.data());
  if (t.fd < 0) {
    const int err = errno;
    remove_created_dirs(t.made);
    throw std::runtime_error(fmt::format("{}: cannot create a file in {}: {}", path, dir.string(), std::strerror(err)));
  }
  t.name = name.data();
  t.slot = remember_temp(t.name);
  return t;
}

// write(2) of all of `text`, retried on EINTR and short writes. Returns 0 or the errno.
int write_all(int fd, const std::string& text) {
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    p += w;
    left -= static_cast<std::size_t>(w);
  }
  return 0;
}

}  // namespace

std::vector<std::string> check_writable(const std::string& path) {
  if (path.empty()) throw std::runtime_error("empty result path");
  const OutputTarget t = resolve_output(path);
  if (t.kind != OutputTarget::File) return {};
  // An existing file is replaced by a rename, which its directory allows unless the file itself is
  // immutable or append-only (chattr +i / +a): then the run would end in an unwritable result.
  {
    const int fd = ::open(t.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) {
      int flags = 0;
      const bool got = ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
      ::close(fd);
      if (got && (flags & (FS_IMMUTABLE_FL | FS_APPEND_FL)))
        throw std::runtime_error(fmt::format("{}: the existing file is {} (chattr +{}): it cannot be replaced", path,
                                             flags & FS_IMMUTABLE_FL ? "immutable" : "append-only",
                                             flags & FS_IMMUTABLE_FL ? "i" : "a"));
    }
  }
  const TempFile probe = temp_file_beside(t.path, path, ".probe.");
  ::close(probe.fd);
  ::unlink(probe.name.c_str());
  forget_temp(probe.slot);
  return probe.made;
}

void remove_temp_files_on_signal() noexcept {
  for (int i = 0; i < kTempSlots; ++i)
    if (g_temp_used[i]) ::unlink(g_temp_names[i]);
}

void remove_created_dirs(const std::vector<std::string>& dirs) {
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) ::rmdir(it->c_str());  // only empty ones go
}

namespace {

// One file of write_files_atomic: a regular file's content staged in `tmp` (renamed over
// `target` at the commit), or a stream/descriptor written at once (tmp empty).
struct Staged {
  std::string path;    // as given (for messages)
  std::string target;  // the regular file after its links
  std::string tmp;     // the temporary file beside it, flushed and closed
  std::vector<std::string> made;  // folders made for it (only when they vanished after check_writable)
  int slot = -1;       // its remember_temp slot
};

// Writes `text` into a temporary file beside the regular file `t.path` (created or replaced
// later by rename): flushed, fsync'ed, closed, with the existing file's mode (and owner, where
// allowed). Throws std::runtime_error naming `path`; nothing is left behind then.
Staged stage_regular(const std::string& path, const OutputTarget& t, const std::string& text) {
  struct stat old{};
  const bool exists = ::stat(t.path.c_str(), &old) == 0 && S_ISREG(old.st_mode);
  const TempFile tmp = temp_file_beside(t.path, path, ".tmp.");
  const int fd = tmp.fd;
  const std::string& name = tmp.name;
  auto gone = [&] {  // the temporary file removed: what was made for it goes too
    ::unlink(name.c_str());
    forget_temp(tmp.slot);
    remove_created_dirs(tmp.made);
  };
  auto fail = [&](const char* what, int err) {
    ::close(fd);
    gone();
    throw std::runtime_error(fmt::format("{}: {}: {}", path, what, std::strerror(err)));
  };
  if (int err = write_all(fd, text)) fail("write failed", err);
  if (exists && (old.st_uid != ::geteuid() || old.st_gid != ::getegid()))
    (void)!::fchown(fd, old.st_uid, old.st_gid);  // best effort: only root may give a file away
  if (::fchmod(fd, exists ? (old.st_mode & 07777) : 0644) != 0) fail("chmod failed", errno);
  if (::fsync(fd) != 0) fail("fsync failed", errno);
  if (::close(fd) != 0) {
    int err = errno;
    gone();
    throw std::runtime_error(fmt::format("{}: close failed: {}", path, std::strerror(err)));
  }
  return {path, t.path, name, tmp.made, tmp.slot};
}

// Writes `text` into a stream or one of this process's descriptors (never replaced).
void write_stream(const std::string& path, const OutputTarget& t, const std::string& text) {
  if (t.kind == OutputTarget::Descriptor) {
    // Our own stdout/stderr or another open descriptor by name: write into it as it is
    // (a pipe, a terminal, or the file the shell redirected it to, at its offset).
    if (int err = write_all(t.fd, text))
      throw std::runtime_error(fmt::format("{}: write failed: {}", path, std::strerror(err)));
    return;
  }
  // A device, FIFO or socket (--out /dev/null, a named pipe): write into it, never replace it.
  int fd = ::open(t.path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  if (int err = write_all(fd, text)) {
    ::close(fd);
    throw std::runtime_error(fmt::format("{}: write failed: {}", path, std::strerror(err)));
  }
  if (::close(fd) != 0) throw std::runtime_error(fmt::format("{}: close failed: {}", path, std::strerror(errno)));
}

}  // namespace

void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<Staged> staged;
  auto discard = [&staged] {
    for (auto f = staged.rbegin(); f != staged.rend(); ++f) {
      ::unlink(f->tmp.c_str());
      forget_temp(f->slot);
      remove_created_dirs(f->made);
    }
  };
  std::vector<std::pair<std::size_t, OutputTarget>> streams;
  try {
    // 1. Every regular file's content into its temporary file: a failure replaces nothing.
    for (std::size_t i = 0; i < files.size(); ++i) {
      const std::string& path = files[i].first;
      if (path.empty()) throw std::runtime_error("empty result path");
      OutputTarget t = resolve_output(path);
      if (t.kind == OutputTarget::File) staged.push_back(stage_regular(path, t, files[i].second));
      else streams.emplace_back(i, std::move(t));
    }
    // 2. Streams and descriptors (they cannot be taken back): a failure still replaces no file.
    for (const auto& [i, t] : streams) write_stream(files[i].first, t, files[i].second);
  } catch (...) {
    discard();
    throw;
  }
  // 3. The renames: each atomic; only a failure here (rare: the directory changed under the run)
  // leaves the files renamed before it in place.
  for (std::size_t k = 0; k < staged.size(); ++k) {
    if (::rename(staged[k].tmp.c_str(), staged[k].target.c_str()) != 0) {
      const int err = errno;
      for (std::size_t j = k; j < staged.size(); ++j) {
        ::unlink(staged[j].tmp.c_str());
        forget_temp(staged[j].slot);
      }
      throw std::runtime_error(fmt::format("{}: rename failed: {}", staged[k].path, std::strerror(err)));
    }
    forget_temp(staged[k].slot);
  }
}

void write_file_atomic(const std::string& path, const std::string& text) { write_files_atomic({{path, text}}); }

}  // namespace mpt
