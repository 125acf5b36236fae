// Command line and the run of one experiment. See harness.hpp.
#include "core/harness.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/compare.hpp"
#include "core/compat.hpp"
#include "core/dist.hpp"
#include "core/errors.hpp"
#include "core/runtime.hpp"
#include "core/tolerance.hpp"

namespace mpt {

namespace {

void setup_logging(bool quiet, bool verbose) {
  static auto logger = [] {
    auto l = spdlog::stderr_color_mt("mpt");
    l->set_pattern("%^[%l]%$ %v");
    return l;
  }();
  spdlog::set_default_logger(logger);
  spdlog::set_level(verbose ? spdlog::level::debug : quiet ? spdlog::level::warn : spdlog::level::info);
}

std::string type_label(const Param& p) {
  switch (p.type) {
    case ParamType::Bool: return "bool";
    case ParamType::Int: return p.scalar_or_list ? "int|[int]" : "int";
    case ParamType::Number: return p.scalar_or_list ? "number|[number]" : "number";
    case ParamType::String: return "string";
    case ParamType::IntList: return "[int]";
    case ParamType::NumberList: return "[number]";
    case ParamType::StringList: return "[string]";
  }
  return "?";
}

std::string config_help(const ConfigSpec& spec) {
  std::string s = "Config keys (set in --config FILE or with --set key.path=VALUE):\n";
  for (const auto& [ptr, p] : spec.params()) {
    std::string key = ptr.substr(1);
    std::replace(key.begin(), key.end(), '/', '.');
    s += fmt::format("  {:<28} {:<16} default {}\n", key, type_label(p), p.default_value.dump());
    if (!p.doc.empty()) s += fmt::format("  {:<28} {}\n", "", p.doc);
  }
  return s;
}

// ---------------------------------------------------------------------------
// stdout: tables and --print-config go there, and losing them is an error (exit 3) unless
// the reader went away on purpose (`mpt underflow | head -1`: EPIPE, SIGPIPE ignored).
// ---------------------------------------------------------------------------

int g_stdout_errno = 0;        // errno of the first failed write to stdout; 0 while all went through
bool g_stdout_closed = false;  // fd 1 was closed when mpt started (now /dev/null)

// Opens /dev/null on any of the descriptors 0, 1, 2 that mpt was started without, so that no
// file mpt opens later (a result's temporary file) becomes its stdout or stderr.
void guard_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    const int n = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (n >= 0 && n != fd) ::dup2(n, fd), ::close(n);
    if (fd == 1) g_stdout_closed = true;
  }
  // A worker of `--nproc` whose launcher was started without stdout: its fd 1 is the launcher's
  // /dev/null, so it learns of the closed stdout from the launcher (spawn below).
  if (const char* v = std::getenv("MPT_STDOUT_CLOSED"); v && std::string(v) == "1") g_stdout_closed = true;
}

// Writes `text` to stdout and flushes it. Returns false, and remembers the reason, when it
// did not get there (a closed pipe, a full disk, stdout closed); later calls then write nothing.
bool emit(const std::string& text) {
  if (g_stdout_errno != 0) return false;
  if (g_stdout_closed) {
    if (!text.empty()) g_stdout_errno = EBADF;
    return text.empty();
  }
  std::cout.flush();  // whatever went through std::cout first keeps its place
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    g_stdout_errno = errno != 0 ? errno : EIO;
    std::clearerr(stdout);
    if (g_stdout_errno == EPIPE) spdlog::info("stdout was closed by its reader: the rest of the tables is not printed");
    return false;
  }
  return true;
}

// At the end of main_cli: flushes stdout and checks that everything written there arrived,
// including errors that show only at close (a dup of fd 1 is closed: NFS, full disks).
// Exit code: 3 with a message when output was lost, unless the run already failed (2, 3); a
// reader that closed the pipe (EPIPE) is not an error: the run did its work and wrote its
// result file, as `mpt ... | head` expects.
int finish_stdout(int code) {
  errno = 0;
  std::cout.flush();
  if ((!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) && g_stdout_errno == 0)
    g_stdout_errno = errno != 0 ? errno : EIO;
  if (g_stdout_errno == 0 && !g_stdout_closed) {
    const int d = ::dup(1);
    if (d >= 0 && ::close(d) != 0 && errno != EINTR) g_stdout_errno = errno;
  }
  if (g_stdout_errno == 0 || g_stdout_errno == EPIPE) return code;
  std::cerr << "mpt: cannot write to stdout: " << std::strerror(g_stdout_errno)
            << (code == kExitOk || code == kExitCheckFailed ? " (output lost; exit 3)" : "") << "\n";
  return code == kExitOk || code == kExitCheckFailed ? static_cast<int>(kExitRuntime) : code;
}

