// The run of one experiment: config, launch, device, run, report, result file. See harness.hpp.
#include "app/harness.hpp"

#include "core/runtime/cpu_load.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app/output.hpp"
#include "app/registry.hpp"
#include "core/runtime/compat.hpp"
#include "core/io/config.hpp"
#include "core/dist/dist.hpp"
#include "core/errors.hpp"
#include "core/numerics/rounding_simd.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/trace.hpp"
#include "core/dist/world.hpp"

namespace mpt {

namespace {

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

// Whether paths a and b name one file: the same path once made absolute and normalised, symbolic
// links (of the file — also one whose target does not exist yet — and of its folders) resolved.
std::filesystem::path resolved_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code e;
  fs::path p = fs::absolute(path, e);
  for (int hops = 0; hops < 40 && fs::is_symlink(p, e); ++hops) {
    const fs::path target = fs::read_symlink(p, e);
    if (e) break;
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  return fs::weakly_canonical(p, e);
}
bool same_file(const std::string& a, const std::string& b) {
  if (resolved_path(a) == resolved_path(b)) return true;
  std::error_code e;
  return std::filesystem::exists(a, e) && std::filesystem::exists(b, e) && std::filesystem::equivalent(a, b, e);
}

// Number of NTP-style clock exchanges per rank at the start of a traced multi-process run
// (the one with the smallest round trip is used; trace::ClockSync).
constexpr int kClockRounds = 16;

// This rank's part of a traced run, as rank 0 receives it; rank 0 reads its own events from
// the recorder (trace_document), so its part carries none.
json trace_part(const World* world, const torch::Device& device, const trace::ClockSync& clock) {
  json part;
  part["rank"] = world ? world->rank() : 0;
  part["device"] = world ? world->device().str() : device.str();
  part["os_pid"] = static_cast<int64_t>(::getpid());
  part["clock"] = {{"offset_us", clock.offset_us}, {"error_us", clock.error_us}, {"rtt_us", clock.rtt_us},
                   {"rounds", clock.rounds}};
  return part;
}

// Rank 0: the Chrome Trace file's text from every rank's part (rank order) and, for ranks
// other than 0, its events (events_json text); rank 0's own events come from the recorder.
// Written event by event (trace::write_chrome_trace): no JSON tree of the whole trace.
// Returns the text and the number of entries of traceEvents.
std::pair<std::string, std::size_t> trace_document(const Experiment& exp, const Config& cfg,
                                                   const std::vector<json>& parts,
                                                   const std::vector<std::string>& events, int world_size,
                                                   const std::string& launcher) {
  std::vector<std::vector<trace::Event>> others(parts.size());
  std::vector<trace::RankEvents> per_rank;
  std::vector<trace::ClockSync> clocks;
  json ranks = json::array();
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const json& p = parts[i];
    if (i == 0) {
      per_rank.push_back([](const std::function<void(const trace::Event&)>& fn) { trace::for_each_event(fn); });
    } else {
      others[i] = trace::events_from_text(events.at(i));  // no JSON tree of the whole part
      per_rank.push_back(trace::rank_events(others[i]));
    }
    trace::ClockSync c;
    c.rank = p.at("rank").get<int>();
    c.offset_us = p.at("clock").at("offset_us").get<double>();
    c.error_us = p.at("clock").at("error_us").get<double>();
    c.rtt_us = p.at("clock").at("rtt_us").get<double>();
    c.rounds = p.at("clock").at("rounds").get<int>();
    clocks.push_back(c);
    ranks.push_back({{"rank", c.rank}, {"device", p.at("device")}, {"os_pid", p.at("os_pid")}});
  }
  json meta = trace::metadata();
  meta["tool"] = {{"name", "mpt"}, {"version", MPT_VERSION}, {"torch", compat::torch_version()}};
  meta["experiment"] = exp.name;
  meta["world_size"] = world_size;
  meta["launcher"] = launcher;
  meta["ranks"] = ranks;
  meta["config"] = cfg.json_value();
  std::string text;
  const std::size_t n = trace::write_chrome_trace(text, per_rank, clocks, trace::start_us(), meta);
  return {std::move(text), n};
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

Config resolve_for(const ConfigSpec& spec, const RunOptions& opts) {
  if (opts.config_given && opts.config_file.empty())
    throw ConfigError("--config: expected a file path, got an empty string");
  // An option and a --set of the key it stands for, with different values: one would silently win
  // (--nproc 2 --set nproc=4 ran 2 processes). Refused, naming both.
  auto refuse_conflict = [&](const std::string& option, const std::string& value, const std::string& key) {
    for (const auto& set : opts.sets) {
      const std::size_t eq = set.find('=');
      if (eq == std::string::npos || eq == 0) continue;
      std::string pointer;
      try {
        pointer = to_pointer(set.substr(0, eq));
      } catch (const ConfigError&) {
        continue;  // malformed: resolve_config names it
      }
      if (pointer == "/" + key && set.substr(eq + 1) != value)
        throw ConfigError(fmt::format("{} {} and --set '{}' give /{} two values: keep one", option, printable_text(value, 40),
                                      printable_text(set, 200), key));
    }
  };
  if (opts.seed) refuse_conflict("--seed", *opts.seed, "seed");
  if (!opts.device.empty()) refuse_conflict("--device", opts.device, "device");
  if (opts.nproc) refuse_conflict("--nproc", *opts.nproc, "nproc");
  std::vector<std::string> sets = opts.sets;
  if (opts.seed) sets.push_back("seed=" + *opts.seed);
  if (!opts.device.empty()) sets.push_back("device=\"" + opts.device + "\"");
  if (opts.nproc) sets.push_back("nproc=" + *opts.nproc);
  try {
    return resolve_config(spec, opts.config_file, sets);
  } catch (const ConfigError& e) {
    // --seed N and --nproc N go through the schema as `seed=N`, `nproc=N`: name the option the
    // user typed.
    const std::string msg = e.what();
    auto typed = [&](const std::string& key, const std::string& value, const std::string& option) {
      const std::string as_set = "--set '" + printable_text(key + "=" + value) + "'";
      if (msg.rfind(as_set, 0) == 0) throw ConfigError(option + " '" + printable_text(value) + "'" + msg.substr(as_set.size()));
    };
    if (opts.seed) typed("seed", *opts.seed, "--seed");
    if (opts.nproc) typed("nproc", *opts.nproc, "--nproc");
    throw;
  }
}

nlohmann::ordered_json result_document(const Experiment& exp, const Config& cfg, const Report& report,
                                       const json& env, double wall_s) {
  using ojson = nlohmann::ordered_json;
  json results = report.results;
  json timings = report.timings;
  for (const auto& sec : report.sections) {
    if (auto* t = std::get_if<Table>(&sec)) {
      json& into = t->store == Store::Results ? results : timings;
      if (t->store != Store::Results && into.contains(t->name))
        throw std::logic_error("table '" + t->name + "' and a timings value share the key");
      into[t->name] = t->store == Store::TimingsByName ? table_json_by_name(*t) : table_json(*t);
    }
    if (auto* h = std::get_if<Histogram>(&sec)) results[h->name] = histogram_json(*h);
  }
  json checks = json::array();
  for (const auto& c : report.checks)
    checks.push_back({{"name", c.name}, {"value", num(c.value)}, {"tolerance", num(c.tolerance)}, {"ok", c.ok}});
  json full_env = env;
  full_env.update(report.env);
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

// What this run made for its --out / --trace, for a SIGINT, SIGTERM or SIGHUP that ends it
// before its result: the handler removes the temporary files of a write in progress (core/io/results:
// a result staged while a FIFO trace blocks the write) and the empty folders the run created
// (unlink(2) and rmdir(2) are async-signal-safe), then dies of the signal as it would have
// (default disposition, re-raised). The launcher of --nproc passes the signal on to its workers
// first and waits for them (core/dist/launch), as rank 0 writes the files: an interrupted run
// leaves no more behind than a failed one.
constexpr int kMaxSignalDirs = 64;
const char* g_signal_dirs[kMaxSignalDirs];
volatile std::sig_atomic_t g_signal_ndirs = 0;

extern "C" void remove_outputs_and_reraise(int sig) {
  dist::end_workers_on_signal(sig);  // the launcher: rank 0 removes what it was writing, then ends
  remove_temp_files_on_signal();
  for (int i = g_signal_ndirs - 1; i >= 0; --i) ::rmdir(g_signal_dirs[i]);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// Installs remove_outputs_and_reraise on the signals whose disposition is still the default (an
// ignored SIGHUP under nohup stays ignored). In the process that writes the outputs (or spawns
// the workers), once they are checked: the temporary files go even when no folder was made.
void remove_outputs_on_signal() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old{};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(sig, remove_outputs_and_reraise);
  }
}

// The folders (outermost first) that remove_outputs_and_reraise removes; {} once they hold the
// result or are gone.
void remove_dirs_on_signal(const std::vector<std::string>& dirs) {
  static std::vector<std::string> storage;  // owns the paths the handler reads (one run at a time)
  g_signal_ndirs = 0;                       // the handler sees no path while they change
  if (dirs.empty()) return;
  storage = dirs;
  int n = 0;
  for (const auto& d : storage)
    if (n < kMaxSignalDirs) g_signal_dirs[n++] = d.c_str();
  g_signal_ndirs = n;
}

// --nproc on a single-process experiment: refused, naming the experiments it is for.
void refuse_nproc_for_single(const Experiment& exp, const RunOptions& opts) {
  if (!opts.nproc || exp.processes == Processes::Multi) return;
  std::string multis;
  for (const auto& e : experiments())
    if (e.processes == Processes::Multi) multis += (multis.empty() ? "" : ", ") + e.name;
  throw ConfigError(fmt::format("--nproc '{}': {} runs in one process; --nproc is for the multi-process "
                                "experiments ({})", printable_text(*opts.nproc), exp.name, multis));
}

// The launcher this process runs under (mpt --nproc, torchrun, SLURM), if any. Its environment is
// input like --nproc: malformed, larger than /nproc's cap or disagreeing with an explicit --nproc
// is a usage error (ConfigError).
std::optional<dist::LaunchInfo> launcher_of(const ConfigSpec& spec, const Config& cfg, const RunOptions& opts) {
  std::optional<dist::LaunchInfo> launch;
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
  if (launch && opts.nproc && cfg.integer("/nproc") != launch->world_size)
    throw ConfigError(fmt::format("--nproc {}: expected the world size of the {} environment ({}={}); drop "
                                  "--nproc under a launcher, or unset {} to spawn {} processes here",
                                  cfg.integer("/nproc"), launch->launcher, launch->world_size_var,
                                  launch->world_size, launch->world_size_var, cfg.integer("/nproc")));
  return launch;
}

// The last --set of the key at `pointer` (it won), or null.
const std::string* last_set(const RunOptions& opts, const std::string& pointer) {
  for (auto it = opts.sets.rbegin(); it != opts.sets.rend(); ++it) {
    const std::size_t eq = it->find('=');
    if (eq == std::string::npos || eq == 0) continue;
    try {
      if (to_pointer(it->substr(0, eq)) == pointer) return &*it;
    } catch (const ConfigError&) {
    }
  }
  return nullptr;
}

// What a validate error is about, for a multi-process experiment whose world size came from the
// command line or a launcher: when the same config passes with the world size it holds itself
// (its file's /nproc, else the default), the world size is the cause, whatever key the message
// names (a batch that does not divide, an op that needs 2 processes), and it is blamed first.
void blame_world_size(const Experiment& exp, const ConfigSpec& spec, const RunOptions& opts,
                      const std::optional<dist::LaunchInfo>& launch, int planned, const std::string& what) {
  const std::string* set_nproc = last_set(opts, "/nproc");
  std::string cause;
  if (launch)
    cause = fmt::format("the {} environment's world size ({}={})", launch->launcher, launch->world_size_var,
                        launch->world_size);
  else if (opts.nproc)
    cause = "--nproc " + printable_text(*opts.nproc, 40);
  else if (set_nproc)
    cause = "--set '" + printable_text(*set_nproc, 200) + "'";
  if (cause.empty()) return;
  RunOptions own = opts;
  own.nproc.reset();
  own.sets.erase(std::remove_if(own.sets.begin(), own.sets.end(),
                                [&](const std::string& x) { return set_nproc && x == *set_nproc; }),
                 own.sets.end());
  bool fits_own = false;
  try {
    const Config own_cfg = resolve_for(spec, own);
    const int own_n = static_cast<int>(own_cfg.integer("/nproc"));
    if (own_n != planned) {
      exp.validate(own_cfg, own_n);
      fits_own = true;
    }
  } catch (const ConfigError&) {
  }
  if (fits_own)
    throw ConfigError(fmt::format("{}: {} does not fit {} process{}: {}", cause,
                                  opts.config_file.empty() ? std::string("the config")
                                                           : printable_text(opts.config_file, 200),
                                  planned, planned == 1 ? "" : "es", what));
}

// exp.validate(cfg, planned), before any work and before any worker exists. A cross-key error
// (it starts with a JSON pointer) says where its value came from, as single-key errors do: the
// last --set of that key, else the config file; one about the world size (/nproc) names its
// source when that was not the config file (--nproc, a --set of nproc, a launcher).
void validate_naming_sources(const Experiment& exp, const ConfigSpec& spec, const Config& cfg, const RunOptions& opts,
                             const std::optional<dist::LaunchInfo>& launch, bool multi, int planned) {
  try {
    exp.validate(cfg, planned);
  } catch (const ConfigError& e) {
    std::string what = e.what();
    if (multi) blame_world_size(exp, spec, opts, launch, planned, what);
    if (multi && what.find("/nproc") != std::string::npos) {
      if (launch)
        what += fmt::format(" [/nproc: the world size {} of the {} environment, {}]", planned, launch->launcher,
                            launch->world_size_var);
      else if (opts.nproc)
        what += fmt::format(" [/nproc = {} from --nproc {}]", planned, printable_text(*opts.nproc, 40));
      else if (const std::string* set = last_set(opts, "/nproc"))
        what += fmt::format(" [/nproc = {} from --set '{}']", planned, printable_text(*set, 200));
    }
    const std::size_t colon = what.find(':');
    if (!what.empty() && what[0] == '/' && colon != std::string::npos)
      if (const std::string* set = last_set(opts, what.substr(0, colon)))
        throw ConfigError("--set '" + printable_text(*set, 200) + "': " + what);
    if (opts.config_file.empty()) throw ConfigError(what);
    throw ConfigError(fmt::format("{}{}: {}", opts.config_file, opts.sets.empty() ? "" : " with --set", what));
  }
}

// Before anything is allocated: does the config fit in this machine's memory? Checked once, for
// all the workers, by the process that spawns them (not again in each worker, whose MemAvailable
// already lacks what its siblings took); each rank under torchrun/SLURM checks its own share.
void check_memory_fits(const Experiment& exp, const Config& cfg, const std::optional<dist::LaunchInfo>& launch,
                       const ProcessPlan& plan, int planned) {
  if (!exp.memory || (launch && launch->launcher == "mpt")) return;
  std::string source;
  const int64_t available = available_memory_bytes(&source);
  const MemoryEstimate need = exp.memory(cfg, launch || !plan.one_process_because.empty() ? 1 : planned);
  spdlog::debug("memory estimate {} of {} available ({})", human_bytes(need.total()),
                available < 0 ? std::string("unknown") : human_bytes(static_cast<double>(available)), source);
  check_memory(need, available, source);
}

// The result file (and --trace) must be writable before the run, not found unwritable after it,
// and neither may replace the config or each other. Rank 0 (or the only process) makes their
// folders (`made_dirs`) and arms the signal handler that removes them with a staged result.
void check_outputs(const RunOptions& opts, const std::string& out, const std::optional<dist::LaunchInfo>& launch,
                   std::vector<std::string>& made_dirs) {
  if (opts.trace_given && opts.trace.empty()) throw ConfigError("--trace: expected a file path, got an empty string");
  if (!opts.trace.empty() && same_file(opts.trace, out))
    throw ConfigError(fmt::format("--trace {}: expected a file other than the result file (--out {}): the trace "
                                  "would replace the result",
                                  printable_text(opts.trace, 200), printable_text(out, 200)));
  // An output over the config it was run from would lose the config (a result file is no config).
  if (!opts.config_file.empty()) {
    if (same_file(out, opts.config_file))
      throw ConfigError(fmt::format("--out {}: expected a file other than the config (--config {}): the result "
                                    "would replace the config",
                                    printable_text(out, 200), printable_text(opts.config_file, 200)));
    if (!opts.trace.empty() && same_file(opts.trace, opts.config_file))
      throw ConfigError(fmt::format("--trace {}: expected a file other than the config (--config {}): the trace "
                                    "would replace the config",
                                    printable_text(opts.trace, 200), printable_text(opts.config_file, 200)));
  }
  if (launch && launch->rank != 0) return;
  try {
    made_dirs = check_writable(out);
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("--out {}", e.what()));
  }
  if (!opts.trace.empty()) {  // so must the trace (rank 0 writes it, after gathering every rank's events)
    try {
      for (auto& d : check_writable(opts.trace)) made_dirs.push_back(std::move(d));
    } catch (const std::exception& e) {
      throw ConfigError(fmt::format("--trace {}", e.what()));
    }
  }
  remove_dirs_on_signal(made_dirs);  // Ctrl-C or a kill before the result: the folders go too,
  remove_outputs_on_signal();        // and a result staged but not yet renamed
}

// mpt --nproc N outside a launcher: N workers of this same command line, waited for. Workers
// notice a failed peer within the experiment's timeout; the launcher gives them 10 s more.
int spawn_workers(const Config& cfg, const ProcessPlan& plan, const RunOptions& opts) {
  choose_device(cfg.str("/device"));  // an unusable device fails once, here, not in every worker
  if (stdout_closed()) ::setenv("MPT_STDOUT_CLOSED", "1", 1);  // rank 0 prints the tables
  // The workers keep this process's wait policy: measured at their own start, each would count
  // its siblings' start-ups as another process's load (src/app/main.cpp).
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("MPT_OMP_WAIT_POLICY_DEFAULT")) {
    ::setenv("MPT_OMP_WAIT_POLICY_DEFAULT", "libgomp", 1);
    if (start_runnable_others() >= 0)
      ::setenv("MPT_START_RUNNABLE_OTHERS", fmt::format("{:.2f}", start_runnable_others()).c_str(), 1);
  }
  return dist::spawn_local(static_cast<int>(cfg.integer("/nproc")), opts.argv, plan.timeout_s + 10.0);
}

