// The planner's model of a training layout: memory per device and step time of a GPT trained
// with data, tensor (and sequence), pipeline and sharded (ZeRO) parallelism, from closed-form
// terms, each named after its source (docs/plan.md). Pure arithmetic: no tensors, no processes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mpt::plan {

/// Bytes in a GiB (2^30): the unit of memory_gib and of the tables.
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// A decoder-only transformer's shape. GPT-style (LayerNorm, GELU MLP with ffn = 4·hidden,
/// biases, learned positions, dropout) or Llama-style (RMSNorm, SwiGLU, no biases, RoPE, grouped
/// K/V heads, no dropout); dense, or a mixture of experts: every block's MLP a set of `experts`
/// MLPs of the dense one's shape (ffn wide, its biases) and a router of E·h weights without a bias,
/// each token through `top_k` of them (Switch, GShard, Mixtral; core/models/moe).
struct ModelShape {
  std::string name;          ///< the preset's name, or "custom"
  int64_t layers = 0;        ///< transformer blocks L
  int64_t hidden = 0;        ///< model width h
  int64_t heads = 0;         ///< attention (query) heads a
  int64_t kv_heads = 0;      ///< key/value heads (= heads without grouped-query attention)
  int64_t ffn = 0;           ///< MLP hidden width f
  int64_t vocab = 0;         ///< vocabulary V
  int64_t sequence = 0;      ///< sequence length s (tokens per sample)
  bool swiglu = false;       ///< SwiGLU MLP (three h·f matrices) instead of GELU (two)
  bool rmsnorm = false;      ///< RMSNorm (weight only) instead of LayerNorm (weight and bias)
  bool bias = true;          ///< biases in the attention and MLP linears
  bool learned_positions = true;  ///< a learned s·h position table (GPT-2/3); false: RoPE, no parameters
  bool tied = false;         ///< the output head shares the token embedding
  bool dropout = true;       ///< dropout masks are stored (Korthikanti et al. 2022 count them)
  int64_t experts = 0;       ///< E experts per block's MLP; 0 or 1: dense (one MLP, no router)
  int64_t top_k = 0;         ///< k experts per token, 1 ≤ k ≤ E (ignored when dense)
  /// Whether every block's MLP is a mixture of experts (E > 1).
  bool moe() const { return experts > 1; }
  /// An MLP instead of a transformer (`model.style` mlp): Linear layers with biases, a ReLU after
  /// every one but the last, optionally dropout after each ReLU (`dropout`), as core/models/mlp
  /// builds them; widths w_0 (the input) .. w_L (the output), layers = L. Empty: a transformer.
  std::vector<int64_t> widths;
  /// Whether the model is an MLP (widths given).
  bool mlp() const { return !widths.empty(); }
};

/// Every preset, by name: "gpt3-175b" (Brown et al. 2020, Table 2.1), "llama3-8b", "llama3-70b",
/// "llama3-405b" (Llama 3 paper, Table 3; Meta's config.json), "megatron-1t" (Narayanan et al.
/// 2021, Table 1's last row), "mixtral-8x7b" (Jiang et al. 2024, Table 1: 32 layers, h 4096, 32
/// heads / 8 K/V, SwiGLU experts of 14336, V 32000, 32768 tokens, 8 experts, top-2; Hugging Face's
/// MixtralConfig for mistralai/Mixtral-8x7B-v0.1: RMSNorm, no biases, router without a bias,
/// RoPE, untied), "mpt-gpt" (mpt's own tiny GPT, core/models/gpt's defaults) and "mpt-moe" (mpt's
/// own MoE GPT, `mpt expertparallel`'s defaults: the tiny GPT of 2 layers, width 64, context 32,
/// 8 experts of 128, top-2).
const std::vector<ModelShape>& presets();
/// The preset named `name`; throws std::invalid_argument for an unknown name.
const ModelShape& preset(const std::string& name);

