// core/parallel/mesh: the rank layout of the DP x CP x TP x PP mesh and its process groups. See mesh.hpp.
#include "core/parallel/mesh.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace mpt {

MeshLayout::MeshLayout(MeshDims d) : dp(d.dp), tp(d.tp), pp(d.pp), cp(d.cp), ep(d.ep) {
  if (dp < 1 || tp < 1 || pp < 1 || cp < 1)
    throw std::invalid_argument("MeshLayout: degrees must be >= 1, got dp = " + std::to_string(dp) + ", tp = " +
                                std::to_string(tp) + ", pp = " + std::to_string(pp) + ", cp = " + std::to_string(cp));
  if (ep < 1 || dp % ep != 0)
    throw std::invalid_argument("MeshLayout: ep must divide dp (the EP groups are carved out of the DP ranks), got "
                                "dp = " + std::to_string(dp) + ", ep = " + std::to_string(ep));
}

int MeshLayout::rank_of(int pp_idx, int dp_idx, int tp_idx, int cp_idx) const {
  if (pp_idx < 0 || pp_idx >= pp || dp_idx < 0 || dp_idx >= dp || tp_idx < 0 || tp_idx >= tp || cp_idx < 0 ||
      cp_idx >= cp)
    throw std::out_of_range("MeshLayout::rank_of: (pp " + std::to_string(pp_idx) + ", dp " + std::to_string(dp_idx) +
                            ", tp " + std::to_string(tp_idx) + ", cp " + std::to_string(cp_idx) + ") outside the mesh");
  return ((pp_idx * dp + dp_idx) * cp + cp_idx) * tp + tp_idx;
}

MeshLayout::Coord MeshLayout::coord(int rank) const {
  if (rank < 0 || rank >= size())
    throw std::out_of_range("MeshLayout::coord: rank " + std::to_string(rank) + " outside the mesh of " +
                            std::to_string(size()));
  Coord c;
  c.tp = rank % tp;
  c.cp = (rank / tp) % cp;
  c.dp = (rank / (tp * cp)) % dp;
  c.pp = rank / (tp * cp * dp);
  c.ep = c.dp % ep;
  return c;
}

std::vector<int> MeshLayout::tp_group(int pp_idx, int dp_idx, int cp_idx) const {
  std::vector<int> v;
  for (int i = 0; i < tp; ++i) v.push_back(rank_of(pp_idx, dp_idx, i, cp_idx));
  return v;
}
std::vector<int> MeshLayout::cp_group(int pp_idx, int dp_idx, int tp_idx) const {
  std::vector<int> v;
  for (int c = 0; c < cp; ++c) v.push_back(rank_of(pp_idx, dp_idx, tp_idx, c));
  return v;
}
std::vector<int> MeshLayout::dp_group(int pp_idx, int tp_idx, int cp_idx) const {
  std::vector<int> v;
  for (int d = 0; d < dp; ++d) v.push_back(rank_of(pp_idx, d, tp_idx, cp_idx));
  return v;
}
std::vector<int> MeshLayout::ep_group(int pp_idx, int dp_idx, int tp_idx, int cp_idx) const {
  std::vector<int> v;
  const int base = dp_idx / ep * ep;
  for (int d = base; d < base + ep; ++d) v.push_back(rank_of(pp_idx, d, tp_idx, cp_idx));
  return v;
}
std::vector<int> MeshLayout::edp_group(int pp_idx, int dp_idx, int tp_idx, int cp_idx) const {
  std::vector<int> v;
  for (int d = dp_idx % ep; d < dp; d += ep) v.push_back(rank_of(pp_idx, d, tp_idx, cp_idx));
  return v;
}
std::vector<int> MeshLayout::pp_group(int dp_idx, int tp_idx, int cp_idx) const {
  std::vector<int> v;
  for (int s = 0; s < pp; ++s) v.push_back(rank_of(s, dp_idx, tp_idx, cp_idx));
  return v;
}

