// The planner's inputs: the model presets and their parameter counts, the MoE capacity, and the
// system files (docs/plan.md has each formula with its source). The terms are plan.cpp's.
#include "core/plan/plan.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "core/errors.hpp"

namespace mpt::plan {

namespace {


ModelShape gpt_style(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t vocab, int64_t seq,
                     bool tied) {
  ModelShape m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = heads;
  m.ffn = 4 * hidden;
  m.vocab = vocab;
  m.sequence = seq;
  m.tied = tied;
  return m;
}

ModelShape llama_style(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads,
                       int64_t ffn) {
  ModelShape m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  m.vocab = 128256;
  m.sequence = 8192;
  m.swiglu = true;
  m.rmsnorm = true;
  m.bias = false;
  m.learned_positions = false;
  m.tied = false;
  m.dropout = false;
  return m;
}

std::vector<ModelShape> make_presets() {
  std::vector<ModelShape> p;
  p.push_back(gpt_style("gpt3-175b", 96, 12288, 96, 50257, 2048, true));
  p.push_back(llama_style("llama3-8b", 32, 4096, 32, 8, 14336));
  p.push_back(llama_style("llama3-70b", 80, 8192, 64, 8, 28672));
  p.push_back(llama_style("llama3-405b", 126, 16384, 128, 8, 53248));
  p.push_back(gpt_style("megatron-1t", 128, 25600, 160, 51200, 2048, false));
  p.back().tied = true;  // Megatron-LM shares the word embeddings: 1,008B parameters as in the paper
  // Jiang et al. 2024, Table 1 (context 32768); Hugging Face's MixtralConfig: untied, router without a bias
  ModelShape mixtral = llama_style("mixtral-8x7b", 32, 4096, 32, 8, 14336);
  mixtral.vocab = 32000;
  mixtral.sequence = 32768;
  mixtral.experts = 8;
  mixtral.top_k = 2;
  p.push_back(mixtral);
  ModelShape tiny = gpt_style("mpt-gpt", 2, 128, 4, 96, 64, false);
  tiny.dropout = false;  // core/models/gpt has no dropout
  p.push_back(tiny);
  // `mpt expertparallel`'s defaults: the tiny GPT (mlp_ratio 2) with 8 experts, top-2 (core/models/moe)
  ModelShape moe = gpt_style("mpt-moe", 2, 64, 4, 96, 32, false);
  moe.ffn = 2 * 64;
  moe.dropout = false;
  moe.experts = 8;
  moe.top_k = 2;
  p.push_back(moe);
  return p;
}

}  // namespace

const std::vector<ModelShape>& presets() {
  static const std::vector<ModelShape> p = make_presets();
  return p;
}

const ModelShape& preset(const std::string& name) {
  for (const auto& m : presets())
    if (m.name == name) return m;
  throw std::invalid_argument("unknown model preset '" + name + "'");
}

ParamCounts count_params(const ModelShape& m) {
  if (m.mlp()) {
    // an MLP: every Linear's w_k·w_k+1 weights and w_k+1 biases (core/models/mlp); no blocks,
    // embedding or head: total (= active) only, estimate_mlp sums its layers itself
    ParamCounts c;
    for (std::size_t k = 0; k + 1 < m.widths.size(); ++k)
      c.total += static_cast<double>(m.widths[k]) * static_cast<double>(m.widths[k + 1]) +
                 static_cast<double>(m.widths[k + 1]);
    c.active = c.total;
    return c;
  }
  const double h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn);
  const double kv = static_cast<double>(m.kv_heads) * h / static_cast<double>(m.heads);
  ParamCounts c;
  const double attn = 2 * h * h + 2 * h * kv;        // q, o: h·h; k, v: h·kv
  const double mlp = (m.swiglu ? 3 : 2) * h * f;     // gate, up, down | fc1, fc2
  const double attn_bias = m.bias ? 2 * h + 2 * kv : 0.0;
  const double mlp_bias = m.bias ? (m.swiglu ? 2 * f + h : f + h) : 0.0;
  const double norm = m.rmsnorm ? h : 2 * h;
  c.embedding = static_cast<double>(m.vocab) * h;
  c.positions = m.learned_positions ? static_cast<double>(m.sequence) * h : 0;
  c.head = m.tied ? 0 : static_cast<double>(m.vocab) * h;
  c.final_norm = norm;
  const double ends = c.embedding + c.positions + c.head + c.final_norm, L = static_cast<double>(m.layers);
  if (!m.moe()) {
    c.matmul_per_layer = attn + mlp;
    c.per_layer = c.matmul_per_layer + attn_bias + mlp_bias + 2 * norm;
    c.total = c.active = L * c.per_layer + ends;
    return c;
  }
  // every block: E experts of the dense MLP's shape (their biases too) and a router of E·h weights
  const double E = static_cast<double>(m.experts), k = static_cast<double>(m.top_k);
  c.expert = mlp + mlp_bias;
  c.expert_matmul = mlp;
  c.router = E * h;
  c.matmul_per_layer = attn + c.router + k * mlp;
  c.per_layer = attn + attn_bias + c.router + E * c.expert + 2 * norm;
  c.total = L * c.per_layer + ends;
  c.active = L * (attn + attn_bias + c.router + k * c.expert + 2 * norm) + ends;
  return c;
}