/// Parameters of a model (counts, not bytes).
struct ParamCounts {
  double per_layer = 0;   ///< one block: attention, MLP (every expert and the router), two norms
  /// The matrix weights a token's GEMMs pass through in one block (the model FLOPs count these):
  /// attention and MLP; with experts attention, the router (E·h) and k experts (the active ones).
  double matmul_per_layer = 0;
  double expert = 0;      ///< one expert (= the dense MLP): its matrices and biases; 0 when dense
  double expert_matmul = 0;  ///< one expert's matrices, 2hf (GELU) or 3hf (SwiGLU); 0 when dense
  double router = 0;      ///< E·h per block (no bias); 0 when dense
  double active = 0;      ///< total with k experts per block instead of E (Mixtral's "active parameters")
  double embedding = 0;   ///< V·h token table
  double positions = 0;   ///< s·h for learned positions, else 0
  double head = 0;        ///< V·h output projection when untied, else 0
  double final_norm = 0;  ///< the last norm
  double total = 0;
};
/// Counts every weight and bias; for GPT-3 175B 174.6e9 (Megatron's 12·l·h²(1 + 13/12h + (V + s)/12lh)).
/// With experts each block holds E experts and the router: Mixtral 8x7B 46,702,792,704 (12.9e9 active).
/// An MLP: total = active = Σ_k (w_k·w_k+1 + w_k+1), the other fields 0.
ParamCounts count_params(const ModelShape& m);

/// Tokens one expert computes from a group of `tokens` (the tokens a rank routes per microbatch
/// and layer) with drop-and-pad: min(tokens, ⌈tokens·k·cf/E⌉), at least 1 — Megatron-core's
/// get_capacity of tokens·k choices, core/models/moe's `capacity` (the ceiling of the float64 product).
int64_t expert_capacity(int64_t tokens, int64_t top_k, double capacity_factor, int64_t experts);

/// What is trained and how.
struct Training {
  int64_t global_batch = 0;   ///< samples per optimizer step (all data-parallel replicas)
  int64_t microbatch = 1;     ///< samples per forward/backward on one replica
  std::string recipe = "bf16";      ///< fp32 | bf16 | fp16 | fp8-tensorwise | fp8-rowwise | fp8-blockwise | mxfp8 | nvfp4 | mxfp4
  std::string optimizer = "adam";   ///< adam | sgd-momentum | sgd
  std::string recompute = "selective";  ///< none | selective | full (Korthikanti et al. 2022)
  bool flash_attention = true;  ///< attention as one fused kernel (FlashAttention): no s² scores stored or streamed
  bool fp32_grads = false;    ///< gradients accumulated in fp32 (Megatron's main_grad) rather than in the weights' format
  double tokens = 0;          ///< tokens to train on, for the time-to-train line
  /// Mixture of experts, drop-and-pad (GShard, Switch; Megatron-core's moe_expert_capacity_factor with
  /// moe_pad_expert_input_to_capacity): each expert computes expert_capacity(tokens) rows per
  /// microbatch, layer and rank, tokens = microbatch·s/cp (/t under sequence parallelism) the
  /// tokens that rank routes; choices beyond it are dropped, empty rows padded. Unused when dense.
  double capacity_factor = 1.25;
};

