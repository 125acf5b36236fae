// `mpt compare` and `mpt env`: the tools around result files. See tools.hpp.
#include "app/tools.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include "app/output.hpp"
#include "core/io/config.hpp"
#include "core/errors.hpp"
#include "core/io/results.hpp"
#include "core/runtime/runtime.hpp"
#include "core/io/tolerance.hpp"

namespace mpt {

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
      // One "path  value" line per leaf, in the order of the JSON document, the values in one
      // column after the longest path.
      std::vector<std::pair<std::string, std::string>> lines;
      std::function<void(const json&, const std::string&)> walk = [&](const json& j, const std::string& path) {
        if (j.is_object() && !j.empty()) {
          for (auto it = j.begin(); it != j.end(); ++it) walk(it.value(), path.empty() ? it.key() : path + "." + it.key());
        } else if (j.is_array() && !j.empty()) {
          for (std::size_t i = 0; i < j.size(); ++i) walk(j[i], fmt::format("{}[{}]", path, i));
        } else {
          lines.emplace_back(path, j.is_string() ? j.get<std::string>() : j.dump());
        }
      };
      walk(env, "");
      std::size_t width = 0;
      for (const auto& [path, value] : lines) width = std::max(width, path.size());
      std::string out;
      for (const auto& [path, value] : lines) out += fmt::format("{:<{}}  {}\n", path, width, value);
      emit(out);
    }
    return kExitOk;
  } catch (const ConfigError& e) {  // e.g. a bad MPT_SIMD
    spdlog::error("mpt env: {}", e.what());
    return kExitUsage;
  } catch (const RuntimeFailure& e) {
    spdlog::error("mpt env: {}", e.what());
    return kExitRuntime;
  }
}
}  // namespace mpt
