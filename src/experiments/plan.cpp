/*
 * mpt plan — from the miniature to the cluster: memory per device and step time of a layout
 * (dp × cp × tp × pp, expert parallelism inside dp, virtual stages, sequence parallelism, ZeRO
 * stage, schedule) for a model, a precision recipe and a machine, term by term, each term named
 * after its formula and source.
 *
 *  1. model:   parameters (Megatron-LM's count, generalised to GQA, SwiGLU, RMSNorm and a mixture
 *              of experts) and FLOPs per token (Narayanan et al. 2021, §5.1); with experts the
 *              routing per microbatch and layer (capacity, padding, the dropped fraction's bounds).
 *              Or the MLP of mpt's own experiments (model.style mlp, model.widths): each pipeline
 *              stage planned with its own layers (table mlp_stages; core/plan/plan_mlp.cpp).
 *  2. memory:  weights, gradients, master weights, optimizer states (ZeRO's 2Ψ + 2Ψ + KΨ, split
 *              per ZeRO stage), fp8 / fp4 weight copies and their scales (per matrix), activations
 *              (Korthikanti et al. 2022, Table 2)
 *              times the pairs the schedule holds (core/pipeline's schedules replayed), logits,
 *              communication buffers, the system's reserve — and whether it fits.
 *  3. time:    GEMM FLOPs at the system's peak × its one GEMM efficiency, TP collectives per
 *              layer, pipeline send/recv, the schedule's idle time (bubble_time_theory), the DP /
 *              ZeRO collectives left after overlap, the optimizer's memory traffic; tokens/s,
 *              MFU, achieved FLOP/s per device and the time to train on /train/tokens.
 *     communication: every collective of a step on that device (TP, CP, EP, PP, DP/ZeRO), calls,
 *              payload bytes (as mpt's process-group counters count them) and time.
 *  4. search:  (--search N) every layout of the model on N devices, ranked by step time among
 *              those that fit, with the reason each rejected one fails.
 *  5. published (--set published=true): the model against published runs (the ZeRO paper's
 *              Figure 1, Megatron-LM's Table 1, BLOOM-176B, Llama 3 405B's Table 4), each row
 *              with its error.
 *
 * Stages may be uneven (Megatron-core's num_layers_in_first/last_pipeline_stage and
 * account_for_embedding/loss_in_pipeline_split: layout.first_stage_layers, last_stage_layers,
 * account_for_embedding, account_for_loss): memory is the stage that needs most, the step time the
 * slowest stage's.
 *
 * Pure arithmetic: no tensors, no processes. The formulas live in core/plan; docs/plan.md has each.
 *
 *   mpt plan
 *   mpt plan --search 1024
 *   mpt plan --set model.preset=gpt3-175b --set system=a100-80gb-dgx --set layout.tp=8 --set layout.pp=8
 */
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <unistd.h>

#include "core/errors.hpp"
#include "core/experiment.hpp"
#include "core/io/config.hpp"
#include "core/pipeline/schedule.hpp"
#include "core/plan/plan.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/timing.hpp"
#include "experiments/plan_parts.hpp"