void print_report(const Report& r) {
  std::string out;
  for (const auto& sec : r.sections) {
    if (auto* t = std::get_if<Table>(&sec)) out += render_table(*t);
    if (auto* h = std::get_if<Histogram>(&sec)) out += render_histogram(*h);
    if (auto* b = std::get_if<TextBlock>(&sec)) out += "# " + b->title + "\n" + b->text;
    out += "\n";
  }
  out += render_checks(r.checks);
  emit(out);
}

}  // namespace

ConfigSpec full_spec(const Experiment& exp) {
  ConfigSpec spec = exp.spec();
  if (!spec.find("/seed")) spec.integer("/seed", 0, "seed of LibTorch's generator (torch.manual_seed)", 0);
  if (!spec.find("/device")) spec.choice("/device", "auto", {"auto", "cpu", "cuda"}, "auto = CUDA when available");
  if (!spec.find("/threads"))
    spec.integer("/threads", 0,
                 "intra-op threads per process (torch.set_num_threads); 0 = auto: the usable cores shared out among "
                 "this machine's mpt processes, max(1, cores / processes) (env.threads_policy)",
                 0, 1024);
  return spec;
}

Config resolve_for(const Experiment& exp, const ConfigSpec& spec, const RunOptions& opts) {
  if (opts.config_given && opts.config_file.empty())
    throw ConfigError("--config: expected a file path, got an empty string");
  std::vector<std::string> sets = opts.sets;
  if (opts.seed) sets.push_back("seed=" + *opts.seed);
  if (!opts.device.empty()) sets.push_back("device=\"" + opts.device + "\"");
  if (opts.nproc) sets.push_back("nproc=" + std::to_string(*opts.nproc));
  try {
    return resolve_config(spec, opts.config_file, sets);
  } catch (const ConfigError& e) {
    // --seed N goes through the schema as `seed=N`: name the option the user typed.
    const std::string as_set = opts.seed ? "--set '" + printable_text("seed=" + *opts.seed) + "'" : "";
    const std::string msg = e.what();
    if (!as_set.empty() && msg.rfind(as_set, 0) == 0)
      throw ConfigError("--seed '" + printable_text(*opts.seed) + "'" + msg.substr(as_set.size()));
    throw;
  }
}

nlohmann::ordered_json result_document(const Experiment& exp, const Config& cfg, const Report& report,
                                       const json& env, double wall_s) {
  using ojson = nlohmann::ordered_json;
  json results = report.results;
  for (const auto& sec : report.sections) {
    if (auto* t = std::get_if<Table>(&sec)) results[t->name] = table_json(*t);
    if (auto* h = std::get_if<Histogram>(&sec)) results[h->name] = histogram_json(*h);
  }
  json checks = json::array();
  for (const auto& c : report.checks)
    checks.push_back({{"name", c.name}, {"value", num(c.value)}, {"tolerance", num(c.tolerance)}, {"ok", c.ok}});
  json full_env = env;
  full_env.update(report.env);
  json timings = report.timings;
  timings["wall_s"] = wall_s;
  ojson doc;
  doc["schema_version"] = 1;
  doc["tool"] = {{"name", "mpt"}, {"version", MPT_VERSION}};
  doc["experiment"] = exp.name;
  doc["config"] = ojson::parse(cfg.json_value().dump());
  doc["env"] = ojson::parse(encode_nonfinite(full_env).dump());
  doc["results"] = ojson::parse(encode_nonfinite(results).dump());
  doc["checks"] = ojson::parse(checks.dump());
  doc["timings"] = ojson::parse(encode_nonfinite(timings).dump());
  return doc;
}