// This process's threads and seed; returns the env facts (hardware, kernels, thread policy) that
// say what produced the result.
json set_up_process(const Config& cfg, const torch::Device& device) {
  const ThreadPolicy threads = apply_threads(cfg.integer("/threads"));
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  json env = environment(device);
  env["threads_policy"] = to_json(threads);
  spdlog::debug("device {} (fp16 compute {}), LibTorch {}", device.str(), env["fp16_compute"].get<std::string>(),
                compat::torch_version());
  return env;
}

// What every rank must share, checked against rank 0's when the job connects: the experiment,
// the versions and the config, less the data folders (another machine may keep the same files
// elsewhere).
std::string launch_fingerprint(const Experiment& exp, const Config& cfg, int world_size) {
  json shared = cfg.json_value();
  std::function<void(json&)> drop_dirs = [&](json& j) {
    if (!j.is_object()) return;
    for (auto it = j.begin(); it != j.end();) {
      const std::string& k = it.key();
      const bool dir = k == "dir" || (k.size() > 4 && k.compare(k.size() - 4, 4, "_dir") == 0);
      if (dir && it->is_string()) {
        it = j.erase(it);
      } else {
        drop_dirs(*it);
        ++it;
      }
    }
  };
  drop_dirs(shared);
  return json{{"experiment", exp.name}, {"world_size", world_size}, {"mpt", MPT_VERSION},
              {"libtorch", compat::torch_version()}, {"config", shared}}.dump();
}

