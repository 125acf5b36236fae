// core/parallel, sharding: sharded data parallelism — ZeRO stages 0-3 (Rajbhandari et al. 2020,
// "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models") with FSDP2's
// per-parameter dim-0 sharding (torch.distributed.fsdp.fully_shard: every parameter a DTensor
// with placement Shard(0); rank r holds torch.chunk(param, N, dim=0)[r], padded to
// ceil(dim0 / N) rows for the all-gather and reduce-scatter, as FSDP2's FSDPParam does).
//
//   stage 0 (DDP)  every rank holds everything; gradients all-reduced (divided by N first).
//   stage 1        optimizer states sharded: gradients reduce-scattered, each rank updates its
//                  shard (fp32 master + Adam's m, v), the updated shards all-gathered.
//   stage 2        + gradients sharded: after the reduce-scatter only the gradient shard is kept.
//   stage 3        + parameters sharded: each Linear's weight and bias are all-gathered just
//                  before its forward and again before its backward, and freed after each.
//
// Mixed precision follows FSDP2's MixedPrecisionPolicy(param_dtype, reduce_dtype): compute in
// param_dtype (bf16 or fp32), gradients communicated in reduce_dtype, the optimizer always on
// an fp32 master (the parameter itself in fp32 stage 0; a shard in stages 1-3).
// The optimizer is a torch::optim optimizer over the master tensors (full or shards), so the
// update is torch::optim::Adam's / SGD's own, element by element.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "core/dist/group.hpp"