namespace {

// run_experiment's body; `made_dirs` receives the --out folders it created.
int run_experiment_in(const Experiment& exp, const RunOptions& opts, std::vector<std::string>& made_dirs) {
  const std::string prog = "mpt " + exp.name;
  ConfigSpec spec;
  try {
    spec = full_spec(exp);
    Config cfg = resolve_for(exp, spec, opts);
    if (opts.print_config) {
      emit(cfg.json_value().dump(2) + "\n");  // a lost write is exit 3 (finish_stdout)
      return kExitOk;
    }
    if (opts.out_given && opts.out.empty()) throw ConfigError("--out: expected a file path, got an empty string");
    const std::string out = opts.out.empty() ? "results/" + exp.name + ".json" : opts.out;

    // Multi-process experiments (a /nproc key): under a launcher (mpt --nproc, torchrun,
    // SLURM) this process is one rank; otherwise spawn /nproc workers of ourselves and wait.
    int rank = 0, world_size = 1;
    std::optional<dist::LaunchInfo> launch;
    if (spec.find("/nproc")) {
      // A launcher's environment is input like --nproc: malformed or too large is a usage error.
      try {
        launch = dist::launch_from_environment();
      } catch (const RuntimeFailure& e) {
        throw ConfigError(e.what());
      }
      const Param* np = spec.find("/nproc");
      if (launch && np->max && launch->world_size > *np->max)
        throw ConfigError(fmt::format("{}={} ({} environment): expected at most {:g} processes (the cap of /nproc), "
                                      "got {}", launch->world_size_var, launch->world_size, launch->launcher,
                                      *np->max, launch->world_size));
      // An explicit --nproc must agree with the launcher (mpt's own workers get the same argv).
      if (launch && opts.nproc && *opts.nproc != launch->world_size)
        throw ConfigError(fmt::format("--nproc {}: expected the world size of the {} environment ({}={}); drop "
                                      "--nproc under a launcher, or unset {} to spawn {} processes here",
                                      *opts.nproc, launch->launcher, launch->world_size_var, launch->world_size,
                                      launch->world_size_var, *opts.nproc));
    }
    const int planned = launch ? launch->world_size : spec.find("/nproc") ? static_cast<int>(cfg.integer("/nproc")) : 1;
    if (exp.validate) exp.validate(cfg, planned);  // before any worker exists
    // Before anything is allocated: does the config fit in this machine's memory? Checked once,
    // for all the workers, by the process that spawns them (not again in each worker, whose
    // MemAvailable already lacks what its siblings took); each rank under torchrun/SLURM checks
    // its own share.
    if (exp.memory && !(launch && launch->launcher == "mpt")) {
      std::string source;
      const int64_t available = available_memory_bytes(&source);
      const MemoryEstimate need = exp.memory(cfg, launch ? 1 : planned);
      spdlog::debug("memory estimate {} of {} available ({})", human_bytes(need.total()),
                    available < 0 ? std::string("unknown") : human_bytes(static_cast<double>(available)), source);
      check_memory(need, available, source);
    }
    // The result file must be writable before the run, not found unwritable after it (rank 0 writes).
    if (!launch || launch->rank == 0) {
      try {
        made_dirs = check_writable(out);
      } catch (const std::exception& e) {
        throw ConfigError(fmt::format("--out {}", e.what()));
      }
    }
    if (spec.find("/nproc")) {
      if (!launch && cfg.integer("/nproc") > 1) {
        choose_device(cfg.str("/device"));  // an unusable device fails once, here, not in every worker
        // Workers notice a failed peer within the experiment's timeout; then they get 10 s more.
        double grace = 60.0;
        for (const char* key : {"/dist/timeout_s", "/pipeline/timeout_s"})
          if (spec.find(key)) grace = cfg.number(key) + 10.0;
        if (g_stdout_closed) ::setenv("MPT_STDOUT_CLOSED", "1", 1);  // rank 0 prints the tables
        return dist::spawn_local(static_cast<int>(cfg.integer("/nproc")), opts.argv, grace);
      }
      if (launch) {
        rank = launch->rank;
        world_size = launch->world_size;
        if (rank != 0 && !opts.verbose) spdlog::set_level(spdlog::level::warn);
        spdlog::debug("rank {} of {} (launcher: {})", rank, world_size, launch->launcher);
      }
    }

    torch::Device device = choose_device(cfg.str("/device"));
    const ThreadPolicy threads = apply_threads(cfg.integer("/threads"));
    seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
    json env = environment(device);
    env["threads_policy"] = to_json(threads);
    spdlog::debug("device {} (fp16 compute {}), LibTorch {}", device.str(), env["fp16_compute"].get<std::string>(),
                  compat::torch_version());

    // Progress lines only where a person watches: stderr a terminal, not -q, rank 0.
    const bool tty = isatty(2) != 0 && !opts.quiet && rank == 0;
    Context ctx{cfg, device, env["fp16_compute"].get<std::string>(), opts.verbose, tty, rank, world_size};
    const double t0 = now_seconds();
    Report report = exp.run(ctx);
    const double wall = now_seconds() - t0;
    if (rank != 0) return report.all_checks_ok() ? kExitOk : kExitCheckFailed;  // rank 0 prints and writes

    if (!opts.quiet) print_report(report);  // a closed or full stdout: the result is still written
    auto doc = result_document(exp, cfg, report, env, wall);
    try {
      write_file_atomic(out, doc.dump(2) + "\n");
    } catch (const std::exception& e) {
      spdlog::error("{}: cannot write the result file: {}", prog, e.what());
      return kExitRuntime;
    }
    spdlog::info("wrote {} ({:.2f} s)", out, wall);
    if (!report.all_checks_ok()) {
      for (const auto& c : report.checks)
        if (!c.ok) spdlog::error("{}: check failed: {} = {:g} > {:g}", prog, c.name, c.value, c.tolerance);
      return kExitCheckFailed;
    }
    return kExitOk;
  } catch (const ConfigError& e) {
    spdlog::error("{}: config error: {}", prog, e.what());
    return kExitUsage;
  } catch (const RuntimeFailure& e) {
    spdlog::error("{}: {}", prog, e.what());
    return kExitRuntime;
  } catch (const c10::Error& e) {
    spdlog::error("{}: LibTorch error: {}", prog, e.what_without_backtrace());
    return kExitRuntime;
  } catch (const std::exception& e) {
    spdlog::error("{}: {}", prog, e.what());
    return kExitRuntime;
  }
}

}  // namespace