// This rank's World (its device, the store and groups on first use, the fault point), with how
// Gloo groups (the CPU's; experiments may form them beside NCCL's) run reduce_scatter and
// all_gather (/dist/gloo_algorithm where the experiment has it, else native) recorded as env.dist.
void make_world(std::optional<World>& world, const Experiment& exp, const Config& cfg, const ProcessPlan& plan,
                const std::optional<dist::LaunchInfo>& launch, const torch::Device& device, json& env) {
  world.emplace(launch.value_or(dist::LaunchInfo{}), device,
                std::chrono::milliseconds(static_cast<int64_t>(plan.timeout_s * 1000)), plan.fault);
  const dist::GlooAlgorithm algo = dist::gloo_algorithm_from_name(plan.gloo_algorithm);
  world->set_gloo_algorithm(algo);
  env["dist"] = {{"gloo_algorithm", dist::gloo_algorithm_name(algo)},
                 {"reduce_scatter", dist::collective_algorithm("gloo", algo, "reduce_scatter")},
                 {"all_gather", dist::collective_algorithm("gloo", algo, "all_gather")}};
  if (device.is_cuda())
    env["dist"]["nccl"] = dist::collective_algorithm("nccl", algo, "reduce_scatter") + "; " +
                          dist::collective_algorithm("nccl", algo, "all_gather");
  world->set_launch_fingerprint(launch_fingerprint(exp, cfg, world->size()));
}