namespace mpt::dist {

/// One rank's rows of a dim-0 sharded tensor (FSDP2 Shard(0), torch.chunk's split): the chunk
/// is ceil(dim0 / N) rows; rank r holds rows [offset, offset + rows) with offset = r·chunk,
/// rows = clamp(dim0 − offset, 0, chunk) (the last ranks may hold fewer, or none).
struct Dim0Split {
  int64_t dim0 = 0;    ///< rows of the unsharded tensor
  int64_t chunk = 0;   ///< padded rows every rank sends and receives: ceil(dim0 / N)
  int64_t offset = 0;  ///< first row of this rank
  int64_t rows = 0;    ///< rows this rank really holds (≤ chunk)
};

/// The split of `dim0` rows over `world` ranks for `rank`. Throws std::invalid_argument for
/// dim0 < 1, world < 1 or a rank outside [0, world).
Dim0Split dim0_split(int64_t dim0, int rank, int world);

/// Rank `rank`'s rows of `full` (a contiguous copy, shape [rows, ...]).
torch::Tensor shard_dim0(const torch::Tensor& full, int rank, int world);

/// All-gather of dim-0 shards (FSDP2's unshard with its foreach copy-in): every rank's
/// `shards[i]` ([rows_r, ...], its dim0_split of fulls[i].size(0)) is cast to fulls[i]'s dtype
/// and zero-padded to chunk rows; the padded shards lie side by side in one buffer of C
/// elements, gathered into [N, C] in ONE Group::all_gather, and each tensor's first dim0 rows
/// are copied out into fulls[i]. All fulls share one dtype; bf16 travels as uint8 (the same
/// bits and bytes: LibTorch 1.13's Gloo has no bf16). Throws std::invalid_argument for a
/// shard of the wrong shape or mismatched lists.
void all_gather_dim0(Group& g, const std::vector<torch::Tensor>& shards, const std::vector<torch::Tensor>& fulls);
/// The same for one tensor.
void all_gather_dim0(Group& g, const torch::Tensor& shard, torch::Tensor full);

/// Reduce-scatter of full-size tensors along dim 0 (FSDP2's post-backward foreach
/// reduce-scatter): each `fulls[i]` ([dim0, ...], this rank's own) is cast to `reduce_dtype`,
/// divided by `divide` (DDP's and FSDP's gradient pre-divide; 1 = none) and zero-padded to
/// N·chunk rows; block r of the [N, C] input holds chunk r of every tensor; ONE
/// Group::reduce_scatter sums the blocks over the ranks, and this rank's rows of each tensor are
/// added to `outs[i]` ([rows, ...], any dtype; accumulate = true) or copied into it.
/// Throws std::invalid_argument for an output of the wrong shape or mismatched lists;
/// RuntimeFailure where the backend cannot reduce `reduce_dtype` (bf16 on LibTorch 1.13's Gloo).
void reduce_scatter_dim0(Group& g, const std::vector<torch::Tensor>& fulls, const std::vector<torch::Tensor>& outs,
                         torch::ScalarType reduce_dtype, double divide, bool accumulate);
/// The same for one tensor.
void reduce_scatter_dim0(Group& g, const torch::Tensor& full, torch::Tensor out, torch::ScalarType reduce_dtype,
                         double divide, bool accumulate);

/// The shapes of `ts`, in order: a FlatShardGroup's `shapes` for those tensors.
std::vector<std::vector<int64_t>> shapes_of(const std::vector<torch::Tensor>& ts);

/// The flat collective buffers of one parameter group, allocated once and reused every step
/// (FSDP2's FSDPParamGroup with its reduce_scatter_input / all_gather_output, and DeepSpeed
/// ZeRO-2's contiguous gradient buffer): the layout is foreach_reduce's and
/// foreach_all_gather's — block r of the [N, C] buffer holds chunk r (dim0_split) of every
/// tensor side by side, each zero-padded to ceil(dim0 / N) rows, C = Σ_i chunk_i · row_i elements.
/// The padding is zeroed when a buffer is made and never written after, so a step only copies
/// the rows in (a cast where dtypes differ), posts ONE collective, and copies or views out.
/// Buffers are made on first use per dtype (the reduce dtype; the gather dtype: param_dtype for
/// the training step, fp32 for full_parameters()), so after the first step no call allocates
/// (but the ring reduce-scatter (Group::ring_reduce_scatter: LibTorch 1.13, or dist.gloo_algorithm
/// = ring), which allocates three chunk-sized step buffers per call).
class FlatShardGroup {
 public:
  /// `shapes`: the unsharded tensors of the group (each of >= 1 dims), in order. Throws
  /// std::invalid_argument for an empty list, a 0-dim shape or a bad rank / world.
  FlatShardGroup(std::vector<std::vector<int64_t>> shapes, int rank, int world);
  /// Reduce-scatter as reduce_scatter_dim0 (same arguments, same values bit for bit: the same
  /// cast, pre-divide and Group::reduce_scatter of the same [N, C] buffer). Throws
  /// std::invalid_argument for a full tensor or output of the wrong shape.
  void reduce_scatter(Group& g, const std::vector<torch::Tensor>& fulls, const std::vector<torch::Tensor>& outs,
                      torch::ScalarType reduce_dtype, double divide, bool accumulate);
  /// As reduce_scatter, the reduced shards left in the returned flat buffer of C elements of
  /// `reduce_dtype` (tensor i's shard at shard_offset(i), its rows·row elements first): FSDP2's
  /// views of the reduce-scatter output. Valid until the next call with that dtype. `out`, when
  /// given (contiguous, C elements of `reduce_dtype`), receives the shards instead of the
  /// group's buffer and is returned.
  torch::Tensor reduce_scatter_flat(Group& g, const std::vector<torch::Tensor>& fulls, torch::ScalarType reduce_dtype,
                                    double divide, torch::Tensor out = {});
  /// All-gather as all_gather_dim0 (same arguments and values; bf16 travels as uint8). Where
  /// the ring runs, the shards are copied straight into this rank's block of the output.
  void all_gather(Group& g, const std::vector<torch::Tensor>& shards, const std::vector<torch::Tensor>& fulls);
  /// C: elements of one rank's padded shards, side by side.
  int64_t shard_numel() const { return off_.back(); }
  /// Offset of tensor i's padded shard in the C elements.
  int64_t shard_offset(std::size_t i) const { return off_.at(i); }
  /// Tensor i's split.
  const Dim0Split& split(std::size_t i) const { return sp_.at(i); }
  /// The [N·C] summands of the last reduce_scatter_flat (a copy taken before the collective)
  /// when `keep` is set; undefined otherwise. For ReductionRecord.
  void keep_terms(bool keep) { keep_ = keep; }
  const torch::Tensor& kept_terms() const { return kept_; }

