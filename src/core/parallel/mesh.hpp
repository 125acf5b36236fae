// core/parallel/mesh: the device mesh of a multi-process run — the degrees of every parallelism
// (dp, cp, tp, pp, and ep carved out of dp), their validation, the rank layout and every process group,
// built once. The role of torchtitan's ParallelDims (torchtitan/distributed/parallel_dims.py,
// build_mesh) and of Megatron-LM's initialize_model_parallel (megatron/core/parallel_state.py).
//
// Rank order ("pp", "dp", "cp", "tp"), tp fastest:
//   global rank = ((pp_idx·dp + dp_idx)·cp + cp_idx)·tp + tp_idx.
// It is Megatron-LM's default (initialize_model_parallel with order "tp-cp-ep-dp-pp" and ep = 1:
// RankGenerator puts the first-named dim fastest) and torch's init_device_mesh(..., (pp, dp, cp,
// tp), mesh_dim_names=("pp", "dp", "cp", "tp")) over arange(world).view(pp, dp, cp, tp),
// torchtitan's order: TP's frequent collectives stay between neighbouring ranks (one node), then
// context parallelism's ring, the pipeline's point-to-point sends take the slowest links. With
// cp = 1 it is the (pp, dp, tp) order and group names of the DP x TP x PP mesh.
//
// Expert parallelism lives inside data parallelism, as Megatron-core places it: the ep ranks of
// an EP group hold the same shards of the same stage (same pp, cp and tp coordinates) and
// consecutive DP coordinates [k·ep, (k+1)·ep); each holds E/ep experts of every MoE layer and its
// own sequences. The expert-data-parallel group (Megatron's expert_data_parallel group) joins the
// ranks holding the same experts: DP coordinates ≡ j (mod ep), dp/ep of them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/dist/group.hpp"
#include "core/dist/world.hpp"

namespace mpt {

/// The degrees of the mesh (torchtitan's ParallelDims fields). ep divides dp (the EP groups are
/// carved out of the DP ranks; it adds no ranks).
struct MeshDims {
  int dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
};

/// The rank layout of a mesh of dp·cp·tp·pp processes (see the file comment). Throws
/// std::invalid_argument when a degree is < 1, or ep does not divide dp.
struct MeshLayout {
  explicit MeshLayout(MeshDims dims);
  MeshLayout(int dp, int tp, int pp, int cp = 1, int ep = 1) : MeshLayout(MeshDims{dp, tp, pp, cp, ep}) {}
  int dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  int size() const { return dp * cp * tp * pp; }
  /// The global rank at coordinates (pp_idx, dp_idx, tp_idx, cp_idx); std::out_of_range outside the mesh.
  int rank_of(int pp_idx, int dp_idx, int tp_idx, int cp_idx = 0) const;
  /// Coordinates of a global rank.
  struct Coord {
    int pp = 0, dp = 0, tp = 0, cp = 0;
    int ep = 0;  ///< the place in the EP group: dp mod ep
  };
  /// std::out_of_range for a rank outside 0 .. size() − 1.
  Coord coord(int rank) const;
  /// The TP group of (pp_idx, dp_idx, cp_idx): tp consecutive ranks (Megatron's tensor-model-parallel group).
  std::vector<int> tp_group(int pp_idx, int dp_idx, int cp_idx = 0) const;
  /// The CP group of (pp_idx, dp_idx, tp_idx): the ranks holding the same shards of the same stage
  /// and the same sequences, each its share of the positions (Megatron's context-parallel group).
  std::vector<int> cp_group(int pp_idx, int dp_idx, int tp_idx) const;
  /// The DP group of (pp_idx, tp_idx, cp_idx): the ranks holding the same shards of the same stage
  /// and the same positions of different sequences.
  std::vector<int> dp_group(int pp_idx, int tp_idx, int cp_idx = 0) const;
  /// The EP group of the rank at (pp_idx, dp_idx, tp_idx, cp_idx): DP coordinates
  /// [⌊dp_idx/ep⌋·ep, +ep) with the other coordinates fixed, in DP order (group rank = dp_idx mod ep).
  std::vector<int> ep_group(int pp_idx, int dp_idx, int tp_idx, int cp_idx = 0) const;
  /// The expert-data-parallel group of that rank: DP coordinates ≡ dp_idx (mod ep), in DP order.
  std::vector<int> edp_group(int pp_idx, int dp_idx, int tp_idx, int cp_idx = 0) const;
  /// The PP group of (dp_idx, tp_idx, cp_idx), in stage order: tp-rank i of stage s sends to tp-rank i
  /// of stage s + 1 (group rank = stage).
  std::vector<int> pp_group(int dp_idx, int tp_idx, int cp_idx = 0) const;

  /// One process group of an axis: its store prefix (unique in the job) and its global ranks.
  struct GroupSpec {
    std::string name;
    std::vector<int> ranks;
  };
  /// Every group of `axis` ("tp", "cp", "dp", "pp", "ep" or "edp") in the one order every rank
  /// builds them: the other coordinates in the mesh's order (tp: pp, dp, cp; cp: pp, dp, tp; dp:
  /// pp, cp, tp; pp: dp, cp, tp; ep: pp, cp, tp, then the EP block; edp: pp, cp, tp, then the
  /// place in the block), names "mesh/<axis>/<other coordinates>/" (the cp coordinate named only
  /// when cp > 1). Throws std::invalid_argument for another axis.
  std::vector<GroupSpec> groups(const std::string& axis) const;
};

/// The mesh of this rank: the layout and this rank's TP, CP, DP and PP groups (and with ep > 1 its
/// EP and expert-DP groups), every group of the job built once, in the order TP, CP, DP, PP, EP,
/// EDP (MeshLayout::groups), as torch's DeviceMesh does: every rank walks every group, joining
/// its own (World::new_group returns nullptr elsewhere).
class Mesh {
 public:
  /// Throws std::invalid_argument when the layout's size is not the world size; else what
  /// World::new_group throws (RuntimeFailure when a peer does not show up).
  Mesh(World& world, const MeshLayout& layout, torch::Device device = torch::kCPU);
  const MeshLayout& layout() const { return layout_; }
  /// This rank's coordinates.
  const MeshLayout::Coord& coord() const { return coord_; }
  /// This rank's group of `axis` ("tp", "cp", "dp", "pp"; "ep", "edp" when ep > 1); std::out_of_range
  /// for another axis.
  const std::shared_ptr<dist::Group>& group(const std::string& axis) const;
  /// The global ranks of this rank's group of `axis`, in group-rank order.
  const std::vector<int>& ranks(const std::string& axis) const;
  const std::shared_ptr<dist::Group>& tp() const { return group("tp"); }
  const std::shared_ptr<dist::Group>& dp() const { return group("dp"); }
  const std::shared_ptr<dist::Group>& cp() const { return group("cp"); }
  const std::shared_ptr<dist::Group>& pp() const { return group("pp"); }

 private:
  MeshLayout layout_;
  MeshLayout::Coord coord_;
  std::map<std::string, std::shared_ptr<dist::Group>> groups_;
  std::map<std::string, std::vector<int>> ranks_;
};

}  // namespace mpt