// --trace: every rank records; with several processes each measures its clock against rank 0's
// first (through the store; the world group connects it).
struct Recording {
  bool on = false;
  trace::ClockSync clock;
  double t0_us = 0;
};
Recording start_recording(const RunOptions& opts, int rank, World* world, const torch::Device& device) {
  Recording r;
  r.on = !opts.trace.empty();
  if (!r.on) return r;
  trace::start(rank);
  trace::set_metadata("device", device.str());
  if (world && world->size() > 1) {
    world->group();
    r.clock = trace::clock_from_exchanges(rank, world->job()->clock_exchanges(kClockRounds));
  }
  r.t0_us = trace::now_us();
  return r;
}

// Ends the recording; rank 0 gets the Chrome Trace file's text and event count, gathered from
// every rank; other ranks get nothing.
std::optional<std::pair<std::string, std::size_t>> finish_recording(const Recording& r, const Experiment& exp,
                                                                    const Config& cfg, World* world, int rank,
                                                                    int world_size, const torch::Device& device,
                                                                    const std::string& launcher) {
  if (!r.on) return std::nullopt;
  trace::complete(trace::Track::Compute, "mpt " + exp.name, r.t0_us, trace::now_us(), {{"rank", rank}});
  trace::stop();
  const json mine = trace_part(world, device, r.clock);
  std::vector<json> parts;
  std::vector<std::string> events;  // rank 0: every other rank's events (events_json text)
  if (world && world->size() > 1) {
    for (const auto& s : world->job()->gather_on_rank0("trace", mine.dump())) parts.push_back(json::parse(s));
    std::string own;
    if (rank != 0) trace::write_events_json(own);
    events = world->job()->gather_on_rank0("trace_events", own);
  } else {
    parts.push_back(mine);
  }
  if (rank != 0) return std::nullopt;
  return trace_document(exp, cfg, parts, events, world_size, launcher);
}

