// The planner's layouts: which divide the model (layout_error) and the search over them (search).
// The terms of one layout are plan.cpp's (docs/plan.md).
#include "core/plan/plan.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

#include <fmt/format.h>

#include "core/pipeline/schedule.hpp"

namespace mpt::plan {

std::string layout_error(const ModelShape& m, const Training& t, const Layout& l) {
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.virtual_stages < 1 || l.cp < 1 || l.ep < 1)
    return "/layout/dp, /layout/tp, /layout/pp, /layout/cp, /layout/ep and /layout/virtual_stages must be >= 1";
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
  if (m.layers % (l.pp * l.virtual_stages) != 0)
    return fmt::format("/model/layers = {} is not a multiple of /layout/pp · /layout/virtual_stages = {} · {}",
                       m.layers, l.pp, l.virtual_stages);
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