 private:
  torch::Tensor& buffer(std::map<torch::ScalarType, torch::Tensor>& m, torch::ScalarType dt, int64_t numel,
                        const torch::Device& dev, bool zero);
  void copy_in(const std::vector<torch::Tensor>& fulls, const torch::Tensor& in, double divide);
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<Dim0Split> sp_;
  std::vector<int64_t> off_, row_;
  int rank_ = 0, world_ = 1;
  std::map<torch::ScalarType, torch::Tensor> rs_in_, rs_out_, ag_in_, ag_out_;
  bool keep_ = false;
  torch::Tensor kept_;
};

/// DDP's gradient all-reduce in one bucket: the tensors are flattened into one buffer of
/// `reduce_dtype`, divided by `divide`, all-reduced (sum, one call) and written back into each
/// tensor of `outs` (cast to its dtype; `outs[i]` has the shape of `ins[i]`, may be ins[i]).
void allreduce_flat(Group& g, const std::vector<torch::Tensor>& ins, const std::vector<torch::Tensor>& outs,
                    torch::ScalarType reduce_dtype, double divide);

/// Options of ShardedDataParallel (names after DeepSpeed's zero_optimization.stage and FSDP2's
/// MixedPrecisionPolicy).
struct ShardOptions {
  int stage = 0;                                     ///< ZeRO stage 0 (DDP), 1, 2 or 3
  torch::ScalarType param_dtype = torch::kFloat32;   ///< compute dtype of forward and backward
  torch::ScalarType reduce_dtype = torch::kFloat32;  ///< dtype of the gradient all-reduce / reduce-scatter
  /// Stages 2-3: reduce-scatter after every micro-batch and accumulate into the gradient shard
  /// (DeepSpeed ZeRO-2's default; the sum's order then differs from DDP's). false: keep the
  /// unsharded gradient over the micro-batches and reduce-scatter after the last one (FSDP2
  /// set_requires_gradient_sync(False) / DDP no_sync). Stages 0-1 always reduce after the last.
  bool reduce_every_micro_batch = false;
  /// Keep a copy of every gradient reduction's summands and result (ReductionRecord) for
  /// reduction_error: costs a copy per reduction, for equivalence checks at N > 2, not timing.
  bool record_reductions = false;
};

/// One gradient reduction as ShardOptions::record_reductions keeps it.
struct ReductionRecord {
  torch::Tensor terms;    ///< this rank's summands as sent (reduce dtype, pre-divided by N), flat:
                          ///< all-reduce [L]; reduce-scatter [N·C], block r summed onto rank r
  torch::Tensor reduced;  ///< what the collective returned here (reduce dtype): [L], or this rank's block [C]
  bool scattered = false; ///< reduce-scatter (true) or all-reduce (false)
};

/// Largest error of recorded reductions against the exact sum of the same summands, and the
/// a-priori bound it must stay within (every rank gets the maxima over all ranks).
struct ReductionError {
  double max_abs_diff = 0;  ///< max over elements of |reduced − Σ_ranks terms| (the sum in float64)
  double max_bound = 0;     ///< max over elements of the bound below
  double max_ratio = 0;     ///< max over elements of |reduced − Σ terms| / bound (≤ 1 must hold; 0/0 = 0)
  int64_t elements = 0;     ///< elements compared on this rank
};

/// Checks recorded reductions (a collective: every rank calls it with its records, in the same
/// order). Any order of summing n = N terms t_r in floating point with unit roundoff u (2^-24 for
/// fp32, 2^-8 for bf16: the reduce dtype) is within γ_{n−1}·Σ|t_r| of the exact sum, γ_k = k·u/(1 −
/// k·u) (Higham, Accuracy and Stability of Numerical Algorithms, eq. 3.5 / §4.2: recursive
/// summation in any order, which pairwise, ring and tree all-reduces are); the reference sum in
/// float64 adds γ⁽⁶⁴⁾_{n−1}·Σ|t_r|, so per element
///   |reduced − Σ_fp64 t_r| ≤ (γ_{n−1} + γ⁽⁶⁴⁾_{n−1})·Σ_r |t_r|.
/// The terms are the pre-divided values each rank sent, so the division by N (exact for N a
/// power of two, one rounding otherwise) is outside the bound: it is the same on every route.
/// Gathers every rank's terms (one all-gather each, N·L elements). Throws std::invalid_argument
/// for records of different shapes across ranks' expectations (a terms/reduced size mismatch).
ReductionError reduction_error(Group& g, const std::vector<ReductionRecord>& records);


/// Makes the optimizer over the fp32 master tensors (full parameters or shards), e.g.
/// [](auto ps) { return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1e-3)); }.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

/// Bytes of model states one rank holds (counted from the tensors it keeps: numel · element size).
struct HeldBytes {
  int64_t params = 0;     ///< parameters used by forward (compute dtype; stage 3: the fp32 shard)
  int64_t grads = 0;      ///< gradients: unsharded compute-dtype .grad, fp32 master / shard gradients
  int64_t optimizer = 0;  ///< a separate fp32 master copy, and the optimizer's state tensors (Adam m, v)
  int64_t total() const { return params + grads + optimizer; }
};

/// Data-parallel training of a torch::nn::Sequential of Linear layers and parameter-free modules
/// (Flatten, ReLU, ...) at ZeRO stage 0-3 over `group` (see the file comment). Per step:
///   for each micro-batch m: loss = f(forward(x_m)); backward(loss, m == last);
///   step();
/// Every rank must build `net` with the same values; rank 0's are broadcast at construction.
/// Forward runs the modules in order, each Linear as torch::nn::functional::linear (the op
/// LinearImpl::forward calls), so its numbers are those of the module itself. At stage 3 a
/// Linear is an autograd function that all-gathers its weight and bias (one call, FSDP2's
/// per-module group) in forward, frees them, and in backward gathers them again and recomputes
/// the local linear to take the same backward as LibTorch's (its gradients are AddmmBackward's,
/// bit for bit), then reduce-scatters them (one call). Stages 1-2 reduce-scatter all gradients
/// in one call and all-gather all updated shards in one call per step.
///
/// Any other module (the tiny GPT) goes through the second constructor: its forward is a
/// callable, and its parameters (named_parameters(), recursive, in that order) are the unit of
/// FSDP2's fully_shard(model) applied to the root alone — one parameter group. Stages 0-2 set
/// the module's own parameters to the compute tensors (DDP's replica). At stage 3 the module's
/// parameters are emptied (resharded); an autograd function all-gathers all of them in ONE call
/// before the forward, frees them after it, gathers them again in backward and recomputes the
/// forward to take LibTorch's own backward of the same operations on the same values
/// (activation recomputation, so its gradients equal the unsharded module's bit for bit), then
/// reduce-scatters all gradients in ONE call. The bytes moved are those of the per-layer
/// groups; the transient peak holds the whole gathered model instead of one layer's.
class ShardedDataParallel {
 public:
  /// The forward of a whole module: input (any dtype: token ids, images) → output.
  using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