// Where the ranks ran: each rank's host, node and local rank, gathered on rank 0 through the
// job's store (one small value per rank) and recorded as env.launch, so a result says whether its
// N ranks shared a machine (mpt --nproc) or spanned nodes (torchrun, SLURM).
void record_launch(World& world, const std::optional<dist::LaunchInfo>& launch, int rank, int world_size, json& env) {
  const dist::LaunchInfo li = launch.value_or(dist::LaunchInfo{});
  const json mine = {{"rank", rank}, {"host", env.at("host")}, {"node_rank", li.node_rank},
                     {"local_rank", li.local_rank}, {"local_world_size", li.local_world_size}};
  std::vector<json> ranks;
  if (world.size() > 1) {
    for (const auto& s : world.job()->gather_on_rank0("launch", mine.dump())) ranks.push_back(json::parse(s));
  } else {
    ranks.push_back(mine);
  }
  if (rank != 0) return;
  std::set<int> nodes;
  for (const auto& r : ranks) nodes.insert(r.at("node_rank").get<int>());
  env["launch"] = {{"launcher", li.launcher}, {"world_size", world_size}, {"nodes", nodes.size()},
                   {"master_addr", li.master_addr}, {"ranks", ranks}};
}

// Rank 0's end of a run: the tables on stdout (a closed or full stdout: the result is still
// written), the result file and its trace written together (core/io/results' write_files_atomic:
// a trace that cannot be written leaves the result file as it was, and the other way round),
// divergence and failed checks said on stderr (the tables' notes are not printed under --quiet).
int report_and_write(const Experiment& exp, const Config& cfg, const RunOptions& opts, const std::string& prog,
                     const std::string& out, const Report& report, const json& env, double wall,
                     std::optional<std::pair<std::string, std::size_t>> trace_doc) {
  if (!opts.quiet) print_report(report);
  auto doc = result_document(exp, cfg, report, env, wall);
  std::vector<std::pair<std::string, std::string>> files{{out, doc.dump(2) + "\n"}};
  if (trace_doc) {
    trace_doc->first += '\n';
    files.emplace_back(opts.trace, std::move(trace_doc->first));
  }
  try {
    write_files_atomic(files);
  } catch (const std::exception& e) {
    spdlog::error("{}: cannot write the {}: {}", prog, trace_doc ? "result and trace files" : "result file", e.what());
    return kExitRuntime;
  }
  spdlog::info("wrote {} ({:.2f} s)", out, wall);
  if (trace_doc)
    spdlog::info("wrote the timeline {} ({} events; open it in ui.perfetto.dev)", opts.trace, trace_doc->second);
  if (report.results.contains("diverged")) {
    std::vector<std::string> runs;
    for (const auto& d : report.results["diverged"])
      runs.push_back(d["step"].is_null() ? fmt::format("{} (after training)", d["name"].get<std::string>())
                                         : fmt::format("{} (step {})", d["name"].get<std::string>(),
                                                       d["step"].get<std::int64_t>()));
    spdlog::warn("{}: diverged (a loss became nan or inf): {}; see results.diverged and the tables' notes", prog,
                 fmt::join(runs, ", "));
  }
  if (!report.all_checks_ok()) {
    for (const auto& c : report.checks)
      if (!c.ok) spdlog::error("{}: check failed: {} = {:g} > {:g}", prog, c.name, c.value, c.tolerance);
    return kExitCheckFailed;
  }
  return kExitOk;
}

