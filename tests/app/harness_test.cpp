// The harness (src/app/harness.cpp) against a made-up experiment: what the contract of
// core/experiment.hpp promises — exit codes 0/1/2/3, validation before the run, the result
// document's shape, nothing written on a config error, `results` identical run to run.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/harness.hpp"
#include "app/registry.hpp"
#include "catch.hpp"
#include "core/errors.hpp"
#include "core/dist/world.hpp"

using namespace mpt;

namespace {

// A small experiment: a table of /rows rows of x = i * /scale, two tables of step times routed
// to timings; a check that passes unless /fail.
// `runs` counts calls of run(), so a test can see that validation stopped the run before it.
Experiment toy_experiment(int* runs) {
  Experiment e;
  e.name = "toy";
  e.summary = "a table of multiples (harness tests)";
  e.spec = [] {
    ConfigSpec s;
    s.integer("/rows", 3, "rows of the table", 1, 100);
    s.number("/scale", 0.5, "x = i * scale");
    s.boolean("/fail", false, "the check fails");
    s.string("/mode", "ok", "ok | runtime | config (what run() throws)");
    return s;
  };
  e.validate = [](const Config& cfg, int /*world_size*/) {
    if (cfg.integer("/rows") == 7) throw ConfigError("/rows: 7 is refused by validate (test)");
  };
  e.run = [runs](const Context& ctx) {
    ++*runs;
    if (ctx.cfg.str("/mode") == "runtime") throw RuntimeFailure("the toy's data is missing (test)");
    if (ctx.cfg.str("/mode") == "config") throw ConfigError("/mode: refused inside run (test)");
    Report r;
    Table t{"multiples", "Multiples", {text_col("name", "name"), float_col("x", "x")}};
    for (long long i = 0; i < ctx.cfg.integer("/rows"); ++i)
      t.rows.push_back({{"name", "r" + std::to_string(i)}, {"x", static_cast<double>(i) * ctx.cfg.number("/scale")}});
    r.add(std::move(t));
    Table step{"step_times", "Step times", {text_col("name", "name"), float_col("step_ms", "step", "ms")}};
    step.rows.push_back({{"name", "a"}, {"step_ms", 1.5}});
    step.rows.push_back({{"name", "b"}, {"step_ms", 2.5}});
    Table by_name = step;
    by_name.name = "per_case";
    r.add(std::move(step), Store::Timings);          // timings.step_times: the rows
    r.add(std::move(by_name), Store::TimingsByName);  // timings.per_case.<name>: the rows by name
    r.results["overflow"] = INFINITY;  // non-finite numbers are data: stored as "inf"
    r.check("toy check", ctx.cfg.boolean("/fail") ? 1.0 : 0.0, 0.5);
    r.timings["toy_s"] = 0.25;
    return r;
  };
  return e;
}

std::string scratch_dir() {
  auto d = std::filesystem::temp_directory_path() / ("mpt_harness_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d.string();
}

json read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

RunOptions quiet_run(const std::string& out, std::vector<std::string> sets = {}) {
  RunOptions o;
  o.out = out;
  o.out_given = true;
  o.quiet = true;
  o.device = "cpu";
  o.sets = std::move(sets);
  o.argv = {"mpt", "toy"};
  return o;
}

}  // namespace

TEST_CASE("full_spec adds /seed, /device and /threads to an experiment's schema", "[harness]") {
  int runs = 0;
  ConfigSpec spec = full_spec(toy_experiment(&runs));
  REQUIRE(spec.find("/seed"));
  REQUIRE(spec.find("/device"));
  REQUIRE(spec.find("/threads"));
  CHECK(spec.find("/rows"));
  CHECK_FALSE(spec.find("/nproc"));  // single-process: no --nproc key
}

TEST_CASE("resolve_for: defaults <- --set <- --seed/--device, a bad --seed names --seed", "[harness]") {
  int runs = 0;
  ConfigSpec spec = full_spec(toy_experiment(&runs));
  RunOptions o = quiet_run("unused.json", {"rows=5"});
  o.seed = "42";
  Config c = resolve_for(spec, o);
  CHECK(c.integer("/rows") == 5);
  CHECK(c.integer("/seed") == 42);
  CHECK(c.str("/device") == "cpu");
  o.seed = "x";
  try {
    resolve_for(spec, o);
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).rfind("--seed 'x'", 0) == 0);
  }
  RunOptions empty_config = quiet_run("unused.json");
  empty_config.config_given = true;
  CHECK_THROWS_AS(resolve_for(spec, empty_config), ConfigError);
}