int run_experiment(const Experiment& exp, const RunOptions& opts) {
  setup_logging(opts.quiet, opts.verbose);
  std::vector<std::string> made_dirs;
  const int code = run_experiment_in(exp, opts, made_dirs);
  // A run that ends without a result takes away the --out folders it made (only empty ones go:
  // where rank 0 or a failed check wrote its result, they stay).
  remove_created_dirs(made_dirs);
  return code;
}

int run_compare(const std::string& base_file, const std::string& new_file, const std::vector<std::string>& key_tols,
                CompareOptions opt, bool quiet, const std::vector<std::string>& tol_files) {
  setup_logging(false, false);
  try {
    // Checked here rather than by CLI11 (which lets "nan" through): NaN, infinity and negative
    // numbers are no tolerance.
    for (const auto& [flag, v] : {std::pair<const char*, double>{"--rtol", opt.rtol}, {"--atol", opt.atol}})
      if (!(v >= 0) || !std::isfinite(v))
        throw ConfigError(fmt::format("{} {:g}: expected a finite number >= 0 (tolerances must be finite)", flag, v));
    for (const auto& k : key_tols) {
      auto eq = k.rfind('=');
      if (eq == std::string::npos || eq == 0)
        throw ConfigError("--tol '" + printable_text(k) + "': expected PATTERN=RTOL[,ATOL]");
      KeyTolerance kt{k.substr(0, eq)};
      std::string v = k.substr(eq + 1);
      auto comma = v.find(',');
      try {
        std::size_t used = 0;
        kt.rtol = std::stod(v.substr(0, comma), &used);
        if (used != (comma == std::string::npos ? v.size() : comma)) throw std::invalid_argument("rtol");
        if (comma != std::string::npos) {
          const std::string a = v.substr(comma + 1);
          kt.atol = std::stod(a, &used);
          if (used != a.size()) throw std::invalid_argument("atol");
        }
      } catch (const std::exception&) {
        throw ConfigError("--tol '" + printable_text(k) + "': expected PATTERN=RTOL[,ATOL] with RTOL and ATOL numbers");
      }
      if (!(kt.rtol >= 0) || !(kt.atol >= 0) || !std::isfinite(kt.rtol) || !std::isfinite(kt.atol))
        throw ConfigError("--tol '" + printable_text(k) + "': tolerances must be finite numbers >= 0");
      opt.per_key.push_back(kt);
    }
    for (const auto& f : tol_files)  // after the --tol rules: the command line wins
      for (auto& kt : read_tolerance_file(f)) opt.per_key.push_back(std::move(kt));
    json a = read_json_file(base_file, "result file", kResultLimits);
    json b = read_json_file(new_file, "result file", kResultLimits);
    Comparison c = compare_results(a, b, opt, base_file, new_file);
    if (!quiet && !c.diffs.empty())
      emit(render_table(comparison_table(
               c, fmt::format("Differences: {} -> {}", printable_text(base_file, 200), printable_text(new_file, 200)))) +
           "\n");
    if (!quiet && !c.timings.empty()) emit(render_table(timings_table(c)) + "\n");
    emit(fmt::format("compare: {} of {} values differ beyond tolerance (rtol {:g}, atol {:g}{}){}: {}\n",
                     c.diffs.size(), c.compared, opt.rtol, opt.atol,
                     opt.per_key.empty() ? "" : fmt::format(", {} per-key", opt.per_key.size()),
                     c.unbounded ? fmt::format("; {} unbounded values not compared", c.unbounded) : "",
                     c.ok() ? "OK" : "FAILED"));
    return c.ok() ? kExitOk : kExitCheckFailed;
  } catch (const ConfigError& e) {
    spdlog::error("mpt compare: {}", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {  // e.g. a result file whose fields have unexpected types
    spdlog::error("mpt compare: not a valid mpt result file: {}", e.what());
    return kExitUsage;
  }
}

int run_env(const std::string& device_name, bool as_json) {
  setup_logging(false, false);
  try {
    const ThreadPolicy threads = apply_threads(0);  // what an experiment's run would use here
    json env = environment(choose_device(device_name));
    env["threads_policy"] = to_json(threads);
    if (as_json) {
      emit(env.dump(2) + "\n");
    } else {
      // One "path  value" line per leaf, in the order of the JSON document.
      std::function<void(const json&, const std::string&)> walk = [&](const json& j, const std::string& path) {
        if (j.is_object() && !j.empty()) {
          for (auto it = j.begin(); it != j.end(); ++it) walk(it.value(), path.empty() ? it.key() : path + "." + it.key());
        } else if (j.is_array() && !j.empty()) {
          for (std::size_t i = 0; i < j.size(); ++i) walk(j[i], fmt::format("{}[{}]", path, i));
        } else {
          emit(fmt::format("{:<34} {}\n", path, j.is_string() ? j.get<std::string>() : j.dump()));
        }
      };
      walk(env, "");
    }
    return kExitOk;
  } catch (const RuntimeFailure& e) {
    spdlog::error("mpt env: {}", e.what());
    return kExitRuntime;
  }
}
namespace {
int main_cli_in(int argc, char** argv);
}  // namespace

int main_cli(int argc, char** argv) {
  // A reader that goes away (`mpt underflow | head -1`) must not kill the run before it
  // writes its result file: writes to the closed pipe fail with EPIPE instead (emit()).
  std::signal(SIGPIPE, SIG_IGN);
  guard_standard_descriptors();
  return finish_stdout(main_cli_in(argc, argv));
}

namespace {

int main_cli_in(int argc, char** argv) {
  CLI::App app{"mpt: see what happens inside reduced-precision and parallel training.\n"
               "Each experiment prints tables on stdout and writes one JSON result file.",
               "mpt"};
  app.set_version_flag("--version", std::string("mpt ") + MPT_VERSION + " (LibTorch " + compat::torch_version() +
                                        (compat::kBuiltWithCuda ? ", CUDA" : ", CPU only") + ")");
  app.require_subcommand(1);
  app.footer("Run `mpt list` for the experiments, `mpt <experiment> --help` for options and config keys.");

  std::vector<std::string> known = {"list", "compare", "env"};
  for (const auto& e : experiments()) known.push_back(e.name);
  // "did you mean" for a mistyped subcommand (CLI11 would only say "not expected").
  if (argc > 1 && argv[1][0] != '-' && std::find(known.begin(), known.end(), argv[1]) == known.end()) {
    std::string hint = nearest(argv[1], known);
    std::cerr << "mpt: unknown experiment '" << argv[1] << "'"
              << (hint.empty() ? "" : " (did you mean '" + hint + "'?)") << "; `mpt list` shows them all\n";
    return kExitUsage;
  }

  auto* list = app.add_subcommand("list", "List the experiments with one-line summaries");
  list->callback([] {
    std::string text;
    for (const auto& e : experiments()) text += fmt::format("{:<14} {}\n", e.name, e.summary);
    emit(text);
  });

  // `mpt env`: the hardware and kernel fingerprint that result files carry in env, for bug reports.
  bool env_json = false;
  std::string env_device = "cpu";
  auto* envcmd = app.add_subcommand("env", "Print the hardware and kernels that produce the numbers (for bug reports)");
  envcmd->add_flag("--json", env_json, "As JSON (the `env` block of a result file)");
  envcmd->add_option("--device", env_device, "cpu | cuda | auto: the device whose fp16/bf16 kernels are probed")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  bool env_chosen = false;
  envcmd->callback([&] { env_chosen = true; });

  std::string base_file, new_file;
  std::vector<std::string> key_tols;
  CompareOptions cmp;
  bool cmp_quiet = false;
  auto* compare = app.add_subcommand("compare", "Compare two result files (exit 0 within tolerance, 1 not, 2 unreadable)");
  compare->add_option("base", base_file, "Base result file")->required();
  compare->add_option("new", new_file, "New result file")->required();
  compare->add_option("--rtol", cmp.rtol, "Relative tolerance >= 0 (default 0: exact)");
  compare->add_option("--atol", cmp.atol, "Absolute tolerance >= 0 (default 0: exact)");
  compare->add_option("--tol", key_tols, "Per-key tolerance PATTERN=RTOL[,ATOL], PATTERN a glob on paths such as "
                                         "/results/gradients/*/mean_abs; repeatable, first match wins");
  std::vector<std::string> tol_files;
  compare->add_option("--tol-file", tol_files, "File of per-key tolerances derived from error bounds (PATTERN exact | "
                                              "rel EXPR | abs EXPR; docs/results.md); repeatable, after --tol");
  compare->add_flag("--timings", cmp.timings, "Also report the relative change of timings (never fails)");
  compare->add_flag("-q,--quiet", cmp_quiet, "Only the summary line");
  bool compare_chosen = false;
  compare->callback([&] { compare_chosen = true; });

  RunOptions opts;
  const Experiment* chosen = nullptr;
  for (const auto& e : experiments()) {
    auto* sub = app.add_subcommand(e.name, e.summary);
    sub->add_option("--config", opts.config_file, "JSON config file (merged over the built-in defaults)")
        ->each([&opts](const std::string&) { opts.config_given = true; });
    sub->add_option("--set", opts.sets, "Override one config key: path.to.key=VALUE (VALUE is JSON, else a string); repeatable")
        ->take_all()
        ->allow_extra_args(false);
    sub->add_option("--out", opts.out, "Result file (default results/" + e.name + ".json)")
        ->each([&opts](const std::string&) { opts.out_given = true; });
    sub->add_option("--device", opts.device, "auto | cpu | cuda (auto = CUDA when available)")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    sub->add_option("--seed", opts.seed, "Seed (overrides the config's /seed)");
    sub->add_flag("--print-config", opts.print_config, "Print the resolved config as JSON and exit");
    sub->add_flag("-q,--quiet", opts.quiet, "No tables; warnings and errors only");
    sub->add_flag("-v,--verbose", opts.verbose, "Debug logging on stderr");
    if (full_spec(e).find("/nproc"))  // multi-process experiments only
      sub->add_option("--nproc", opts.nproc, "Spawn N worker processes on this machine (= --set nproc=N)");
    sub->footer(config_help(full_spec(e)));
    sub->callback([&chosen, &e] { chosen = &e; });
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  if (compare_chosen) return run_compare(base_file, new_file, key_tols, cmp, cmp_quiet, tol_files);
  if (env_chosen) return run_env(env_device, env_json);
  opts.argv.assign(argv, argv + argc);
  if (chosen) return run_experiment(*chosen, opts);
  return kExitOk;
}

}  // namespace

}  // namespace mpt