/// How the devices are used. Ranks are ordered tp fastest, then dp, then pp (Megatron-LM's order).
struct Layout {
  int64_t dp = 1, tp = 1, pp = 1;
  int64_t virtual_stages = 1;  ///< model chunks per pipeline stage (interleaved 1F1B: v >= 2; ZB-V: 2)
  bool sequence_parallel = false;  ///< Korthikanti et al. 2022: norms and dropout split along the sequence
  int zero = 0;                ///< ZeRO stage 0-3 over the data-parallel group (Rajbhandari et al. 2020)
  std::string schedule = "1f1b";   ///< a core/pipeline schedule name
  bool overlap_dp = true;      ///< the gradient reduction overlaps the last microbatch's backward
  /// TP collectives overlapped with the GEMMs beside them (Transformer Engine's userbuffers,
  /// Megatron-core / NeMo's tp_comm_overlap: the all-gather and reduce-scatter split into chunks
  /// pipelined with the column- and row-parallel GEMMs): per microbatch only what exceeds its
  /// forward's (backward's) compute is exposed. Off: every TP collective waits (Megatron-LM 2021).
  bool overlap_tp = false;
  /// Megatron-LM's 2021 scatter/gather of pipeline messages (Narayanan et al. 2021 §4.1): each TP
  /// rank sends 1/t of the activation and the receiver all-gathers it over TP. Megatron-core since
  /// 23.04 sends the whole activation from every TP rank (1/t of it with SP, which splits it already).
  bool pp_scatter_gather = false;
  /// Context parallelism (core/parallel/cp; Megatron-core's context_parallel_size): each sequence
  /// split over cp ranks (between TP and DP in the rank order), whose attention reaches the other
  /// ranks' keys by `cp_attention`: "ring" (K/V passed around, Liu et al. 2023), "all_gather"
  /// (Llama 3) or "ulysses" (all-to-all, Jacobs et al. 2023). The gradients are reduced, and ZeRO
  /// shards, over the dp·cp ranks (Megatron's data-parallel group with context parallelism).
  int64_t cp = 1;
  std::string cp_attention = "ring";
  /// Expert parallelism (core/parallel/ep; Megatron-core's expert_model_parallel_size): the E
  /// experts of every block split over ep ranks carved out of the dp data-parallel ones (ep
  /// divides dp and E: no devices of its own), each holding E/ep experts (their tensor
  /// parallelism = tp, Megatron-core's default expert_tensor_parallel_size) and reaching the
  /// others by all-to-all. The experts' gradients are reduced, and ZeRO shards them, over the
  /// expert-data-parallel group of dp·cp/ep ranks holding the same experts.
  int64_t ep = 1;
  /// Uneven pipeline stages, Megatron-core's num_layers_in_first_pipeline_stage and
  /// num_layers_in_last_pipeline_stage: the transformer layers of the first and of the last stage
  /// (0: an even share); the stages between share the rest evenly. Megatron-core's rules: each set
  /// count >= 1 and a multiple of virtual_stages, the middle stages' share whole, >= 1 layer and a
  /// multiple of virtual_stages, no middle layers without middle stages (pp = 2: the two sum to L).
  int64_t first_stage_layers = 0, last_stage_layers = 0;
  /// Megatron-core's account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split:
  /// the embedding (the output head and loss) counted as one more layer of the first (last) stage
  /// when the L layers are split, (L + 1 + 1)/pp per stage: Llama 3 405B's 126 + 2 on 16 stages,
  /// BLOOM's Megatron-DeepSpeed `--pp-partition-method type:transformer|embedding` (70 + 2 on 12).
  bool account_for_embedding = false, account_for_loss = false;
  /// Whether the stages hold different numbers of layers (any of the four keys above is set).
  bool uneven() const {
    return first_stage_layers != 0 || last_stage_layers != 0 || account_for_embedding || account_for_loss;
  }
  /// Devices of the layout: dp·cp·tp·pp (ep lies inside dp).
  int64_t devices() const { return dp * cp * tp * pp; }
};

