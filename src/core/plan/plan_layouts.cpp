// The planner's layouts: which divide the model (layout_error) and the search over them (search).
// The terms of one layout are plan.cpp's (docs/plan.md).
#include "core/plan/plan.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

#include "core/pipeline/schedule.hpp"

namespace mpt::plan {

namespace {

// Uneven stages (Layout::first_stage_layers / last_stage_layers, account_for_embedding /
// account_for_loss): Megatron-core's rules (TransformerConfig.__post_init__, "Uneven PP" and
// account_for_*_in_pipeline_split), plus every stage holding at least one layer. "" when they hold.
std::string uneven_error(const ModelShape& m, const Layout& l) {
  const int64_t L = m.layers, p = l.pp, v = l.virtual_stages, F = l.first_stage_layers, Z = l.last_stage_layers;
  const bool counts = F != 0 || Z != 0, account = l.account_for_embedding || l.account_for_loss;
  if (F < 0 || Z < 0)
    return fmt::format("/layout/first_stage_layers = {}, /layout/last_stage_layers = {}: expected >= 1 (or 0: an even "
                       "share)", F, Z);
  if (counts && account)
    return "/layout/first_stage_layers, /layout/last_stage_layers: cannot be set with /layout/account_for_embedding or "
           "/layout/account_for_loss (Megatron-core refuses num_layers_in_first/last_pipeline_stage with "
           "account_for_embedding/loss_in_pipeline_split)";
  const char* keys = counts ? "/layout/first_stage_layers, /layout/last_stage_layers"
                            : "/layout/account_for_embedding, /layout/account_for_loss";
  if (p < 2) return fmt::format("{}: uneven stages need /layout/pp > 1, got {}", keys, p);
  const ScheduleSpec* spec = nullptr;
  try {
    spec = &schedule_spec(l.schedule);
  } catch (const std::invalid_argument& err) {
    return std::string("/layout/schedule: ") + err.what();
  }
  if (spec->placement == Placement::V)
    return fmt::format("{} with /layout/schedule = {}: uneven stages are modelled for the looped placements "
                       "(Megatron-core's), not the V of zb-v (rank 0 holds the first and the last chunk)", keys,
                       l.schedule);
  if (counts) {
    const int64_t mid = p - (F > 0 ? 1 : 0) - (Z > 0 ? 1 : 0), rest = L - F - Z;
    for (const auto& [key, n] : {std::pair<const char*, int64_t>{"/layout/first_stage_layers", F},
                                 {"/layout/last_stage_layers", Z}})
      if (n > 0 && n % v != 0)
        return fmt::format("{} = {} is not a multiple of /layout/virtual_stages = {} (Megatron-core: each chunk of the "
                           "stage holds the same layers)", key, n, v);
    if (mid == 0 && rest != 0)
      return fmt::format("/layout/first_stage_layers + /layout/last_stage_layers = {} + {} = {}: expected /model/layers "
                         "= {} (with /layout/pp = 2 there are no middle stages to take the rest)", F, Z, F + Z, L);
    // the stages without a count of their own: the middle ones, and the first or the last left at 0
    if (rest < 0)
      return fmt::format("/layout/first_stage_layers + /layout/last_stage_layers = {} + {} = {}: more than /model/layers "
                         "= {}", F, Z, F + Z, L);
    if (mid > 0 && rest < mid)
      return fmt::format("/layout/first_stage_layers, /layout/last_stage_layers = {}, {} leave {} of /model/layers = {} "
                         "for the other {} stage(s): a stage would hold no layer (each needs >= 1)", F, Z, rest, L, mid);
    if (mid > 0 && rest % mid != 0)
      return fmt::format("/model/layers - /layout/first_stage_layers - /layout/last_stage_layers = {} - {} - {} = {} is "
                         "not a multiple of the other {} stage(s) (/layout/pp = {}): they share it evenly", L, F, Z,
                         rest, mid, p);
    if (mid > 0 && (rest / mid) % v != 0)
      return fmt::format("the middle stages' {} layers each are not a multiple of /layout/virtual_stages = {} "
                         "(/model/layers - /layout/first_stage_layers - /layout/last_stage_layers over {} stage(s))",
                         rest / mid, v, mid);
    return "";
  }
  const int64_t e = l.account_for_embedding ? 1 : 0, z = l.account_for_loss ? 1 : 0, n = L + e + z;
  if (n % p != 0)
    return fmt::format("/model/layers + the embedding and loss counted as layers (/layout/account_for_embedding, "
                       "/layout/account_for_loss) = {} + {} + {} = {} is not a multiple of /layout/pp = {}", L, e, z, n, p);
  if ((n / p) % v != 0)
    return fmt::format("{} layers per stage (/model/layers + /layout/account_for_embedding + /layout/account_for_loss "
                       "over /layout/pp) are not a multiple of /layout/virtual_stages = {}", n / p, v);
  if (n / p - std::max(e, z) < 1)
    return fmt::format("{}: {} layer(s) per stage leave the first or last stage without a transformer layer (each "
                       "needs >= 1)", keys, n / p);
  return "";
}

}  // namespace

std::vector<int64_t> stage_layers(const ModelShape& m, const Layout& l) {
  const int64_t p = l.pp, L = m.layers;
  if (p < 1) throw std::invalid_argument("stage_layers: /layout/pp must be >= 1");
  if (!l.uneven()) {
    if (L % p != 0) throw std::invalid_argument(fmt::format("stage_layers: {} layers over {} stages", L, p));
    return std::vector<int64_t>(static_cast<std::size_t>(p), L / p);
  }
  const std::string why = uneven_error(m, l);
  if (!why.empty()) throw std::invalid_argument(why);
  std::vector<int64_t> out(static_cast<std::size_t>(p));
  if (l.first_stage_layers > 0 || l.last_stage_layers > 0) {
    const int64_t F = l.first_stage_layers, Z = l.last_stage_layers;
    const int64_t mid = p - (F > 0 ? 1 : 0) - (Z > 0 ? 1 : 0), share = mid > 0 ? (L - F - Z) / mid : 0;
    for (auto& x : out) x = share;
    if (F > 0) out.front() = F;
    if (Z > 0) out.back() = Z;
    return out;
  }
  const int64_t e = l.account_for_embedding ? 1 : 0, z = l.account_for_loss ? 1 : 0, per = (L + e + z) / p;
  for (auto& x : out) x = per;
  out.front() -= e;
  out.back() -= z;
  return out;
}

std::string layout_error(const ModelShape& m, const Training& t, const Layout& l) {
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.virtual_stages < 1 || l.cp < 1 || l.ep < 1)
    return "/layout/dp, /layout/tp, /layout/pp, /layout/cp, /layout/ep and /layout/virtual_stages must be >= 1";
  if (m.mlp()) return mlp_layout_error(m, t, l);  // plan_mlp.cpp
  if (m.experts < 0) return fmt::format("/model/experts = {}: expected 0 or 1 (dense) or more experts", m.experts);
  if (m.moe() && (m.top_k < 1 || m.top_k > m.experts))
    return fmt::format("/model/top_k = {}: expected 1 .. /model/experts = {} (each token's experts)", m.top_k, m.experts);
  if (m.moe() && !(std::isfinite(t.capacity_factor) && t.capacity_factor > 0))
    return fmt::format("/train/capacity_factor = {:g}: expected a finite number > 0", t.capacity_factor);
  if (l.ep > 1 && !m.moe())
    return fmt::format("/layout/ep = {}: expert parallelism needs a mixture of experts (/model/experts > 1)", l.ep);
  if (l.dp % l.ep != 0)
    return fmt::format("/layout/ep = {} does not divide /layout/dp = {} (expert parallelism is carved out of the "
                       "data-parallel ranks, as in Megatron-core)", l.ep, l.dp);
  if (m.moe() && m.experts % l.ep != 0)
    return fmt::format("/model/experts = {} is not a multiple of /layout/ep = {} (each EP rank holds E/ep experts)",
                       m.experts, l.ep);
  if (l.cp_attention != "ring" && l.cp_attention != "all_gather" && l.cp_attention != "ulysses")
    return fmt::format("/layout/cp_attention = \"{}\": expected ring, all_gather or ulysses", l.cp_attention);
  if (l.cp > 1 && m.sequence % (2 * l.cp) != 0)
    return fmt::format("/model/sequence = {} is not a multiple of 2 · /layout/cp = {} (the causal load-balanced split "
                       "cuts it into 2cp chunks)", m.sequence, 2 * l.cp);
  if (l.cp > 1 && l.cp_attention == "ulysses")
    for (const auto& [key, n] : {std::pair<const char*, int64_t>{"/model/heads", m.heads}, {"/model/kv_heads", m.kv_heads}})
      if (n % (l.tp * l.cp) != 0)
        return fmt::format("{} = {} is not a multiple of /layout/tp · /layout/cp = {} (Ulysses gives every CP rank whole "
                           "heads of its TP rank's; with /layout/cp_attention = ring or all_gather it need not)",
                           key, n, l.tp * l.cp);
  if (m.hidden % m.heads != 0)
    return fmt::format("/model/hidden = {} is not a multiple of /model/heads = {}", m.hidden, m.heads);
  if (m.heads % m.kv_heads != 0)
    return fmt::format("/model/heads = {} is not a multiple of /model/kv_heads = {}", m.heads, m.kv_heads);
  if (m.heads % l.tp != 0)
    return fmt::format("/model/heads = {} is not a multiple of /layout/tp = {} (each TP rank holds whole heads)",
                       m.heads, l.tp);
  if (m.kv_heads % l.tp != 0)
    return fmt::format("/model/kv_heads = {} is not a multiple of /layout/tp = {} (each TP rank holds whole K/V heads: "
                       "Megatron-LM's num_query_groups % tensor_model_parallel_size)", m.kv_heads, l.tp);
  if (l.sequence_parallel && l.tp > 1 && (m.sequence / l.cp) % l.tp != 0)
    return l.cp == 1 ? fmt::format("/model/sequence = {} is not a multiple of /layout/tp = {} (sequence parallelism "
                                   "splits the sequence over the TP ranks)", m.sequence, l.tp)
                     : fmt::format("/model/sequence / /layout/cp = {} is not a multiple of /layout/tp = {} (sequence "
                                   "parallelism splits each CP rank's positions over the TP ranks)", m.sequence / l.cp, l.tp);
  if (m.ffn % l.tp != 0)
    return fmt::format("/model/ffn = {} is not a multiple of /layout/tp = {}{}", m.ffn, l.tp,
                       m.moe() ? " (each expert is split over TP: expert TP = TP)" : "");
  if (!l.uneven() && m.layers % (l.pp * l.virtual_stages) != 0)
    return fmt::format("/model/layers = {} is not a multiple of /layout/pp · /layout/virtual_stages = {} · {}",
                       m.layers, l.pp, l.virtual_stages);
  if (l.uneven()) {
    const std::string why = uneven_error(m, l);
    if (!why.empty()) return why;
  }
  if (t.microbatch < 1) return "/train/microbatch must be >= 1";
  if (t.global_batch % (l.dp * t.microbatch) != 0)
    return fmt::format("/train/global_batch = {} is not a multiple of /layout/dp · /train/microbatch = {} · {}",
                       t.global_batch, l.dp, t.microbatch);
  if (l.zero < 0 || l.zero > 3) return fmt::format("/layout/zero = {}: expected 0, 1, 2 or 3", l.zero);
  if (l.zero >= 2 && l.pp > 1)
    return fmt::format("/layout/zero = {} with /layout/pp = {}: ZeRO-2 and ZeRO-3 shard what every microbatch of a "
                       "pipeline needs whole (DeepSpeed's PipelineEngine refuses them: \"ZeRO-2 and ZeRO-3 are "
                       "incompatible with pipeline parallelism\"); use ZeRO 0 or 1 with pipelining", l.zero, l.pp);
  if (l.pp == 1 && l.virtual_stages != 1)
    return fmt::format("/layout/virtual_stages = {}: model chunks per stage need /layout/pp > 1", l.virtual_stages);
  const ScheduleSpec* spec = nullptr;
  try {
    spec = &schedule_spec(l.schedule);
  } catch (const std::invalid_argument& e) {
    return std::string("/layout/schedule: ") + e.what();
  }
  if (l.pp > 1) {
    const int64_t m_mb = t.global_batch / (l.dp * t.microbatch);
    if (spec->chunks == 1 && l.virtual_stages != 1)
      return fmt::format("/layout/virtual_stages = {}: {} runs one chunk per stage", l.virtual_stages, spec->name);
    if (spec->chunks > 1 && l.virtual_stages != spec->chunks)
      return fmt::format("/layout/virtual_stages = {}: {} runs {} chunks per stage", l.virtual_stages, spec->name,
                         spec->chunks);
    if (spec->chunks == 0 && l.virtual_stages < 2)
      return fmt::format("/layout/virtual_stages = {}: {} needs at least 2 model chunks per stage", l.virtual_stages,
                         spec->name);
    if (spec->one_microbatch) return "/layout/schedule = naive runs one microbatch: use gpipe or 1f1b";
    if (m_mb > 1'000'000)
      return fmt::format("/train/global_batch = {}: {} microbatches per replica (/train/global_batch / (/layout/dp · "
                         "/train/microbatch)), more than the 10^6 a pipeline schedule is built for", t.global_batch, m_mb);
    try {
      if (spec->check) spec->check(static_cast<int>(l.pp), static_cast<int>(m_mb), static_cast<int>(l.virtual_stages));
    } catch (const std::invalid_argument& e) {
      return fmt::format("/layout/schedule = {} with {} microbatches per replica (/train/global_batch / (/layout/dp · "
                         "/train/microbatch)): {}", spec->name, m_mb, e.what());
    }
  }
  return "";
}