TEST_CASE("run_experiment: exit 0 writes the result document, same config, identical results", "[harness]") {
  int runs = 0;
  const Experiment toy = toy_experiment(&runs);
  const std::string dir = scratch_dir();
  const std::string a = dir + "/a.json", b = dir + "/b.json";
  REQUIRE(run_experiment(toy, quiet_run(a)) == kExitOk);
  REQUIRE(run_experiment(toy, quiet_run(b)) == kExitOk);
  CHECK(runs == 2);
  json da = read(a), db = read(b);
  CHECK(da["schema_version"] == 1);
  CHECK(da["tool"]["name"] == "mpt");
  CHECK(da["experiment"] == "toy");
  CHECK(da["config"]["rows"] == 3);
  REQUIRE(da["results"]["multiples"].size() == 3);
  CHECK(da["results"]["multiples"][2]["x"] == 1.0);
  CHECK(da["results"]["overflow"] == "inf");
  CHECK(da["checks"][0]["name"] == "toy check");
  CHECK(da["checks"][0]["ok"] == true);
  CHECK(da["timings"]["toy_s"] == 0.25);
  // Tables of run-dependent values go to timings, never to results.
  CHECK_FALSE(da["results"].contains("step_times"));
  CHECK_FALSE(da["results"].contains("per_case"));
  REQUIRE(da["timings"]["step_times"].is_array());
  CHECK(da["timings"]["step_times"][1]["step_ms"] == 2.5);
  CHECK(da["timings"]["per_case"]["b"]["step_ms"] == 2.5);
  CHECK(da["timings"]["per_case"]["a"]["name"] == "a");
  CHECK(da["timings"].contains("wall_s"));
  CHECK(da["env"].contains("torch"));
  CHECK(da["results"] == db["results"]);
  std::filesystem::remove_all(dir);
}

TEST_CASE("run_experiment: a failed check is exit 1 with the result still written", "[harness]") {
  int runs = 0;
  const std::string dir = scratch_dir();
  const std::string out = dir + "/fail.json";
  CHECK(run_experiment(toy_experiment(&runs), quiet_run(out, {"fail=true"})) == kExitCheckFailed);
  REQUIRE(std::filesystem::exists(out));
  CHECK(read(out)["checks"][0]["ok"] == false);
  std::filesystem::remove_all(dir);
}