  /// Throws std::invalid_argument for a stage outside 0..3, a module with parameters that is
  /// not a Linear, or (stage 3) a parameter with fewer rows than the group has ranks.
  ShardedDataParallel(const torch::nn::Sequential& net, std::shared_ptr<Group> group, ShardOptions opts,
                      const OptimizerFactory& make_optimizer);
  /// Any module whose `forward` uses only its own parameters (see above). The module is
  /// modified: its parameters become this wrapper's compute tensors (stages 0-2) or empty
  /// (stage 3); use the wrapper's forward, not the module's, from here on. Throws
  /// std::invalid_argument for a stage outside 0..3, a module without parameters, or (stage 3)
  /// a parameter with fewer rows than the group has ranks (its name in the message).
  ShardedDataParallel(std::shared_ptr<torch::nn::Module> module, Forward forward, std::shared_ptr<Group> group,
                      ShardOptions opts, const OptimizerFactory& make_optimizer);
  ~ShardedDataParallel();
  ShardedDataParallel(const ShardedDataParallel&) = delete;
  ShardedDataParallel& operator=(const ShardedDataParallel&) = delete;

  /// Output of the network for input x (a floating x is cast to param_dtype), in param_dtype.
  torch::Tensor forward(const torch::Tensor& x);
  /// Backward of one micro-batch's loss; `last`: the last micro-batch of the step (the gradients
  /// are reduced then, or after every micro-batch with reduce_every_micro_batch at stages 2-3).
  void backward(const torch::Tensor& loss, bool last);
  /// The optimizer step on the fp32 masters (after the last backward), then the compute
  /// parameters refreshed (stage 0 in bf16: a cast; stages 1-2: all-gather of the updated
  /// shards); gradients cleared (zero_grad(set_to_none=True)).
  void step();
  /// The fp32 parameters, unsharded, in named_parameters() order (stages 1-3: an all-gather,
  /// a collective every rank must call). Not counted as training traffic by the caller's
  /// snapshots if taken between them.
  std::vector<torch::Tensor> full_parameters();

