// `mpt plan`'s MLP (model.style mlp): the model read from the config and its two tables
// (docs/plan.md, "The MLP: the networks of mpt's own experiments").
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/errors.hpp"
#include "core/io/config.hpp"
#include "experiments/plan_parts.hpp"

namespace mpt::plan_mlp {

namespace pl = mpt::plan;

/// The MLP of /model/widths (/model/style = mlp, /model/preset = custom): a sample is one row, no
/// dropout unless /model/dropout = on. Throws ConfigError naming a transformer key that is set (an
/// MLP would ignore it), a preset, fewer than 2 widths or a width below 1.
pl::ModelShape mlp_from(const Config& cfg, const std::string& preset, const std::vector<long long>& widths) {
  if (preset != "custom")
    throw ConfigError(fmt::format("/model/style: mlp needs /model/preset = custom (the MLP is /model/widths), got "
                                  "/model/preset = \"{}\"", preset));
  if (widths.size() < 2)
    throw ConfigError(fmt::format("/model/widths: expected at least 2 widths for /model/style = mlp (the input and the "
                                  "output of a Linear layer), got {}", widths.size()));
  for (std::size_t k = 0; k < widths.size(); ++k)
    if (widths[k] < 1) throw ConfigError(fmt::format("/model/widths/{}: expected a width >= 1, got {}", k, widths[k]));
  for (const char* key : {"layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "sequence", "experts", "top_k"}) {
    const long long v = cfg.integer(std::string("/model/") + key);
    if (v != 0)
      throw ConfigError(fmt::format("/model/{}: expected 0 for /model/style = mlp (its shape is /model/widths), got {}",
                                    key, v));
  }
  if (cfg.str("/model/tied") != "preset")
    throw ConfigError(fmt::format("/model/tied: expected \"preset\" for /model/style = mlp (no embedding to tie), got "
                                  "\"{}\"", cfg.str("/model/tied")));
  pl::ModelShape m;
  m.name = preset;
  m.widths.assign(widths.begin(), widths.end());
  m.layers = static_cast<int64_t>(widths.size()) - 1;
  m.sequence = 1;
  m.dropout = cfg.str("/model/dropout") == "on";
  m.learned_positions = false;
  return m;
}

/// The model table of an MLP: its parameters and model FLOPs per sample.
Table mlp_model_table(const pl::ModelShape& m, const pl::Training& t) {
  // a long list of widths (up to 10,000) keeps its ends: the title stays one line
  const std::size_t n = m.widths.size();
  const std::string widths =
      n <= 12 ? fmt::format("{}", fmt::join(m.widths, "-"))
              : fmt::format("{}-...-{} ({} widths)", fmt::join(m.widths.begin(), m.widths.begin() + 4, "-"),
                            fmt::join(m.widths.end() - 2, m.widths.end(), "-"), n);
  Table tb{"model", fmt::format("Model: MLP {} ({} Linear layers, a ReLU after all but the last{})", widths,
                                m.layers, m.dropout ? ", dropout after each" : ""),
           {text_col("name", "term"), sci_col("value", "value", "-", 5), text_col("formula", "formula")}};
  double matrices = 0;
  for (std::size_t k = 0; k + 1 < m.widths.size(); ++k)
    matrices += static_cast<double>(m.widths[k]) * static_cast<double>(m.widths[k + 1]);
  tb.rows.push_back({{"name", "parameters"}, {"value", pl::count_params(m).total}, {"formula", "sum of w_k·w_k+1 + w_k+1"}});
  tb.rows.push_back({{"name", "model FLOPs per sample"}, {"value", 6 * matrices},
                     {"formula", "3 passes x 2 x sum of w_k·w_k+1 (Narayanan et al. 2021, §5.1)"}});
  tb.notes.push_back(fmt::format("training: global batch {} samples, microbatch {}, {}, {}, recompute {}{}", t.global_batch,
                                 t.microbatch, t.recipe, t.optimizer, t.recompute,
                                 t.recompute == "selective" ? " (no attention scores: as none)" : ""));
  return tb;
}

/// An MLP's pipeline stages (Estimate::stages): each stage's layers, parameters and activations;
/// the memory table shows the one that needs most.
Table mlp_stages_table(const pl::Estimate& e) {
  Table tb{"mlp_stages", "MLP stages: each stage's layers, parameters and activations (the memory table is the stage that "
                         "needs most)",
           {text_col("name", "stage"), text_col("layers", "layers"), sci_col("params", "params", "-", 4),
            int_col("per_microbatch", "act/microbatch", "B"), int_col("held", "held"), int_col("activations", "activations", "B"),
            int_col("memory", "memory", "B"), sci_col("forward_flops", "fwd FLOP/microbatch", "-", 4)}};
  for (const auto& st : e.stages)
    tb.rows.push_back({{"name", fmt::format("stage {}", st.stage)}, {"layers", st.layers}, {"params", st.params},
                       {"per_microbatch", std::llround(st.per_microbatch)}, {"held", st.held},
                       {"activations", std::llround(st.activations)}, {"memory", std::llround(st.memory)},
                       {"forward_flops", st.forward_flops}});
  tb.notes.push_back("held: (microbatch, chunk) pairs at the stage's peak, the schedule replayed (core/pipeline's "
                     "peak_in_flight); act/microbatch: the stage's largest chunk");
  return tb;
}

}  // namespace mpt::plan_mlp