TEST_CASE("run_experiment: config errors are exit 2 before the run, and nothing is written", "[harness]") {
  int runs = 0;
  const Experiment toy = toy_experiment(&runs);
  const std::string dir = scratch_dir();
  const std::string out = dir + "/sub/never.json";  // sub/ must not be left behind either
  CHECK(run_experiment(toy, quiet_run(out, {"rows=0"})) == kExitUsage);   // schema: below the minimum
  CHECK(run_experiment(toy, quiet_run(out, {"rowz=3"})) == kExitUsage);   // unknown key
  CHECK(run_experiment(toy, quiet_run(out, {"rows=7"})) == kExitUsage);   // refused by validate
  CHECK(runs == 0);                                                        // run() never started
  CHECK(run_experiment(toy, quiet_run(out, {"mode=\"config\""})) == kExitUsage);  // thrown inside run
  CHECK(run_experiment(toy, quiet_run(out, {"mode=\"runtime\""})) == kExitRuntime);
  CHECK(runs == 2);
  CHECK_FALSE(std::filesystem::exists(dir + "/sub"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("print_config: the resolved config only, no run and no result file", "[harness]") {
  int runs = 0;
  const std::string dir = scratch_dir();
  RunOptions o = quiet_run(dir + "/p.json");
  o.print_config = true;
  CHECK(run_experiment(toy_experiment(&runs), o) == kExitOk);
  CHECK(runs == 0);
  CHECK_FALSE(std::filesystem::exists(dir + "/p.json"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("result_document refuses a timings table whose key a timings value already has", "[harness]") {
  int runs = 0;
  const Experiment toy = toy_experiment(&runs);
  ConfigSpec spec = full_spec(toy);
  Config cfg = resolve_config(spec, "", {});
  Report r;
  r.timings["t"] = 1.0;
  r.add(Table{"t", "T", {text_col("name", "name")}, {json{{"name", "x"}}}}, Store::Timings);
  CHECK_THROWS_AS(result_document(toy, cfg, r, json::object(), 0.0), std::logic_error);
}

TEST_CASE("the registry lists every experiment once, in mpt list's order, each with a spec that resolves to its defaults", "[harness]") {
  std::vector<std::string> names;
  for (const auto& e : experiments()) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"underflow", "lossscale", "dataparallel", "pipeline", "accumulate",
                                          "checkpoint", "collectives", "fp8", "fp4", "shard", "tensorparallel", "contextparallel", "expertparallel", "plan"});
  for (const auto& e : experiments()) {
    INFO(e.name);
    CHECK(find_experiment(e.name) == &e);
    CHECK_FALSE(e.summary.empty());
    CHECK_NOTHROW(resolve_for(full_spec(e), RunOptions{}));
  }
  CHECK(find_experiment("underflw") == nullptr);
}

namespace {

// A multi-process experiment in its smallest form: /nproc (1 here: the harness does not spawn),
// a plan read from its own keys, and a run that uses the World the harness built.
Experiment multi_toy(int* world_sizes) {
  Experiment e;
  e.name = "multitoy";
  e.summary = "an all-reduce over the World (harness tests)";
  e.spec = [] {
    ConfigSpec s;
    s.integer("/nproc", 1, "processes", 1, 8);
    s.number("/net/timeout_s", 5.0, "timeout (s)", 0.1, 60.0);
    return s;
  };
  e.validate = [](const Config&, int world_size) {
    if (world_size < 1) throw ConfigError("/nproc: expected at least 1");
  };
  e.processes = Processes::Multi;
  e.plan = [](const Config& cfg) {
    ProcessPlan p;
    p.timeout_s = cfg.number("/net/timeout_s");
    return p;
  };
  e.run = [world_sizes](const Context& ctx) {
    Report r;
    REQUIRE(ctx.world != nullptr);
    *world_sizes = ctx.world->size();
    auto t = torch::ones({3});
    ctx.world->group()->allreduce(t);  // one rank: the sum is the tensor itself
    r.check("all-reduce of ones over one rank", std::abs(t.sum().item<double>() - 3.0), 0.0);
    CHECK(ctx.world->timeout() == std::chrono::milliseconds(5000));
    return r;
  };
  return e;
}

}  // namespace

TEST_CASE("a multi-process experiment gets a World from the harness, with its own timeout key", "[harness]") {
  int size = 0;
  const std::string dir = scratch_dir();
  RunOptions o = quiet_run(dir + "/m.json");
  o.argv = {"mpt", "multitoy"};
  CHECK(run_experiment(multi_toy(&size), o) == kExitOk);
  CHECK(size == 1);
  CHECK(full_spec(multi_toy(&size)).find("/nproc"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("the contract: no validate, or multi-process without /nproc or a plan, is a programming error", "[harness]") {
  int runs = 0, size = 0;
  const std::string dir = scratch_dir();
  Experiment no_validate = toy_experiment(&runs);
  no_validate.validate = nullptr;
  CHECK(run_experiment(no_validate, quiet_run(dir + "/x.json")) == kExitRuntime);
  Experiment no_plan = multi_toy(&size);
  no_plan.plan = nullptr;
  CHECK(run_experiment(no_plan, quiet_run(dir + "/x.json")) == kExitRuntime);
  CHECK(runs == 0);
  CHECK(size == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("World: one rank without a launcher, groups on first use, the fault point on other ranks only", "[harness]") {
  World w(dist::LaunchInfo{}, torch::kCPU, std::chrono::milliseconds(5000), FaultPlan{/*rank=*/1, /*step=*/0});
  CHECK(w.rank() == 0);
  CHECK(w.size() == 1);
  CHECK(w.is_rank0());
  CHECK(w.device().is_cpu());
  const auto& g = w.group();
  REQUIRE(g);
  CHECK(g->size() == 1);
  CHECK(g->backend() == "gloo");
  CHECK(&w.group() == &g);  // created once
  auto sub = w.new_group("harness_sub/", 1, torch::kCPU);
  auto t = torch::full({2}, 2.0);
  sub->allreduce(t);
  CHECK(t[0].item<double>() == 2.0);
  w.fault_point(0);  // the fault belongs to rank 1: rank 0 goes on
}

TEST_CASE("every registered experiment validates, and the multi-process ones have a plan", "[harness]") {
  for (const auto& e : experiments()) {
    INFO(e.name);
    CHECK(e.validate);
    if (e.processes == Processes::Multi) {
      CHECK(e.plan);
      CHECK(full_spec(e).find("/nproc"));
      const ProcessPlan p = e.plan(resolve_for(full_spec(e), RunOptions{}));
      CHECK(p.timeout_s > 0);
      CHECK(p.fault.rank == -1);  // defaults inject no fault
    }
  }
  CHECK(find_experiment("dataparallel")->processes == Processes::Multi);
  CHECK(find_experiment("pipeline")->processes == Processes::Multi);
  CHECK(find_experiment("collectives")->processes == Processes::Multi);
  CHECK(find_experiment("underflow")->processes == Processes::Single);
}