int64_t expert_capacity(int64_t tokens, int64_t top_k, double capacity_factor, int64_t experts) {
  const double c = std::ceil(static_cast<double>(tokens) * static_cast<double>(top_k) * capacity_factor /
                             static_cast<double>(experts));
  return std::max<int64_t>(1, std::min<int64_t>(tokens, static_cast<int64_t>(c)));
}

double System::peak_for(const std::string& recipe) const {
  if (recipe == "nvfp4" || recipe == "mxfp4") return peak_fp4;
  if (recipe == "fp32") return peak_fp32;
  if (recipe == "bf16") return peak_bf16;
  if (recipe == "fp16") return peak_fp16;
  return peak_fp8;
}

const std::vector<std::pair<double, double>>& System::rates_for(const std::string& recipe) const {
  static const std::vector<std::pair<double, double>> none;
  const auto it = gemm_rates.find(recipe == "fp32" || recipe == "bf16" || recipe == "fp16" ? recipe
                                  : recipe == "nvfp4" || recipe == "mxfp4"                ? "fp4"
                                                                                          : "fp8");
  return it == gemm_rates.end() ? none : it->second;
}

double System::gemm_seconds(const std::string& recipe, double m, double n, double k) const {
  const double flops = 2 * m * n * k, peak = peak_for(recipe) * gemm_efficiency;
  const auto& pts = rates_for(recipe);
  if (pts.empty()) return flops / peak;
  const double size = std::cbrt(m * n * k);
  if (size <= pts.front().first) return flops / pts.front().second;
  if (size > pts.back().first) return flops / std::max(pts.back().second, peak);
  std::size_t i = 1;
  while (pts[i].first < size) ++i;
  // log-log between the two measured sizes around it
  const double f = std::log(size / pts[i - 1].first) / std::log(pts[i].first / pts[i - 1].first);
  return flops / std::exp(std::log(pts[i - 1].second) + f * (std::log(pts[i].second) - std::log(pts[i - 1].second)));
}