/// Bus bandwidth (nccl-tests' busbw, bytes/s) and latency (s) of one collective on one link.
struct Collective {
  double busbw = 0;
  double latency_s = 0;
};
/// The collectives of one kind of link (within a node, or across nodes). all_to_all's busbw is
/// nccl-tests' alltoall_perf's: the per-rank buffer × (n − 1)/n / time.
struct Link {
  Collective all_reduce, all_gather, reduce_scatter, send_recv, all_to_all;
};
/// A machine: configs/systems/<name>.json.
struct System {
  std::string name;
  int64_t devices_per_node = 0;
  double memory_bytes = 0;       ///< per device
  double reserved_bytes = 0;     ///< per device: CUDA context, library workspaces, allocator slack
  double peak_fp32 = 0, peak_bf16 = 0, peak_fp16 = 0, peak_fp8 = 0;  ///< dense FLOP/s per device (0: none)
  double peak_fp4 = 0;  ///< dense FP4 FLOP/s per device (nvfp4, mxfp4); 0: none (peak_tflops.fp4 optional)
  double gemm_efficiency = 0;    ///< fraction of the peak that the model's GEMMs reach, one per system
  /// Elementwise kernels (norms, activations, dropout, residual adds, softmax) stream their
  /// tensors through memory at this bandwidth: passes x elements x bytes / memory_bandwidth.
  double memory_bandwidth = 0;   ///< bytes/s per device (the optimizer step is bound by it)
  Link intra, inter;
  /// Measured GEMM rates by size, per format ("fp32", "bf16", "fp16"; "fp8" for the fp8 recipes, "fp4" for nvfp4 and mxfp4): (N, FLOP/s) of an N×N×N
  /// product, N ascending (`mpt plan --calibrate` times them). Empty for a format: its GEMMs run at
  /// peak × gemm_efficiency whatever their size (the shipped GPU systems, whose layers are large).
  std::map<std::string, std::vector<std::pair<double, double>>> gemm_rates;
  /// Host time per operator a training step dispatches (dispatch, autograd's bookkeeping), seconds;
  /// 0: not modelled (a GPU's launches queue ahead of kernels longer than a launch). Calibrated on
  /// tiny MLP steps of two depths, whose GEMMs and passes take next to nothing (`mpt plan --calibrate`).
  double op_overhead_s = 0;
  /// Host time per forward and backward pass beside its operators' (autograd's graph task, the
  /// loss read back), seconds; 0: not modelled. Calibrated with op_overhead_s.
  double pass_overhead_s = 0;
  /// Peak FLOP/s of `recipe`'s GEMMs; 0 when the system has none.
  double peak_for(const std::string& recipe) const;
  /// Seconds of one m×k by k×n GEMM (2mnk FLOPs) in `recipe`'s format: at the measured rate of an
  /// N³ product with the same FLOPs (N = ∛(mnk)), interpolated log-log between the measured sizes,
  /// the smallest size's rate below them and peak × gemm_efficiency above; peak × gemm_efficiency
  /// where the format has no measured rates. The roofline's compute side with the measured
  /// efficiency of small products (Williams et al. 2009; the size dependence as Calculon's tables).
  double gemm_seconds(const std::string& recipe, double m, double n, double k) const;
  /// The measured GEMM rates of `recipe`'s format (fp32, bf16, fp16; fp8 for the fp8 recipes, fp4
  /// for nvfp4 and mxfp4); empty when the system measured none.
  const std::vector<std::pair<double, double>>& rates_for(const std::string& recipe) const;
};
/// Reads a system from its JSON (`source` names the file in messages). Throws mpt::ConfigError
/// naming the file and the JSON path of a missing, mistyped or non-positive field.
System parse_system(const nlohmann::json& j, const std::string& source);

/// Bytes per device of the model states of `params` parameters (ZeRO's 2Ψ + 2Ψ + KΨ for mixed
/// precision with Adam, K = 12: fp32 master weights, m and v; Rajbhandari et al. 2020, §3.1 and
/// Figure 1), each split over the `dp` data-parallel ranks from the ZeRO stage that shards it:
/// optimizer states and master weights from stage 1 (P_os), gradients from 2 (P_os+g), weights
/// at 3 (P_os+g+p). fp32 recipes keep no master copy and 4-byte gradients; Training::fp32_grads
/// makes the gradients 4 bytes (Megatron-LM's main_grad).
struct ModelStates {
  double weights = 0, gradients = 0, master = 0, optimizer = 0;
  double total() const { return weights + gradients + master + optimizer; }
};
ModelStates model_states(double params, const Training& t, int zero, int64_t dp);

/// One term of an estimate.
struct Term {
  std::string name;      ///< "weights", "tp collectives", ...
  double value = 0;      ///< bytes or seconds
  std::string formula;   ///< how it is computed, with its source
};

/// One kind of collective on one process group, per step, on the device whose time is modelled
/// (the last pipeline stage's; under ZB-V rank 0, which runs the first and the last chunk): payload as nccl-tests' "size" and mpt's dist::Group counters
/// count it (the all-reduce's buffer, the all-gather's output, the reduce-scatter's input, the
/// all-to-all's input, a send's message).
struct CommTerm {
  std::string group;       ///< "tp", "cp", "pp", "dp", "ep" (experts' all-to-alls), "edp" (the experts'
                           ///< gradients over the expert-data-parallel group) or "embedding" (tied weights)
  std::string collective;  ///< "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send" or "recv"
  double calls = 0;        ///< per step
  double bytes = 0;        ///< payload per step, summed over the calls
  double seconds = 0;      ///< latency per call + payload x the ring's factor / busbw, before any overlap
  std::string formula;     ///< where the calls come from
};