namespace mpt {

namespace {

namespace pl = mpt::plan;
using pl::kGiB;

std::vector<std::string> preset_names() {
  std::vector<std::string> n{"custom"};
  for (const auto& m : pl::presets()) n.push_back(m.name);
  return n;
}

ConfigSpec plan_spec() {
  ConfigSpec s;
  s.choice("/model/preset", "llama3-70b", preset_names(),
           "a named shape, or custom (then layers, hidden, heads, vocab, sequence and style are required)");
  const char* keep = "; 0: the preset's";
  s.integer("/model/layers", 0, std::string("transformer blocks") + keep, 0, 1 << 20);
  s.integer("/model/hidden", 0, std::string("model width") + keep, 0, 1 << 24);
  s.integer("/model/heads", 0, std::string("attention heads") + keep, 0, 1 << 20);
  s.integer("/model/kv_heads", 0, std::string("key/value heads (grouped-query attention)") + keep + " (custom: = heads)", 0,
            1 << 20);
  s.integer("/model/ffn", 0, std::string("MLP hidden width") + keep + " (custom gpt: 4 x hidden)", 0, 1 << 26);
  s.integer("/model/vocab", 0, std::string("vocabulary") + keep, 0, 1 << 26);
  s.integer("/model/sequence", 0, std::string("tokens per sample") + keep, 0, 1 << 24);
  s.choice("/model/style", "preset", {"preset", "gpt", "llama", "mlp"},
           "gpt: LayerNorm, GELU, biases, learned positions, dropout; llama: RMSNorm, SwiGLU, no biases, RoPE, no "
           "dropout; mlp (with /model/preset = custom): the Linear + ReLU network of /model/widths, no dropout; "
           "preset: the preset's");
  s.choice("/model/tied", "preset", {"preset", "tied", "untied"}, "whether the output head shares the token embedding");
  s.integer("/model/experts", 0, std::string("experts per block's MLP (a mixture of experts, each of the MLP's shape, and "
            "a router); 1: dense") + keep + " (custom: dense)", 0, 1 << 20);
  s.integer("/model/top_k", 0, std::string("experts each token is routed to, 1 .. experts") + keep, 0, 1 << 20);
  s.integers("/model/widths", {0}, "/model/style = mlp: the layer widths w_0 (input) .. w_L (output) of the MLP "
             "(Linear layers with biases, a ReLU after all but the last: core/models/mlp); [0]: none (a transformer)",
             0, 1 << 24);
  s.choice("/model/dropout", "preset", {"preset", "on", "off"},
           "dropout after each ReLU (mlp) or in each block (gpt), its masks stored; preset: the preset's or the style's");
  s.integer("/train/global_batch", 512, "samples per optimizer step", 1, 1LL << 40);
  s.integer("/train/microbatch", 1, "samples per forward/backward on one replica", 1, 1 << 20);
  s.choice("/train/recipe", "bf16", {"fp32", "bf16", "fp16", "fp8-tensorwise", "fp8-rowwise", "fp8-blockwise", "mxfp8",
                                     "nvfp4", "mxfp4"},
           "precision: fp32; bf16/fp16 with fp32 master weights; fp8 (fp4) GEMMs with bf16 weights and fp32 master and "
           "the quantized weight copies with their scales (fp4: the system's peak_tflops.fp4)");
  s.choice("/train/optimizer", "adam", {"adam", "sgd-momentum", "sgd"}, "optimizer (its states per parameter)");
  s.choice("/train/recompute", "selective", {"none", "selective", "full"},
           "activation recompute (Korthikanti et al. 2022): none, selective (attention scores), full (every layer)");
  s.boolean("/train/flash_attention", true,
            "attention as one fused kernel (FlashAttention): no s x s scores stored or streamed through memory");
  s.boolean("/train/fp32_grads", false, "gradients kept in fp32 (Megatron-LM's main_grad) rather than in the weights' format");
  s.number("/train/tokens", 15e12, "tokens to train on (the time-to-train line)", 0, 1e18);
  Param cf;
  cf.type = ParamType::Number;
  cf.default_value = 1.25;
  cf.doc = "mixture of experts, drop-and-pad: each expert computes ceil(n k cf / E) rows (at most n) of the n tokens "
           "a rank routes per microbatch and layer; the rest are dropped";
  cf.exclusive_min = 0.0;
  cf.max = 1e6;
  s.add("/train/capacity_factor", cf);
  s.integer("/layout/dp", 4, "data-parallel replicas", 1, 1 << 24);
  s.integer("/layout/tp", 8, "tensor-parallel ranks", 1, 1 << 16);
  s.integer("/layout/pp", 2, "pipeline stages", 1, 1 << 16);
  s.integer("/layout/cp", 1, "context-parallel ranks: each sequence split over them (mpt contextparallel); the "
            "gradients reduced and ZeRO sharded over dp x cp", 1, 1 << 16);
  s.choice("/layout/cp_attention", "ring", {"ring", "all_gather", "ulysses"},
           "how context parallelism's attention reaches the other ranks' keys (core/parallel/cp): ring, all_gather or "
           "ulysses");
  s.integer("/layout/ep", 1, "expert-parallel ranks (mpt expertparallel), carved out of dp: must divide /layout/dp and "
            "/model/experts; the experts' gradients reduced and ZeRO-sharded over dp x cp / ep", 1, 1 << 16);
  s.integer("/layout/virtual_stages", 1, "model chunks per stage (interleaved-1f1b: >= 2; zb-v: 2)", 1, 1 << 10);
  s.integer("/layout/first_stage_layers", 0, "uneven stages: transformer layers of the first pipeline stage (Megatron-core's "
            "num_layers_in_first_pipeline_stage); 0: an even share; the middle stages share the rest evenly", 0, 1 << 20);
  s.integer("/layout/last_stage_layers", 0, "uneven stages: transformer layers of the last pipeline stage (Megatron-core's "
            "num_layers_in_last_pipeline_stage); 0: an even share", 0, 1 << 20);
  s.boolean("/layout/account_for_embedding", false,
            "uneven stages: the embedding counts as one layer of the first stage when the layers are split (Megatron-core's "
            "account_for_embedding_in_pipeline_split)");
  s.boolean("/layout/account_for_loss", false,
            "uneven stages: the output head and loss count as one layer of the last stage when the layers are split "
            "(Megatron-core's account_for_loss_in_pipeline_split)");
  s.boolean("/layout/sequence_parallel", true, "sequence parallelism with TP (Korthikanti et al. 2022)");
  s.integer("/layout/zero", 1, "ZeRO stage over the data-parallel group (0-3)", 0, 3);
  s.choice("/layout/schedule", "1f1b", schedule_names(), "pipeline schedule (core/pipeline)");
  s.boolean("/layout/overlap_dp", true, "the gradient reduction overlaps the last microbatch's backward");
  s.boolean("/layout/overlap_tp", false,
            "TP collectives overlapped with their GEMMs (Transformer Engine's userbuffers, NeMo's tp_comm_overlap): only "
            "what exceeds a microbatch's compute is exposed");
  s.boolean("/layout/pp_scatter_gather", false,
            "pipeline messages split over the TP ranks and all-gathered on receipt (Megatron-LM 2021, Narayanan et al. "
            "§4.1); false: every TP rank sends the whole activation (Megatron-core; 1/t of it with SP)");
  s.string("/system", "h100-sxm-dgx",
           "a shipped system (configs/systems/<name>.json: a100-80gb-dgx, h100-sxm-dgx, h200-sxm-dgx, ci-epyc-2cpu), a path to one, or a `mpt plan --calibrate` result file");
  s.integer("/search/devices", 0, "search every layout on this many devices (--search N); 0: no search", 0, 1 << 24);
  s.integer("/search/top", 10, "layouts shown by the search", 1, 1000);
  s.boolean("/calibrate/enabled", false,
            "measure this machine instead of planning (--calibrate): GEMM rates, memory bandwidth and, from a "
            "`mpt collectives` result, the collectives' busbw and latency; the system goes to timings.system, and "
            "--set system=<this result file> plans with it");
  s.string("/calibrate/collectives", "results/collectives.json", "the `mpt collectives` result file --calibrate reads");
  s.integer("/calibrate/gemm_n", 1024, "N of the N x N x N products --calibrate times", 64, 8192);
  s.boolean("/published", false, "also compare the model with published runs (ZeRO Figure 1, Megatron-LM Table 1, "
            "BLOOM-176B, Llama 3 405B Table 4)");
  return s;
}

// The model the config names: a preset with the keys that are set (non-zero) overriding it.
pl::ModelShape model_from(const Config& cfg) {
  const std::string name = cfg.str("/model/preset");
  const bool custom = name == "custom";
  pl::ModelShape m = custom ? pl::ModelShape{} : pl::preset(name);
  m.name = name;
  const std::string style = cfg.str("/model/style");
  if (custom && style == "preset")
    throw ConfigError("/model/style: expected \"gpt\" or \"llama\" for /model/preset = custom (or \"mlp\" with "
                      "/model/widths), got \"preset\"");
  const auto widths = cfg.integers("/model/widths");
  if (style == "mlp") return plan_mlp::mlp_from(cfg, name, widths);
  if (widths != std::vector<long long>{0})
    throw ConfigError(fmt::format("/model/widths: expected [0] unless /model/style = mlp (a transformer's shape is "
                                  "/model/layers, /model/hidden, ...), got {} widths", widths.size()));
  if (style == "gpt" || style == "llama") {
    const bool llama = style == "llama";
    m.swiglu = m.rmsnorm = llama;
    m.bias = m.learned_positions = m.dropout = !llama;
    m.tied = false;
  }
  auto take = [&](const char* key, int64_t& field) {
    const std::string ptr = std::string("/model/") + key;
    const long long v = cfg.integer(ptr);
    if (v > 0) field = v;
    else if (custom) throw ConfigError(ptr + ": expected an integer >= 1 for /model/preset = custom, got 0");
  };
  take("layers", m.layers);
  take("hidden", m.hidden);
  take("heads", m.heads);
  take("vocab", m.vocab);
  take("sequence", m.sequence);
  if (cfg.integer("/model/kv_heads") > 0) m.kv_heads = cfg.integer("/model/kv_heads");
  else if (custom) m.kv_heads = m.heads;
  if (cfg.integer("/model/ffn") > 0) m.ffn = cfg.integer("/model/ffn");
  else if (custom && style == "gpt") m.ffn = 4 * m.hidden;
  else if (custom) throw ConfigError("/model/ffn: expected an integer >= 1 for a custom llama-style model, got 0");
  if (cfg.str("/model/tied") != "preset") m.tied = cfg.str("/model/tied") == "tied";
  if (m.kv_heads > m.heads)
    throw ConfigError(fmt::format("/model/kv_heads: expected at most /model/heads = {}, got {}", m.heads, m.kv_heads));
  if (cfg.integer("/model/experts") > 0) m.experts = cfg.integer("/model/experts");
  if (cfg.integer("/model/top_k") > 0) m.top_k = cfg.integer("/model/top_k");
  if (m.moe() && (m.top_k < 1 || m.top_k > m.experts))
    throw ConfigError(fmt::format("/model/top_k: expected 1 .. /model/experts = {} for a mixture of experts, got {}",
                                  m.experts, m.top_k));
  if (cfg.str("/model/dropout") != "preset") m.dropout = cfg.str("/model/dropout") == "on";
  return m;
}

pl::Training training_from(const Config& cfg) {
  pl::Training t;
  t.global_batch = cfg.integer("/train/global_batch");
  t.microbatch = cfg.integer("/train/microbatch");
  t.recipe = cfg.str("/train/recipe");
  t.optimizer = cfg.str("/train/optimizer");
  t.recompute = cfg.str("/train/recompute");
  t.flash_attention = cfg.boolean("/train/flash_attention");
  t.fp32_grads = cfg.boolean("/train/fp32_grads");
  t.tokens = cfg.number("/train/tokens");
  t.capacity_factor = cfg.number("/train/capacity_factor");
  return t;
}

pl::Layout layout_from(const Config& cfg) {
  pl::Layout l;
  l.dp = cfg.integer("/layout/dp");
  l.tp = cfg.integer("/layout/tp");
  l.pp = cfg.integer("/layout/pp");
  l.virtual_stages = cfg.integer("/layout/virtual_stages");
  l.cp = cfg.integer("/layout/cp");
  l.cp_attention = cfg.str("/layout/cp_attention");
  l.ep = cfg.integer("/layout/ep");
  l.sequence_parallel = cfg.boolean("/layout/sequence_parallel");
  l.zero = static_cast<int>(cfg.integer("/layout/zero"));
  l.schedule = cfg.str("/layout/schedule");
  l.overlap_dp = cfg.boolean("/layout/overlap_dp");
  l.overlap_tp = cfg.boolean("/layout/overlap_tp");
  l.pp_scatter_gather = cfg.boolean("/layout/pp_scatter_gather");
  l.first_stage_layers = cfg.integer("/layout/first_stage_layers");
  l.last_stage_layers = cfg.integer("/layout/last_stage_layers");
  l.account_for_embedding = cfg.boolean("/layout/account_for_embedding");
  l.account_for_loss = cfg.boolean("/layout/account_for_loss");
  return l;
}

// configs/systems beside the binary's checkout (build/mpt -> configs/systems), or under the
// working directory.
std::vector<std::filesystem::path> system_dirs() {
  std::vector<std::filesystem::path> dirs;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    dirs.push_back(exe.parent_path().parent_path() / "configs" / "systems");
    dirs.push_back(exe.parent_path() / "configs" / "systems");
  }
  dirs.push_back(std::filesystem::current_path(ec) / "configs" / "systems");
  return dirs;
}

/// The system `/system` names: a path (it has a '/' or ends in .json), else a shipped name.
/// Throws ConfigError naming /system, or the file and the field.
pl::System load_system(const std::string& spec) {
  std::string path = spec;
  const bool is_path = spec.find('/') != std::string::npos ||
                       (spec.size() > 5 && spec.compare(spec.size() - 5, 5, ".json") == 0);
  if (!is_path) {
    path.clear();
    std::vector<std::string> shipped;
    for (const auto& d : system_dirs()) {
      std::error_code ec;
      if (path.empty() && std::filesystem::is_regular_file(d / (spec + ".json"), ec)) path = (d / (spec + ".json")).string();
      if (shipped.empty() && std::filesystem::is_directory(d, ec))
        for (const auto& f : std::filesystem::directory_iterator(d, ec))
          if (f.path().extension() == ".json") shipped.push_back(f.path().stem().string());
    }
    if (path.empty()) {
      std::sort(shipped.begin(), shipped.end());
      throw ConfigError(fmt::format("/system: no shipped system named \"{}\" (expected one of: {}; or a path to a "
                                    "system file)", spec, shipped.empty() ? std::string("none found") : fmt::format("{}", fmt::join(shipped, ", "))));
    }
  }
  auto j = read_json_file(path, "system file", kResultLimits);
  // a `mpt plan --calibrate` result file holds its system under timings.system
  if (j.is_object() && j.value("experiment", "") == "plan") {
    if (!j.contains("timings") || !j["timings"].is_object() || !j["timings"].contains("system"))
      throw ConfigError(fmt::format("/system: {} is a plan result without timings.system (run `mpt plan --calibrate` to "
                                    "make one)", path));
    return pl::parse_system(j["timings"]["system"], "system file " + path + " (timings.system)");
  }
  return pl::parse_system(j, "system file " + path);
}

using plan_calibrate::calibration_link;

/// Byte counts print as integers: a plan beyond 2^53 bytes (8 PiB) per device is a typo. Throws
/// ConfigError naming the model's size keys when `bytes` (`what`: "this layout needs") is not below.
void check_plannable_bytes(double bytes, const pl::ModelShape& m, const std::string& what) {
  if (!(bytes < 9007199254740992.0))
    throw ConfigError(fmt::format("/model: {} {:.3g} bytes per device, more than the 2^53 (8 PiB) mpt plans for (check "
                                  "{} and /train/microbatch)", what, bytes,
                                  m.mlp() ? "/model/widths" : "/model/sequence, /model/hidden"));
}

void validate_plan(const Config& cfg, int) {
  if (cfg.boolean("/calibrate/enabled")) {  // measures: the model and the layout are not used
    (void)calibration_link(cfg);
    return;
  }
  const auto m = model_from(cfg);
  const auto t = training_from(cfg);
  const auto sys = load_system(cfg.str("/system"));
  if (sys.peak_for(t.recipe) <= 0)
    throw ConfigError(fmt::format("/train/recipe = {}: the system \"{}\" ({}) has no {} peak (its peak_tflops lists 0{})",
                                  t.recipe, cfg.str("/system"), sys.name, t.recipe,
                                  t.recipe == "nvfp4" || t.recipe == "mxfp4" ? " or no fp4" : ""));
  if (cfg.integer("/search/devices") == 0) {
    const auto l = layout_from(cfg);
    const std::string why = pl::layout_error(m, t, l);
    if (!why.empty()) throw ConfigError(why);
    check_plannable_bytes(pl::estimate(m, t, l, sys).memory_bytes, m, "this layout needs");
  }
}

std::string gib(double bytes) { return fmt::format("{:.2f}", bytes / kGiB); }

std::string human_time(double s) {
  if (s < 120) return fmt::format("{:.3g} s", s);
  if (s < 7200) return fmt::format("{:.3g} min", s / 60);
  if (s < 2 * 86400) return fmt::format("{:.3g} h", s / 3600);
  return fmt::format("{:.3g} days", s / 86400);
}

// ----------------------------------------------------------------------------
// 1. The model
// ----------------------------------------------------------------------------
Table model_table(const pl::ModelShape& m, const pl::Training& t) {
  if (m.mlp()) return plan_mlp::mlp_model_table(m, t);
  Table tb{"model", fmt::format("Model: {} ({} layers, hidden {}, {} heads / {} K/V, ffn {}, vocab {}, sequence {}{})", m.name,
                                m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.sequence,
                                m.moe() ? fmt::format(", {} experts, top-{}", m.experts, m.top_k) : ""),
           {text_col("name", "term"), sci_col("value", "value", "-", 5), text_col("formula", "formula")}};
  const auto pc = pl::count_params(m);
  tb.rows.push_back({{"name", "parameters"}, {"value", pc.total}, {"formula", "L x per layer + embedding + positions + head + norm"}});
  if (!m.moe()) {
    tb.rows.push_back({{"name", "per layer"}, {"value", pc.per_layer},
                       {"formula", m.swiglu ? "2h^2 + 2h·kv + 3hf + norms" : "2h^2 + 2h·kv + 2hf + biases + norms (12h^2 + 13h at f = 4h)"}});
  } else {
    tb.rows.push_back({{"name", "per layer"}, {"value", pc.per_layer},
                       {"formula", fmt::format("2h^2 + 2h·kv{} + E experts + router + norms", m.bias ? " + biases" : "")}});
    tb.rows.push_back({{"name", "one expert"}, {"value", pc.expert},
                       {"formula", m.swiglu ? "3hf (SwiGLU: gate, up, down)" : "2hf + f + h (GELU MLP with biases)"}});
    tb.rows.push_back({{"name", "router per layer"}, {"value", pc.router}, {"formula", "E·h, no bias"}});
    tb.rows.push_back({{"name", "active parameters"}, {"value", pc.active},
                       {"formula", "the total with k experts per layer instead of E"}});
  }
  tb.rows.push_back({{"name", "embedding"}, {"value", pc.embedding}, {"formula", "V·h"}});
  tb.rows.push_back({{"name", "head"}, {"value", pc.head}, {"formula", m.tied ? "tied to the embedding: 0" : "V·h"}});
  tb.rows.push_back({{"name", "positions"}, {"value", pc.positions}, {"formula", m.learned_positions ? "s·h (learned)" : "RoPE: 0"}});
  const double h = static_cast<double>(m.hidden), s = static_cast<double>(m.sequence);
  const double per_token = 6 * (static_cast<double>(m.layers) * (pc.matmul_per_layer + 2 * s * h) + static_cast<double>(m.vocab) * h);
  tb.rows.push_back({{"name", "model FLOPs per token"}, {"value", per_token},
                     {"formula", m.moe() ? "3 passes x (2 x active matrix weights (attention, router, k experts) + 4sh per "
                                           "layer + 2Vh) (Narayanan et al. 2021, §5.1; the experts' padding not counted)"
                                         : "3 passes x (2 x matrix weights + 4sh per layer + 2Vh) (Narayanan et al. 2021, §5.1)"}});
  tb.notes.push_back(fmt::format("training: global batch {} x {} tokens, microbatch {}, {}, {}, recompute {}{}", t.global_batch,
                                 m.sequence, t.microbatch, t.recipe, t.optimizer, t.recompute,
                                 m.moe() ? fmt::format(", capacity factor {:g}", t.capacity_factor) : ""));
  return tb;
}

/// The routing of a mixture of experts per microbatch, layer and rank (Estimate::moe): the tokens
/// routed, each expert's capacity, the E·cap rows computed, and what the capacity implies for the
/// padding and the dropped fraction whatever the router does (docs/plan.md, "Mixture of experts").
Table moe_table(const pl::Estimate& e, const pl::Layout& l) {
  Table tb{"moe", fmt::format("Mixture of experts, drop-and-pad, per microbatch and layer on one rank (ep {})", l.ep),
           {text_col("name", "term"), float_col("value", "value", "", 4), text_col("formula", "formula")}};
  for (const auto& term : e.moe) tb.rows.push_back({{"name", term.name}, {"value", term.value}, {"formula", term.formula}});
  tb.notes.push_back("the experts compute E·cap rows per rank whatever the routing; an imbalanced router drops more "
                     "choices (up to the last bound) and pads more rows, at the same compute and all-to-all bytes");
  return tb;
}

// ----------------------------------------------------------------------------
// 2. Memory and 3. time of the configured layout
// ----------------------------------------------------------------------------
Table memory_table(const pl::Estimate& e, const pl::Layout& l, const pl::System& sys) {
  Table tb{"memory",
           fmt::format("Memory per device ({} stage{}): dp {}{}{} x tp {} x pp {}{}, ZeRO-{}, on {}", e.stage,
                       l.pp > 1 ? " of the pipeline" : "", l.dp, l.ep > 1 ? fmt::format(" (ep {})", l.ep) : "",
                       l.cp > 1 ? fmt::format(" x cp {} ({})", l.cp, l.cp_attention) : "", l.tp, l.pp,
                       l.sequence_parallel && l.tp > 1 ? " (SP)" : "", l.zero, sys.name),
           {text_col("name", "term"), int_col("bytes", "bytes", "B"), text_col("gib", "GiB"), text_col("formula", "formula")}};
  for (const auto& term : e.memory)
    tb.rows.push_back({{"name", term.name}, {"bytes", std::llround(term.value)}, {"gib", gib(term.value)}, {"formula", term.formula}});
  tb.rows.push_back({{"name", "total"}, {"bytes", std::llround(e.memory_bytes)}, {"gib", gib(e.memory_bytes)},
                     {"formula", fmt::format("{} the {:.4g} GiB of a device", e.fits ? "fits" : "DOES NOT FIT", sys.memory_bytes / kGiB)}});
  return tb;
}

Table time_table(const pl::Estimate& e, const pl::Layout& l, const pl::Training& t, const pl::System& sys) {
  Table tb{"time", fmt::format("Step time ({} devices, {} microbatches per replica)", l.devices(), e.microbatches),
           {text_col("name", "term"), float_col("seconds", "time", "s"), pct_col("share", "share", 1), text_col("formula", "formula")}};
  for (const auto& term : e.time)
    tb.rows.push_back({{"name", term.name}, {"seconds", term.value}, {"share", term.value / e.step_s}, {"formula", term.formula}});
  tb.rows.push_back({{"name", "step"}, {"seconds", e.step_s}, {"share", 1.0}, {"formula", "the sum"}});
  tb.notes.push_back(fmt::format("{:.4g} tokens/s; MFU {:.1f}% (model FLOPs / (step x devices x {:.4g} TFLOP/s)); {:.4g} TFLOP/s "
                                 "per device counting the recompute (Megatron-LM's 'achieved')",
                                 e.tokens_per_s, e.mfu * 100, sys.peak_for(t.recipe) / 1e12, e.flops_per_device / 1e12));
  if (t.tokens > 0)
    tb.notes.push_back(fmt::format("{:.3g} tokens take {} on {} devices", t.tokens, human_time(e.time_to_train_s), l.devices()));
  return tb;
}

/// Every collective of a step on the modelled device, with its payload and time (docs/plan.md,
/// "Communication"); bytes are what mpt's dist::Group counters count, so own runs compare to them.
Table communication_table(const pl::Estimate& e) {
  Table tb{"communication",
           fmt::format("Communication per step on one device of the {} (payload: the all-reduce's buffer, the "
                       "all-gather's output, the reduce-scatter's input, the all-to-all's input, the message sent)",
                       e.comm_device),
           {text_col("name", "group / collective"), float_col("calls", "calls"), int_col("bytes", "payload", "B"),
            float_col("seconds", "time", "s"), text_col("formula", "calls from")}};
  for (const auto& c : e.comm)
    tb.rows.push_back({{"name", c.group + "/" + c.collective}, {"calls", c.calls}, {"bytes", std::llround(c.bytes)},
                       {"seconds", c.seconds}, {"formula", c.formula}});
  if (e.comm.empty()) tb.notes.push_back("none: dp = tp = pp = 1");
  tb.notes.push_back("time = calls x latency + payload x the ring's share (2(n-1)/n all-reduce, (n-1)/n all-gather, "
                     "reduce-scatter and all-to-all, 1 send) / busbw, before overlap; the time table says what is hidden");
  return tb;
}

// ----------------------------------------------------------------------------
// 4. Search
// ----------------------------------------------------------------------------
/// The search's rows: the fitting layouts fastest first (or the closest misses), with the count of
/// the rest by reason; an ep column where the model has experts (`moe`).
Table search_table(const std::vector<pl::Candidate>& cs, int64_t devices, int64_t top, const pl::System& sys, bool moe) {
  std::vector<Column> cols{text_col("name", "rank"), int_col("dp", "dp")};
  if (moe) cols.push_back(int_col("ep", "ep"));
  for (auto c : {int_col("tp", "tp"), int_col("pp", "pp"), int_col("microbatch", "mb"), int_col("zero", "zero")})
    cols.push_back(c);
  for (auto c : {text_col("recompute", "recompute"), float_col("memory_gib", "memory", "GiB"), float_col("step_s", "step", "s"),
                 sci_col("tokens_per_s", "tokens/s", "-", 4), pct_col("mfu", "MFU", 1), text_col("verdict", "verdict")})
    cols.push_back(c);
  Table tb{"search", fmt::format("Search: every layout on {} devices, fastest first among those that fit", devices), cols};
  int64_t fit = 0, no_fit = 0, bad = 0;
  std::map<std::string, int64_t> reasons;
  for (const auto& c : cs) {
    if (c.rejected.empty()) ++fit;
    else if (c.est.memory_bytes > 0) ++no_fit;
    else {
      ++bad;
      {
        std::string key = c.rejected.substr(0, c.rejected.find(' '));
        if (!key.empty() && key.back() == ':') key.pop_back();  // "/model/widths: ..." names the key as the others do
        reasons[key]++;
      }
    }
  }
  auto row = [&](const pl::Candidate& c, const std::string& name) {
    json r{{"name", name},
           {"dp", c.layout.dp},
           {"tp", c.layout.tp},
           {"pp", c.layout.pp},
           {"microbatch", c.training.microbatch},
           {"zero", c.layout.zero},
           {"recompute", c.training.recompute},
           {"memory_gib", c.est.memory_bytes / kGiB},
           {"step_s", c.est.step_s},
           {"tokens_per_s", c.est.tokens_per_s},
           {"mfu", c.est.mfu},
           {"verdict", c.rejected.empty() ? std::string("fits") : c.rejected}};
    if (moe) r["ep"] = c.layout.ep;
    return r;
  };
  int64_t shown = 0;
  for (const auto& c : cs) {
    if (shown >= top) break;
    if (!c.rejected.empty() && fit > 0) break;
    if (c.est.memory_bytes <= 0) break;  // does not divide: counted below
    tb.rows.push_back(row(c, std::to_string(++shown)));
  }
  tb.notes.push_back(fmt::format("{} layouts tried: {} fit, {} need more than the {:.4g} GiB of a device, {} do not divide",
                                 cs.size(), fit, no_fit, sys.memory_bytes / kGiB, bad));
  for (const auto& [key, n] : reasons) tb.notes.push_back(fmt::format("  {} x: {}", n, key));
  tb.notes.push_back("a layout with pp = 1 runs no pipeline: the schedule and virtual stages apply where pp > 1");
  if (fit == 0 && no_fit > 0)
    tb.notes.push_back("NOTHING FITS: the rows are the closest layouts, with how much memory each misses by");
  if (fit == 0 && no_fit == 0) tb.notes.push_back("NOTHING FITS: no layout divides the model on these devices");
  return tb;
}

/// The search's Pareto frontier: the fitting layouts no other beats in both step time and memory,
/// by memory ascending (each faster than every one before it), with their memory per term (the
/// experts' states with the dense ones); an ep column where the model has experts (`moe`).
Table frontier_table(const std::vector<pl::Candidate>& cs, bool moe) {
  std::vector<Column> cols{text_col("name", "rank"), int_col("dp", "dp")};
  if (moe) cols.push_back(int_col("ep", "ep"));
  for (auto c : {int_col("tp", "tp"), int_col("pp", "pp"), int_col("microbatch", "mb"), int_col("zero", "zero"),
                 text_col("recompute", "recompute"), float_col("weights_gib", "weights", "GiB"),
                 float_col("gradients_gib", "grads", "GiB"), float_col("optimizer_gib", "master+opt", "GiB"),
                 float_col("activations_gib", "activations", "GiB"), float_col("other_gib", "other", "GiB"),
                 float_col("memory_gib", "memory", "GiB"), float_col("step_s", "step", "s")})
    cols.push_back(c);
  Table tb{"frontier", "Frontier: the fastest layout for each memory budget (no other is both faster and smaller)", cols};
  std::vector<const pl::Candidate*> fit;
  for (const auto& c : cs)
    if (c.rejected.empty()) fit.push_back(&c);
  std::stable_sort(fit.begin(), fit.end(), [](const pl::Candidate* a, const pl::Candidate* b) {
    return a->est.memory_bytes != b->est.memory_bytes ? a->est.memory_bytes < b->est.memory_bytes : a->est.step_s < b->est.step_s;
  });
  double best = std::numeric_limits<double>::infinity();
  int64_t rank = 0;
  for (const auto* c : fit) {
    if (c->est.step_s >= best) continue;
    best = c->est.step_s;
    std::map<std::string, double> by;
    for (const auto& term : c->est.memory) {
      // the experts' states in the same columns as the dense ones
      const bool expert = term.name.rfind("expert ", 0) == 0;
      by[expert ? term.name.substr(7) : term.name] += term.value;
    }
    const double w = by["weights"], g = by["gradients"], o = by["master weights"] + by["optimizer states"],
                 a = by["activations"];
    json r{{"name", std::to_string(++rank)}, {"dp", c->layout.dp}, {"tp", c->layout.tp}, {"pp", c->layout.pp},
           {"microbatch", c->training.microbatch}, {"zero", c->layout.zero}, {"recompute", c->training.recompute},
           {"weights_gib", w / kGiB}, {"gradients_gib", g / kGiB}, {"optimizer_gib", o / kGiB},
           {"activations_gib", a / kGiB}, {"other_gib", (c->est.memory_bytes - w - g - o - a) / kGiB},
           {"memory_gib", c->est.memory_bytes / kGiB}, {"step_s", c->est.step_s}};
    if (moe) r["ep"] = c->layout.ep;
    tb.rows.push_back(r);
  }
  tb.notes.push_back(std::string("other: logits, fp8 (fp4) weight copies and scales, communication buffers and the system's reserve; ") +
                     (moe ? "weights, grads and master+opt include the experts'; " : "") +
                     "results.search_points holds every fitting layout (scripts/plot.py draws them with this frontier)");
  return tb;
}

/// Every fitting layout as a point (memory, step time), for scripts/plot.py's frontier plot (with
/// its ep where the model has experts, `moe`).
json search_points(const std::vector<pl::Candidate>& cs, bool moe) {
  json pts = json::array();
  for (const auto& c : cs)
    if (c.rejected.empty()) {
      json pt{{"dp", c.layout.dp}, {"tp", c.layout.tp}, {"pp", c.layout.pp}, {"microbatch", c.training.microbatch},
              {"zero", c.layout.zero}, {"recompute", c.training.recompute},
              {"memory_gib", c.est.memory_bytes / kGiB}, {"step_s", c.est.step_s}};
      if (moe) pt["ep"] = c.layout.ep;
      pts.push_back(pt);
    }
  return pts;
}

Report run_plan(const Context& ctx) {
  if (ctx.cfg.boolean("/calibrate/enabled")) return plan_calibrate::calibrate(ctx);
  const auto& cfg = ctx.cfg;
  Report report;
  const auto m = model_from(cfg);
  const auto t = training_from(cfg);
  const auto l = layout_from(cfg);
  const auto sys = load_system(cfg.str("/system"));
  report.add(model_table(m, t));
  const int64_t devices = cfg.integer("/search/devices");
  if (devices == 0) {
    const auto e = pl::estimate(m, t, l, sys);
    if (!e.moe.empty()) report.add(moe_table(e, l));
    if (!e.stages.empty()) report.add(plan_mlp::mlp_stages_table(e));
    report.add(memory_table(e, l, sys));
    report.add(time_table(e, l, t, sys));
    report.add(communication_table(e));
    report.results["summary"] = {{"fits", e.fits},
                                 {"memory_bytes", e.memory_bytes},
                                 {"stage", e.stage},
                                 {"step_s", e.step_s},
                                 {"bubble_fraction", e.bubble_fraction},
                                 {"tokens_per_s", e.tokens_per_s},
                                 {"mfu", e.mfu},
                                 {"flops_per_device", e.flops_per_device},
                                 {"time_to_train_s", e.time_to_train_s}};
  } else {
    const auto start = std::chrono::steady_clock::now();
    const auto cs = pl::search(m, t, l, sys, devices);
    report.timings["search_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (std::none_of(cs.begin(), cs.end(), [](const pl::Candidate& c) { return c.rejected.empty(); })) {
      double least = std::numeric_limits<double>::infinity();  // of the layouts that divide (the others have no estimate)
      for (const auto& c : cs)
        if (c.est.memory_bytes > 0) least = std::min(least, c.est.memory_bytes);
      if (std::isfinite(least)) check_plannable_bytes(least, m, "the smallest layout of the search needs");
    }
    Table st = search_table(cs, devices, cfg.integer("/search/top"), sys, m.moe());
    if (l.cp > 1)
      st.notes.push_back(fmt::format("/layout/cp = {} is not searched: every layout here has cp = 1 (plan a CP layout "
                                     "without --search)", l.cp));
    if (l.uneven())
      st.notes.push_back("/layout/first_stage_layers, /layout/last_stage_layers, /layout/account_for_embedding and "
                         "/layout/account_for_loss are not searched: every layout here has even stages (plan an uneven "
                         "layout without --search)");
    if (m.moe()) st.notes.push_back("ep: every degree dividing dp and the experts was tried (/layout/ep is not read)");
    report.add(std::move(st));
    if (std::any_of(cs.begin(), cs.end(), [](const pl::Candidate& c) { return c.rejected.empty(); })) {
      report.add(frontier_table(cs, m.moe()));
      report.results["search_points"] = search_points(cs, m.moe());
    }
  }
  if (cfg.boolean("/published")) {
    report.add(plan_published::published_runs_table(load_system("a100-80gb-dgx"), load_system("h100-sxm-dgx"), report));
  }
  report.env["system"] = sys.name;
  return report;
}

}  // namespace

Experiment plan_experiment() {
  Experiment e;
  e.name = "plan";
  e.summary = "Memory and step time of a DP x TP x PP x ZeRO layout at any scale, term by term; --search N ranks every layout";
  e.spec = plan_spec;
  e.validate = validate_plan;
  e.run = run_plan;
  e.aliases = {{"search", "/search/devices", "Search every layout on N devices (= --set search.devices=N)"},
               {"calibrate", "/calibrate/enabled",
                "Measure this machine into a system (= --set calibrate.enabled=true; needs a `mpt collectives` result)", true}};
  return e;
}

}  // namespace mpt