std::vector<MeshLayout::GroupSpec> MeshLayout::groups(const std::string& axis) const {
  std::vector<GroupSpec> out;
  // The cp coordinate is named only in a mesh that has the axis: a DP x TP x PP mesh keeps its names.
  auto cpn = [this](int c) { return cp > 1 ? fmt::format("cp{}", c) : std::string(); };
  if (axis == "tp") {
    for (int s = 0; s < pp; ++s)
      for (int d = 0; d < dp; ++d)
        for (int c = 0; c < cp; ++c) out.push_back({fmt::format("mesh/tp/pp{}dp{}{}/", s, d, cpn(c)), tp_group(s, d, c)});
  } else if (axis == "cp") {
    for (int s = 0; s < pp; ++s)
      for (int d = 0; d < dp; ++d)
        for (int i = 0; i < tp; ++i) out.push_back({fmt::format("mesh/cp/pp{}dp{}tp{}/", s, d, i), cp_group(s, d, i)});
  } else if (axis == "dp") {
    for (int s = 0; s < pp; ++s)
      for (int c = 0; c < cp; ++c)
        for (int i = 0; i < tp; ++i) out.push_back({fmt::format("mesh/dp/pp{}{}tp{}/", s, cpn(c), i), dp_group(s, i, c)});
  } else if (axis == "pp") {
    for (int d = 0; d < dp; ++d)
      for (int c = 0; c < cp; ++c)
        for (int i = 0; i < tp; ++i) out.push_back({fmt::format("mesh/pp/dp{}{}tp{}/", d, cpn(c), i), pp_group(d, i, c)});
  } else if (axis == "ep") {
    for (int s = 0; s < pp; ++s)
      for (int c = 0; c < cp; ++c)
        for (int i = 0; i < tp; ++i)
          for (int k = 0; k < dp / ep; ++k)
            out.push_back({fmt::format("mesh/ep/pp{}{}tp{}ep{}/", s, cpn(c), i, k), ep_group(s, k * ep, i, c)});
  } else if (axis == "edp") {
    for (int s = 0; s < pp; ++s)
      for (int c = 0; c < cp; ++c)
        for (int i = 0; i < tp; ++i)
          for (int j = 0; j < ep; ++j)
            out.push_back({fmt::format("mesh/edp/pp{}{}tp{}e{}/", s, cpn(c), i, j), edp_group(s, j, i, c)});
  } else {
    throw std::invalid_argument("MeshLayout::groups: expected the axis tp, cp, dp, pp, ep or edp, got '" + axis + "'");
  }
  return out;
}

Mesh::Mesh(World& world, const MeshLayout& layout, torch::Device device) : layout_(layout) {
  if (layout_.size() != world.size())
    throw std::invalid_argument(fmt::format("Mesh: dp {} x cp {} x tp {} x pp {} = {} ranks, but the world has {}",
                                            layout_.dp, layout_.cp, layout_.tp, layout_.pp, layout_.size(), world.size()));
  coord_ = layout_.coord(world.rank());
  std::vector<const char*> axes = {"tp", "cp", "dp", "pp"};
  if (layout_.ep > 1) axes.insert(axes.end(), {"ep", "edp"});
  for (const char* axis : axes)
    for (const auto& spec : layout_.groups(axis))
      if (auto g = world.new_group(spec.name, spec.ranks, device)) {
        groups_[axis] = g;
        ranks_[axis] = spec.ranks;
      }
}

const std::shared_ptr<dist::Group>& Mesh::group(const std::string& axis) const {
  const auto it = groups_.find(axis);
  if (it == groups_.end()) throw std::out_of_range("Mesh::group: no axis '" + axis + "' (expected tp, cp, dp or pp; ep and edp in a mesh with ep > 1)");
  return it->second;
}

const std::vector<int>& Mesh::ranks(const std::string& axis) const {
  const auto it = ranks_.find(axis);
  if (it == ranks_.end()) throw std::out_of_range("Mesh::ranks: no axis '" + axis + "' (expected tp, cp, dp or pp; ep and edp in a mesh with ep > 1)");
  return it->second;
}

}  // namespace mpt