/// Memory and time of one layout.
struct Estimate {
  std::vector<Term> memory;   ///< bytes per device on the stage that needs most
  double memory_bytes = 0;    ///< their sum
  std::string stage;          ///< which stage that is: "first", "middle" (uneven stages), "last" or "only"
  bool fits = false;          ///< memory_bytes <= the system's memory
  std::vector<CommTerm> comm; ///< every collective of a step on the modelled device (the time terms use them)
  std::string comm_device;    ///< that device: "only stage", "last stage" or ZB-V's "first stage (...)"; with
                              ///< uneven stages the slowest stage's ("first stage", "middle stage", "last stage")
  std::vector<Term> time;     ///< seconds per step on the critical path
  double step_s = 0;
  double bubble_fraction = 0; ///< pipeline idle time / pipeline time
  double model_flops = 0;     ///< per step, all devices: 3 passes of the forward (no recompute)
  double hardware_flops = 0;  ///< with the recompute (Narayanan et al. 2021, eq. 3 counts these)
  double tokens_per_s = 0;
  double mfu = 0;             ///< model_flops / (step_s · devices · peak)
  double flops_per_device = 0;  ///< hardware_flops / (step_s · devices): "achieved FLOP/s per GPU"
  double time_to_train_s = 0; ///< Training::tokens / tokens_per_s
  int64_t microbatches = 0;   ///< per replica per step
  /// A mixture of experts per microbatch, layer and rank (empty when dense): "tokens routed",
  /// "capacity", "expert rows" (E·cap), "padding" (the share of E·cap no token fills when every
  /// choice is kept), "dropped fraction, at least" 1 − E·cap/(tokens·k) and "dropped fraction, at
  /// most" 1 − cap/tokens (every token on the same k experts).
  std::vector<Term> moe;
  /// An MLP's pipeline stages, first to last (empty for a transformer): its layers differ in width,
  /// so every stage is planned and `memory` is the one that needs most.
  struct Stage {
    int64_t stage = 0;          ///< 0 .. pp − 1
    std::string layers;         ///< its Linear layers (0-based, as "2-3"; several chunks: "1, 5")
    double params = 0;          ///< parameters on the stage
    double per_microbatch = 0;  ///< activation bytes of one microbatch through the stage's largest chunk
    int held = 0;               ///< (microbatch, chunk) pairs the stage holds at its peak (the schedule replayed)
    double activations = 0;     ///< per_microbatch × held, bytes
    double memory = 0;          ///< every memory term of the stage, bytes
    double forward_flops = 0;   ///< GEMM FLOPs of one microbatch's forward through the stage
  };
  std::vector<Stage> stages;
};

/// The transformer layers of each pipeline stage, first to last (pp entries, summing to m.layers):
/// L/pp each, or the uneven split of Layout::first_stage_layers / last_stage_layers or
/// account_for_embedding / account_for_loss (Megatron-core's; docs/plan.md, "Uneven stages").
/// Requires a layout layout_error accepts; throws std::invalid_argument when the layers do not split.
std::vector<int64_t> stage_layers(const ModelShape& m, const Layout& l);

/// "" when `layout` can run `m` with `t`, else why not, naming the config keys (heads % tp,
/// kv_heads % tp, layers % (pp·v) or the uneven stages' rules, global_batch % (dp·microbatch), the schedule's own rules; with
/// experts k in [1, E], a capacity factor > 0, ep dividing dp and E; ep > 1 only with experts).
std::string layout_error(const ModelShape& m, const Training& t, const Layout& l);

/// The estimate of `layout` (valid: layout_error is ""). Memory per term (docs/plan.md):
/// weights, gradients, master weights and optimizer states (ZeRO's 2Ψ + 2Ψ + KΨ split over the
/// stages, TP ranks and, per ZeRO stage, the DP group), fp8 / fp4 weight copies and their scales
/// (detail::weight_copy_bytes per block matrix), activations per layer
/// (Korthikanti et al. 2022, Table 2, generalised to the shape) times the layers of a chunk times
/// the (microbatch, chunk) pairs the schedule holds (core/pipeline's peak bound), the logits,
/// communication buffers and the system's reserve. Time: GEMM FLOPs at the system's peak times
/// its efficiency, TP collectives per layer, pipeline send/recv, the schedule's idle time
/// (bubble_time_theory), the exposed DP/ZeRO collectives and the optimizer's memory traffic.
/// With experts: the E/ep experts' model states on their own rows ("expert weights", ...; ZeRO
/// and the gradient reduction over the dp·cp/ep expert-data-parallel ranks), the MoE layer's
/// activations and GEMMs on the E·cap padded rows, 4 all-to-alls of the [E, cap, h] buffer per
/// layer and microbatch over ep ranks (group "ep"), and `moe`'s routing bounds.
/// Throws std::invalid_argument when the system has no peak for the recipe's format.
Estimate estimate(const ModelShape& m, const Training& t, const Layout& l, const System& s);