System parse_system(const nlohmann::json& j, const std::string& source) {
  auto fail = [&](const std::string& ptr, const std::string& what) {
    throw ConfigError(fmt::format("{}: {}: {}", source, ptr, what));
  };
  // An object at `ptr` whose keys are all in `keys` (each one is then required by a read below).
  auto object = [&](const nlohmann::json& v, const std::string& ptr, const std::vector<std::string>& keys) {
    if (!v.is_object()) fail(ptr.empty() ? "/" : ptr, "expected an object, got " + v.dump().substr(0, 60));
    for (const auto& [key, value] : v.items())
      if (std::find(keys.begin(), keys.end(), key) == keys.end())
        fail(ptr + "/" + key, fmt::format("unknown field (expected {})", fmt::join(keys, ", ")));
  };
  // The number at `ptr` in [lo, hi] (0 also allowed where zero_ok: "none", for a peak).
  auto number = [&](const std::string& ptr, double lo, double hi, bool zero_ok = false) {
    const nlohmann::json* v = &j;
    std::string at;
    for (std::size_t i = 1; i <= ptr.size();) {
      const std::size_t next = std::min(ptr.find('/', i), ptr.size());
      const std::string key = ptr.substr(i, next - i);
      if (!v->is_object()) fail(at.empty() ? "/" : at, "expected an object, got " + v->dump().substr(0, 60));
      at += "/" + key;
      if (!v->contains(key)) fail(at, "missing");
      v = &(*v)[key];
      i = next + 1;
    }
    if (!v->is_number()) fail(ptr, "expected a number, got " + v->dump().substr(0, 60));
    const double d = v->get<double>();
    if (!(std::isfinite(d) && ((d >= lo && d <= hi) || (zero_ok && d == 0))))
      fail(ptr, fmt::format("expected {}a number in [{:g}, {:g}], got {}", zero_ok ? "0 or " : "", lo, hi, v->dump()));
    return d;
  };
  const std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all"};
  object(j, "", {"name", "_comment", "devices_per_node", "memory_gib", "reserved_gib", "peak_tflops", "gemm_efficiency",
                 "memory_bandwidth_gbps", "intra_node", "inter_node", "gemm_tflops_by_n", "op_overhead_us",
                 "pass_overhead_us"});
  System s;
  if (!j.contains("name")) fail("/name", "missing (expected a string)");
  if (!j["name"].is_string()) fail("/name", "expected a string, got " + j["name"].dump().substr(0, 60));
  s.name = j["name"].get<std::string>();
  const double dpn = number("/devices_per_node", 1, 1e6);
  if (dpn != std::floor(dpn)) fail("/devices_per_node", fmt::format("expected a whole number of devices, got {:g}", dpn));
  s.devices_per_node = static_cast<int64_t>(dpn);
  // Bounds: beyond any device there is (a PiB of memory, an exaFLOP/s, a PB/s) or below any
  // (1 kB/s), so a typo gives an error rather than inf or 0 in the tables.
  s.memory_bytes = number("/memory_gib", 1e-6, 1e6) * kGiB;
  s.reserved_bytes = number("/reserved_gib", 0, 1e6) * kGiB;
  if (j.contains("peak_tflops")) object(j["peak_tflops"], "/peak_tflops", {"fp32", "bf16", "fp16", "fp8", "fp4"});
  s.peak_fp32 = number("/peak_tflops/fp32", 1e-9, 1e6) * 1e12;
  s.peak_bf16 = number("/peak_tflops/bf16", 1e-9, 1e6, true) * 1e12;
  s.peak_fp16 = number("/peak_tflops/fp16", 1e-9, 1e6, true) * 1e12;
  s.peak_fp8 = number("/peak_tflops/fp8", 1e-9, 1e6, true) * 1e12;
  // fp4 is optional (no shipped system has it): missing, none
  if (j.contains("peak_tflops") && j["peak_tflops"].is_object() && j["peak_tflops"].contains("fp4"))
    s.peak_fp4 = number("/peak_tflops/fp4", 1e-9, 1e6, true) * 1e12;
  s.gemm_efficiency = number("/gemm_efficiency", 1e-3, 1);
  s.memory_bandwidth = number("/memory_bandwidth_gbps", 1e-6, 1e6) * 1e9;
  // the collectives of both links, then the all-to-all of both (added with expert parallelism: a
  // file without it is named there, after the older fields)
  const std::pair<const char*, Link*> links[] = {{"intra_node", &s.intra}, {"inter_node", &s.inter}};
  auto collective = [&](const char* name, const char* coll, Collective* c) {
    const std::string base = fmt::format("/{}/{}", name, coll);
    if (j.contains(name) && j[name].is_object() && j[name].contains(coll))
      object(j[name][coll], base, {"busbw_gbps", "latency_us"});
    c->busbw = number(base + "/busbw_gbps", 1e-6, 1e6) * 1e9;
    c->latency_s = number(base + "/latency_us", 0, 1e7) * 1e-6;
  };
  for (auto [name, link] : links) {
    if (j.contains(name)) object(j[name], std::string("/") + name, ops);
    collective(name, "all_reduce", &link->all_reduce);
    collective(name, "all_gather", &link->all_gather);
    collective(name, "reduce_scatter", &link->reduce_scatter);
    collective(name, "send_recv", &link->send_recv);
  }
  for (auto [name, link] : links) collective(name, "all_to_all", &link->all_to_all);
  // optional, written by --calibrate: GEMM rates by size and the operator overhead
  if (j.contains("gemm_tflops_by_n")) {
    object(j["gemm_tflops_by_n"], "/gemm_tflops_by_n", {"fp32", "bf16", "fp16", "fp8", "fp4"});
    for (const auto& [fmt_name, pts] : j["gemm_tflops_by_n"].items()) {
      const std::string at = "/gemm_tflops_by_n/" + fmt_name;
      if (!pts.is_array() || pts.empty())
        fail(at, "expected a list of [N, TFLOP/s] pairs, N ascending, got " + pts.dump().substr(0, 60));
      auto& out = s.gemm_rates[fmt_name];
      for (std::size_t i = 0; i < pts.size(); ++i) {
        const auto& pt = pts[i];
        const std::string pat = fmt::format("{}/{}", at, i);
        if (!pt.is_array() || pt.size() != 2 || !pt[0].is_number() || !pt[1].is_number())
          fail(pat, "expected a pair [N, TFLOP/s], got " + pt.dump().substr(0, 60));
        const double size = pt[0].get<double>(), tf = pt[1].get<double>();
        if (!(std::isfinite(size) && size >= 1 && size <= 1e7 && (out.empty() || size > out.back().first)))
          fail(pat, fmt::format("expected N in [1, 10^7], above the previous pair's, got {}", pt[0].dump()));
        if (!(std::isfinite(tf) && tf >= 1e-9 && tf <= 1e6))
          fail(pat, fmt::format("expected TFLOP/s in [1e-09, 10^6], got {}", pt[1].dump()));
        // a measured rate above the format's peak would put MFU above 100 %
        const double fmt_peak = fmt_name == "fp32"   ? s.peak_fp32
                                : fmt_name == "bf16" ? s.peak_bf16
                                : fmt_name == "fp16" ? s.peak_fp16
                                : fmt_name == "fp8"  ? s.peak_fp8
                                                     : s.peak_fp4;
        if (fmt_peak > 0 && tf * 1e12 > fmt_peak * (1 + 1e-9))
          fail(pat, fmt::format("expected TFLOP/s at most /peak_tflops/{} = {:g}, got {}", fmt_name, fmt_peak / 1e12,
                                pt[1].dump()));
        out.emplace_back(size, tf * 1e12);
      }
    }
  }
  if (j.contains("op_overhead_us")) s.op_overhead_s = number("/op_overhead_us", 0, 1e6) * 1e-6;
  if (j.contains("pass_overhead_us")) s.pass_overhead_s = number("/pass_overhead_us", 0, 1e6) * 1e-6;
  if (s.reserved_bytes >= s.memory_bytes)
    fail("/reserved_gib", fmt::format("expected less than /memory_gib ({:g}), got {:g}", s.memory_bytes / kGiB,
                                      s.reserved_bytes / kGiB));
  return s;
}

}  // namespace mpt::plan