std::vector<Candidate> search(const ModelShape& m, const Training& t, const Layout& base, const System& sys,
                              int64_t devices) {
  std::vector<Candidate> out;
  for (int64_t tp = 1; tp <= devices; ++tp) {
    if (devices % tp != 0 || tp > sys.devices_per_node) continue;
    for (int64_t pp = 1; pp <= devices / tp; ++pp) {
      if ((devices / tp) % pp != 0) continue;
      const int64_t dp = devices / tp / pp;
      // with experts every EP degree the replicas and the experts allow; dense: ep = 1
      std::vector<int64_t> eps{1};
      if (m.moe())
        for (int64_t ep = 2; ep <= dp; ++ep)
          if (dp % ep == 0 && m.experts % ep == 0) eps.push_back(ep);
      for (int64_t ep : eps) {
        for (int64_t micro : {1, 2, 4, 8}) {
          for (int zero = 0; zero <= 3; ++zero) {
            for (const char* rc : {"none", "selective", "full"}) {
              Candidate c;
              c.layout = base;
              c.layout.dp = dp;
              c.layout.tp = tp;
              c.layout.pp = pp;
              c.layout.ep = ep;
              c.layout.cp = 1;  // the search ranks dp x tp x pp layouts; a CP layout is planned on its own
              // even stages: the uneven keys name one pp's split (docs/plan.md, "Uneven stages")
              c.layout.first_stage_layers = c.layout.last_stage_layers = 0;
              c.layout.account_for_embedding = c.layout.account_for_loss = false;
              c.layout.zero = zero;
              c.layout.sequence_parallel = base.sequence_parallel && tp > 1;
              if (pp == 1) c.layout.virtual_stages = 1;
              c.training = t;
              c.training.microbatch = micro;
              c.training.recompute = rc;
              c.rejected = layout_error(m, c.training, c.layout);
              if (c.rejected.empty()) {
                c.est = estimate(m, c.training, c.layout, sys);
                if (!c.est.fits)
                  c.rejected = fmt::format("needs {:.1f} GiB, {:.1f} GiB more than the {:.0f} GiB a device has",
                                           c.est.memory_bytes / kGiB, (c.est.memory_bytes - sys.memory_bytes) / kGiB,
                                           sys.memory_bytes / kGiB);
              }
              out.push_back(std::move(c));
            }
          }
        }
      }
    }
  }
  auto rank = [&](const Candidate& c) {
    if (c.rejected.empty()) return std::make_tuple(0, c.est.step_s);
    if (c.est.memory_bytes > 0) return std::make_tuple(1, c.est.memory_bytes - sys.memory_bytes);
    return std::make_tuple(2, 0.0);
  };
  std::stable_sort(out.begin(), out.end(), [&](const Candidate& x, const Candidate& y) { return rank(x) < rank(y); });
  return out;
}

}  // namespace mpt::plan
