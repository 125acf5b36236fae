// The command line (CLI11): subcommands, common options, help with every config key. See cli.hpp.
#include "app/cli.hpp"

#include <csignal>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "app/harness.hpp"
#include "app/output.hpp"
#include "app/registry.hpp"
#include "app/tools.hpp"
#include "core/runtime/compat.hpp"
#include "core/io/config.hpp"
#include "core/errors.hpp"

namespace mpt {

namespace {

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

}  // namespace

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
  std::vector<std::string> alias_sets;  // OptionAlias values, as --set after the others
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
    sub->add_option("--trace", opts.trace, "Also write a timeline of the run (Chrome Trace Event JSON for "
                                           "ui.perfetto.dev or chrome://tracing; docs/timelines.md)")
        ->each([&opts](const std::string&) { opts.trace_given = true; });
    sub->add_option("--device", opts.device, "auto | cpu | cuda (auto = CUDA when available)")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    sub->add_option("--seed", opts.seed, "Seed (overrides the config's /seed)");
    sub->add_flag("--print-config", opts.print_config,
                  "Print the resolved config as JSON and exit (after the checks a run makes first: exit 2 if it fails them)");
    auto* quiet = sub->add_flag("-q,--quiet", opts.quiet, "No tables; warnings and errors only");
    sub->add_flag("-v,--verbose", opts.verbose, "Debug logging on stderr")->excludes(quiet);  // one or the other
    if (e.processes == Processes::Multi)  // multi-process experiments only
      sub->add_option("--nproc", opts.nproc, "Spawn N worker processes on this machine (= --set nproc=N)");
    else  // hidden: parsed only so that the harness can say which experiments take it
      sub->add_option("--nproc", opts.nproc)->group("");
    for (const auto& a : e.aliases) {
      if (a.flag)
        sub->add_flag_function("--" + a.name, [&alias_sets, ptr = a.pointer](std::int64_t) { alias_sets.push_back(ptr + "=true"); },
                               a.help);
      else
        sub->add_option_function<std::string>(
            "--" + a.name, [&alias_sets, ptr = a.pointer](const std::string& v) { alias_sets.push_back(ptr + "=" + v); },
            a.help);
    }
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
    // CLI11's own text ("--rtol: Could not convert ...", "A subcommand is required") in mpt's
    // error form, with the command it is about and where its options are listed.
    std::string where = "mpt";
    for (const auto* sub : app.get_subcommands()) where += " " + sub->get_name();
    std::string what = e.what();
    if (what == "A subcommand is required") what = "expected an experiment or a command (`mpt list` shows them)";
    std::cerr << fmt::format("[error] {}: usage error: {}; see `{} --help`\n", where, what, where);
    return kExitUsage;
  }
  if (compare_chosen) return run_compare(base_file, new_file, key_tols, cmp, cmp_quiet, tol_files);
  if (env_chosen) return run_env(env_device, env_json);
  opts.argv.assign(argv, argv + argc);
  opts.sets.insert(opts.sets.end(), alias_sets.begin(), alias_sets.end());
  if (chosen) return run_experiment(*chosen, opts);
  return kExitOk;
}

}  // namespace
}  // namespace mpt