/// An MLP's layouts (ModelShape::widths; layout_error calls it): "" or why not, naming the keys:
/// at least one layer, dp and pp only (tp, cp, ep 1; the transformer's uneven-stage keys unset), the
/// L layers a multiple of pp·v, the global batch of dp·microbatch, the schedule's own rules.
std::string mlp_layout_error(const ModelShape& m, const Training& t, const Layout& l);

/// Activation bytes one microbatch of `microbatch` samples leaves for the backward in layers
/// [begin, end) of an MLP (0-based Linear layers), what autograd keeps for Linear + ReLU: every
/// Linear's input (addmm's mat1), the ReLU output of the range's last layer (ReLU keeps its result;
/// the next stage keeps its own copy as its input), with dropout each ReLU output and a 1-byte mask
/// (Korthikanti et al. 2022's count), and on the last layer the fp32 loss input 4·b·w_L (the
/// GPT's logits). Elements of 4 bytes (fp32) or 2 (the other recipes). Full recompute keeps only
/// each layer's input (Chen et al. 2016 with one layer per segment; selective recompute drops
/// attention scores, which an MLP has none of: as none). Throws std::invalid_argument for a range
/// outside the model.
double mlp_activation_bytes(const ModelShape& m, const Training& t, int64_t microbatch, int64_t begin, int64_t end);

/// The estimate of an MLP layout (estimate calls it; mlp_layout_error is ""): every pipeline stage
/// planned (Estimate::stages) with its own layers' parameters and activations × the pairs the
/// schedule holds there, `memory` the stage that needs most; time from the slowest stage's GEMM
/// FLOPs (2·Σ w_k·w_k+1 per sample forward, backward twice) and ReLU (dropout) passes, the bubble at
/// its F and B, its pipeline messages (b·w_k elements at each of its boundaries), the DP / ZeRO
/// collectives of its parameters (the loss's 8 B where it holds the loss) and the optimizer's memory
/// traffic, as for the GPT; of equally slow stages the later is modelled (ZB-V: rank 0).
/// Throws std::invalid_argument when the system has no peak for the recipe's format.
Estimate estimate_mlp(const ModelShape& m, const Training& t, const Layout& l, const System& s);

/// Operators one microbatch dispatches through MLP layers [begin, end) (0-based Linear layers), as
/// LibTorch runs core/models/mlp's step: forward addmm per layer, ReLU (and dropout's mask and
/// multiply) after each hidden one, cross entropy (log_softmax, nll_loss) and the loss's scaling on
/// the last; backward the weight and input gradients (no input gradient for layer 0, whose input
/// needs none), the bias's sum, ReLU's (dropout's) backward and the loss's three. Full recompute
/// runs the forward's again. These × System::op_overhead_s are the step's dispatch time.
/// Throws std::invalid_argument for a range outside the model.
struct MlpOperators {
  double forward = 0, backward = 0;  ///< operators per microbatch
  double gemm_forward_s = 0, gemm_backward_s = 0;  ///< their GEMMs' time by System::gemm_seconds
};
MlpOperators mlp_operators(const ModelShape& m, const Training& t, int64_t microbatch, int64_t begin, int64_t end,
                           const System& s);

/// One layout the search tried.
struct Candidate {
  Layout layout;
  Training training;   ///< the searched microbatch and recompute
  Estimate est;
  std::string rejected;  ///< "" when it fits; else why not (does not divide; memory, by how much)
};
/// Every layout of `devices` devices: dp·tp·pp = devices, tp a divisor of the heads and within
/// a node, microbatch 1, 2, 4, 8 (dividing the replica's batch), ZeRO 0-3, recompute none,
/// selective, full, and with experts every ep dividing dp and E (else ep = 1); the schedule,
/// virtual stages, sequence parallelism and overlap of `base`; cp = 1 and even stages (the uneven
/// keys of `base` are not read).
/// Sorted: fitting layouts by step time, then the rest by how far they miss.
std::vector<Candidate> search(const ModelShape& m, const Training& t, const Layout& base, const System& s,
                              int64_t devices);

}  // namespace mpt::plan