  /// The reductions kept since the last call (ShardOptions::record_reductions), cleared.
  std::vector<ReductionRecord> take_reductions() { return std::exchange(records_, {}); }

  /// Model-state bytes held now.
  HeldBytes held() const;
  /// The largest held() seen per role at the optimizer step (just before and just after it):
  /// the model states ZeRO counts. Unsharded gradients kept over micro-batches and parameters
  /// gathered inside forward/backward are transient (measure them with core/runtime/memory's PeakScope).
  const HeldBytes& held_peak() const { return held_peak_; }
  /// Ψ: elements of all parameters; padded: Σ N·chunk·(elements per row) — what the sharded
  /// collectives move.
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  const ShardOptions& options() const { return opts_; }
  Group& group() { return *group_; }

  /// Stage 3: gathers parameters `ids` (fp32 shards, cast to param_dtype) into fresh full
  /// tensors, in one all-gather. Public for the autograd function of stage 3 only.
  std::vector<torch::Tensor> gather_params(const std::vector<std::size_t>& ids);
  /// Stage 3: the reduce-scatter (one call) of the full gradients `grads` of parameters `ids`,
  /// returned as the gradients of their shards — or, before the last micro-batch without
  /// reduce_every_micro_batch, their local accumulation (undefined tensors returned).
  /// Public for the autograd function only.
  std::vector<torch::Tensor> reduce_param_grads(const std::vector<std::size_t>& ids,
                                                const std::vector<torch::Tensor>& grads);
  /// Stage 3 of a whole module: gathers every parameter (one all-gather) into the module's own
  /// parameter tensors (bind = true), or empties them again (bind = false, the reshard).
  /// Public for the autograd function only.
  void bind_module_params(bool bind);
  /// The module's forward (whole-module wrapper) and its parameter tensors.
  const Forward& module_forward() const { return module_forward_; }
  const std::vector<torch::Tensor>& module_params() const { return module_params_; }

 private:
  struct Param;
  struct Op;
  void reduce_unsharded(bool accumulate);
  void note_held();
  void init_flat();
  std::size_t init_param(const torch::Tensor& t, const std::string& what, torch::Tensor module_param);
  std::shared_ptr<Group> group_;
  ShardOptions opts_;
  std::vector<Param> params_;
  std::vector<Op> ops_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  HeldBytes held_peak_;
  int64_t numel_ = 0, padded_numel_ = 0;
  bool syncing_ = true;  // the current backward reduces (stage 3)
  std::shared_ptr<torch::nn::Module> module_;  // whole-module wrapper: the module, its forward
  Forward module_forward_;
  std::vector<torch::Tensor> module_params_;
  std::unique_ptr<FlatShardGroup> flat_;  // stages 1-2: every parameter, one group (persistent buffers)
  torch::Tensor grad_flat_;               // stages 1-2: the fp32 gradient shards side by side (C elements)
  std::vector<ReductionRecord> records_;  // record_reductions
};

}  // namespace mpt::dist