// run_experiment's body, in the order a run takes: every check that needs no work (the config,
// the launcher, validate, the fault plan, memory, the outputs), then spawn the workers or become
// a rank, then the device, threads and seed, the World, the run, and rank 0's report and files.
// `made_dirs` receives the --out folders it created.
int run_experiment_in(const Experiment& exp, const RunOptions& opts, std::vector<std::string>& made_dirs) {
  // Each rank of a multi-process run says which it is: a failure every rank meets (a corrupt data
  // file) is printed once per rank, and the lines must not read as one process repeating itself.
  std::string prog = "mpt " + exp.name;
  try {
    const ConfigSpec spec = full_spec(exp);
    refuse_nproc_for_single(exp, opts);
    const Config cfg = resolve_for(spec, opts);
    if (opts.out_given && !opts.print_config && opts.out.empty())
      throw ConfigError("--out: expected a file path, got an empty string");
    const std::string out = opts.out.empty() ? "results/" + exp.name + ".json" : opts.out;
    // Multi-process experiments: under a launcher (mpt --nproc, torchrun, SLURM) this process
    // is one rank; otherwise it spawns /nproc workers of itself and waits.
    const bool multi = exp.processes == Processes::Multi;
    if (!exp.validate) throw std::logic_error("experiment " + exp.name + " has no validate (core/experiment.hpp)");
    if (multi && (!spec.find("/nproc") || !exp.plan))
      throw std::logic_error("multi-process experiment " + exp.name + " needs /nproc in its schema and a plan");
    const std::optional<dist::LaunchInfo> launch = multi ? launcher_of(spec, cfg, opts) : std::nullopt;
    const int planned = launch ? launch->world_size : multi ? static_cast<int>(cfg.integer("/nproc")) : 1;
    // A bad MPT_SIMD (core/numerics/rounding_simd) is refused here, once, like a config error:
    // before any worker exists and under --print-config too.
    (void)simd::active_level();
    validate_naming_sources(exp, spec, cfg, opts, launch, multi, planned);
    const ProcessPlan plan = multi ? exp.plan(cfg) : ProcessPlan{};
    // A failed rank is found by its peers; alone, a rank that exits or hangs on purpose tests nothing.
    if (plan.fault.rank >= 0 && planned < 2)
      throw ConfigError(fmt::format("/fault/rank: expected -1 with one process (a fault is detected by the other "
                                    "ranks: run with --nproc 2 or more), got {}",
                                    plan.fault.rank));
    check_memory_fits(exp, cfg, launch, plan, planned);
    // --print-config prints a config only once it passed every check a run makes before its work
    // (all without side effects), so a printed config is one that runs; the output files are not
    // the config's and are not checked.
    if (opts.print_config) {
      emit(cfg.json_value().dump(2) + "\n");  // a lost write is exit 3 (finish_stdout)
      return kExitOk;
    }
    check_outputs(opts, out, launch, made_dirs);
    if (multi && !launch && cfg.integer("/nproc") > 1 && plan.one_process_because.empty())
      return spawn_workers(cfg, plan, opts);
    if (multi && !launch && cfg.integer("/nproc") > 1)
      spdlog::info("{}: {}, so nothing runs across processes: running in this one process, not spawning the {} "
                   "of /nproc", exp.name, plan.one_process_because, cfg.integer("/nproc"));
    const int rank = launch ? launch->rank : 0, world_size = launch ? launch->world_size : 1;
    if (launch) {
      if (world_size > 1) prog += fmt::format(" (rank {} of {})", rank, world_size);
      if (rank != 0 && !opts.verbose) spdlog::set_level(spdlog::level::warn);
      spdlog::debug("rank {} of {} (launcher: {})", rank, world_size, launch->launcher);
    }
    const torch::Device device = choose_device(cfg.str("/device"));
    json env = set_up_process(cfg, device);
    // The groups end with the run, before the report is printed, as they did inside the experiment.
    std::optional<World> world;
    if (multi) make_world(world, exp, cfg, plan, launch, device, env);
    World* w = world ? &*world : nullptr;
    // Progress lines only where a person watches: stderr a terminal, not -q, rank 0.
    const bool tty = isatty(2) != 0 && !opts.quiet && rank == 0;
    Context ctx{cfg, device, tty, rank, world_size, w};
    const Recording recording = start_recording(opts, rank, w, device);
    const double t0 = now_seconds();
    Report report = exp.run(ctx);
    const double wall = now_seconds() - t0;
    auto trace_doc = finish_recording(recording, exp, cfg, w, rank, world_size, device,
                                      launch ? launch->launcher : std::string("none"));
    if (world && world->connected()) record_launch(*world, launch, rank, world_size, env);
    // The job's connection (store, heartbeat) outlives the groups until this rank returns: a
    // TCPStore that rank 0 hosts (SLURM, torchrun without the agent's) serves its peers' last calls.
    const std::shared_ptr<dist::Job> job = world && world->connected() ? world->job() : nullptr;
    world.reset();
    if (rank != 0) return report.all_checks_ok() ? kExitOk : kExitCheckFailed;  // rank 0 prints and writes
    return report_and_write(exp, cfg, opts, prog, out, report, env, wall, std::move(trace_doc));
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
  remove_dirs_on_signal({});  // disarmed: the folders hold the result now, or are gone
  return code;
}

}  // namespace mpt
