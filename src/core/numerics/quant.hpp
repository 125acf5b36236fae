// Low-precision quantizers, bit-exact with PyTorch's casts and torchao's reference quantizers,
// implemented by mpt itself (integer operations on the fp32 bit pattern; no float8 dtype is
// used, so the same code runs on Debian's LibTorch 1.13, which has none). docs/fp8.md has
// the formats, the rules and where PyTorch, torchao and the OCP specs differ.
//
//   element formats  E4M3 (fn: no inf), E5M2, E2M3, E3M2, E2M1; E8M0 as a cast too
//   rounding         to nearest, ties to even; stochastic (seeded, reproducible)
//   scale formats    fp32 (torchao float8: fp8_max / amax), E8M0 (MX; FLOOR, CEIL, EVEN, RCEIL),
//                    UE4M3 (NVFP4, optionally under an fp32 tensor scale)
//   granularity      one block quantizer, block shape as data: tensor, row, 1x128, 128x128,
//                    1x32, 1x16, 16x16, ...
//   16x16 random Hadamard transform; a GEMM with a limited-precision accumulator and
//   promotion to fp32 every N_C elements; a quantized linear layer (all three GEMMs) with a
//   ledger per GEMM and step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace mpt::quant {

// ───────────────────────────── element formats ─────────────────────────────

/// Element formats. FP32 is the identity (no quantization), so a recipe can leave an operand
/// in fp32. E8M0 is the MX scale format (exponent only) exposed as an element cast.
/// BF16 is the baseline of the fp8 recipes (torch.autocast's bf16 GEMM operands): a plain round
/// to nearest even to bfloat16 (torch's .to(torch.bfloat16)), no scale and no 8-bit code.
enum class Element { FP32, E4M3, E5M2, E2M3, E3M2, E2M1, E8M0, BF16 };

/// Facts about an element format (OCP 8-bit FP spec 2023 for E4M3/E5M2, OCP MX v1.0 §5.3
/// for E2M3/E3M2/E2M1 and §5.4.1 for E8M0). Values equal torch.finfo where torch has the dtype.
struct ElementInfo {
  Element element;
  std::string name;      ///< "e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "e8m0", "fp32", "bf16"
  int bits;              ///< total bits of a code (sign included where the format has one)
  int exponent_bits;
  int mantissa_bits;     ///< stored fraction bits
  int emin;              ///< exponent of the smallest normal: 1 − bias
  double max;            ///< largest finite value
  double min_subnormal;  ///< smallest positive value: 2^(emin − mantissa_bits)
  bool has_inf;          ///< only E5M2 (and fp32)
  bool has_nan;          ///< E4M3 (S.1111.111), E5M2, E8M0 (0xFF); not E2M3/E3M2/E2M1
};
/// Facts about `e`.
const ElementInfo& element_info(Element e);
/// Parses "fp32" | "e4m3" | "e5m2" | "e2m3" | "e3m2" | "e2m1" | "e8m0" | "bf16"; throws std::invalid_argument.
Element parse_element(const std::string& name);

/// Rounding of an element cast.
/// NearestEven  IEEE 754 round to nearest, ties to even (PyTorch's casts, torchao).
/// Stochastic   round away from zero with probability (|x| − lo)/(hi − lo), i.e. add uniform
///              random bits below the target's last place and truncate (torchao's
///              `_fp32_to_bf16_sr`, TE's and the NVFP4 paper's SR); the random bits come from
///              SplitMix64(seed, flat element index), so a run is reproducible and independent
///              of threading.
enum class Rounding { NearestEven, Stochastic };

/// What a finite value beyond the format's max (after rounding), or an infinity, becomes.
/// Saturate       ±max (an inf input stays inf where the format has inf).
/// NonSaturating  ±inf where the format has inf, NaN otherwise (OCP's non-saturating mode;
///                PyTorch ≤ 2.11's fp32→float8_e4m3fn cast). Not allowed for E2M3/E3M2/E2M1,
///                which have neither inf nor NaN.
enum class Overflow { Saturate, NonSaturating };
/// PyTorch 2.15's fp32 cast rule for `e`: E4M3 saturates (inf too: torch.float8_e4m3fn(inf) = 448),
/// E5M2 is non-saturating (65536 and above → inf); E2M3/E3M2/E2M1 saturate (torchao).
Overflow default_overflow(Element e);

/// Options of an element cast. The default is PyTorch's cast of the format.
struct CastOptions {
  Rounding rounding = Rounding::NearestEven;
  std::optional<Overflow> overflow;  ///< unset: default_overflow(e)
  std::uint64_t seed = 0;   ///< stochastic rounding only
};

/// The code of fp32 value `x` in format `e` (sign in the top bit of the `bits`-wide code):
/// bit-exact with PyTorch 2.15's fp32 → float8_e4m3fn / float8_e5m2 / float8_e8m0fnu casts and
/// torchao's f32_to_f6_e2m3 / f6_e3m2 / f4 unpacked casts. `random_bits` is used only for
/// stochastic rounding. E8M0 follows torch's float8_e8m0fnu cast: the sign is dropped, the
/// exponent is rounded to nearest even on the fp32 mantissa bits, inf/NaN → 0xFF (NaN).
/// FP32 and BF16 are not 8-bit code formats: throws std::invalid_argument.
std::uint8_t encode_value(float x, Element e, const CastOptions& opt = {}, std::uint64_t random_bits = 0);
/// The value of code `c` in format `e` (NaN codes → NaN; E8M0 0 → 2^−127, 0xFF → NaN).
float decode_value(std::uint8_t c, Element e);

/// Codes (uint8, same shape, on the CPU) of a floating tensor cast to `e` (x is first cast to fp32).
torch::Tensor encode(const torch::Tensor& x, Element e, const CastOptions& opt = {});
/// fp32 values (same shape, on the CPU) of a uint8 code tensor in format `e`.
torch::Tensor decode(const torch::Tensor& codes, Element e);
/// Quantize-dequantize: decode(encode(x)) as fp32, same shape. FP32 returns x as fp32; BF16 returns
/// x.to(bfloat16).to(float32) (round to nearest even, overflow to inf), or with Rounding::Stochastic
/// round_bf16_stochastic(x, opt.seed).
torch::Tensor cast(const torch::Tensor& x, Element e, const CastOptions& opt = {});

/// fp32 → bf16 with stochastic rounding, as fp32 values (same shape, on x's device via the CPU):
/// the low 16 bits r of SplitMix64(seed, flat index i) are added to the fp32 bit pattern and the
/// low 16 bits dropped, (bits + r) & 0xFFFF0000 — rounds away from zero with probability
/// (|x| − lo)/(hi − lo), so E[SR(x)] = x (Zamirai et al. 2020, "Revisiting BFloat16 Training";
/// the form of torchao's `_fp32_to_bf16_sr` alternative and OneTrainer's copy_stochastic_).
/// Values already in bf16 are unchanged; ±inf and NaN pass through; a finite value within one
/// bf16 ulp of the largest bf16 can round up to inf. Reproducible and independent of threading.
torch::Tensor round_bf16_stochastic(const torch::Tensor& x, std::uint64_t seed);

/// A seed for a sub-stream `stream` of `seed` (SplitMix64 of both): e.g. one per (step, tensor)
/// of stochastic rounding, so that no two tensors of a run draw the same bits.
std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream);

// ───────────────────────────── block scaling ─────────────────────────────

/// Scale format of a block quantizer.
/// FP32   torchao float8 (`amax_to_scale`): s = fp8_max / max(amax, 1e−12) in float64, stored as
///        fp32 (optionally rounded down to a power of two); q = cast(clamp(x·s, ±max)); x̂ = q / s.
///        DeepSeek-V3's 1x128 / 128x128 blocks use this with block amax (TE fp8 blockwise).
/// E8M0   MX (OCP MX v1.0 §6.3; torchao `to_mx`): a power of two chosen by an E8M0Rule; q = cast(x / 2^e);
///        x̂ = q · 2^e.
/// UE4M3  NVFP4 (torchao `nvfp4_quantize`): block scale amax / elem_max, clamped to [2^−6, 448] and
///        cast to E4M3; optionally under an fp32 tensor scale amax_tensor / (448 · elem_max).
enum class ScaleFormat { FP32, E8M0, UE4M3 };

/// How an E8M0 block exponent comes from the block amax (torchao ScaleCalculationMode):
/// FLOOR  floor(log2 amax) − emax_elem (OCP MX v1.0 §6.3; can clip the block max)
/// CEIL   as FLOOR, plus one when amax's fp32 mantissa is nonzero
/// EVEN   amax rounded at the element's mantissa width first, then FLOOR
/// RCEIL  torchao's eager `_to_mx_rceil`: clamp(ceil(log2f(amax / elem_max)), −127, 127) with an fp32
///        log2, so a descale just above a power of two 2^k with |k| >= 4 can get 2^k (log2f rounds
///        to the integer) where the exact ceiling is 2^(k+1); the element then clips at ±elem_max.
/// RCEIL_EXACT  the exact ceiling of log2(amax / elem_max) from the fp32 bits (round toward +inf:
///        cuBLAS / TE / `cvt.rp.satfinite.ue8m0x2.f32`, torchao's compiled path on sm_100): never clips.
enum class E8M0Rule { FLOOR, CEIL, EVEN, RCEIL, RCEIL_EXACT };

/// Block shape over a 2-D view [rows, cols] of the tensor (leading dims merged into rows,
/// the last dim is cols). 0 means the whole dimension: {0,0} per tensor, {1,0} per row,
/// {1,128} 1x128 tiles, {128,128} blocks, {1,32} MX, {1,16} / {16,16} NVFP4.
struct BlockShape {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
};
/// "tensor", "row", or "RxC".
std::string block_name(BlockShape b);

/// How one operand is quantized.
struct QuantSpec {
  Element element = Element::FP32;
  BlockShape block{};
  ScaleFormat scale = ScaleFormat::FP32;
  E8M0Rule rule = E8M0Rule::FLOOR;  ///< E8M0 only
  bool pow2_scale = false;          ///< FP32 only: round the scale down to a power of two as torchao's eager
                                    ///< exp2(floor(log2 s)) does (fp32 log2: s just below 2^k gives 2^k)
  bool tensor_scale = false;        ///< UE4M3 only: two-level NVFP4 scaling
  double static_scale = 0;          ///< FP32 only: > 0 uses this s (x·s is cast) for every block instead of
                                    ///< fp8_max / amax: delayed scaling (TE DelayedScaling) sets it from the
                                    ///< amax history; 0 = current scaling from this tensor's own amax
  Rounding rounding = Rounding::NearestEven;
  std::uint64_t seed = 0;           ///< stochastic rounding
};

/// A quantized tensor and what the quantization did.
struct Quantized {
  torch::Tensor values;       ///< fp32, the input's shape: the dequantized tensor a GEMM sees
  torch::Tensor codes;        ///< uint8 element codes, the input's shape, on the CPU (undefined for FP32)
  torch::Tensor scale;        ///< fp32 [row blocks, col blocks]: x ≈ q · scale (for FP32 scales 1/s)
  torch::Tensor scale_codes;  ///< uint8 [row blocks, col blocks] for E8M0 / UE4M3 (undefined for FP32)
  double tensor_scale = 1.0;  ///< UE4M3 with tensor_scale: the fp32 second-level scale
  double amax = 0.0;          ///< max |x| over the tensor (NaN if any element is NaN)
  std::int64_t numel = 0;
  std::int64_t saturated = 0; ///< elements with |x / scale| beyond the element max (clamped)
  std::int64_t flushed = 0;   ///< nonzero elements that became zero
  std::int64_t blocks = 0;           ///< scale blocks (row blocks · col blocks)
  std::int64_t saturated_blocks = 0; ///< blocks with at least one saturated element
};

/// Quantizes floating tensor `x` (any shape, at least 1-D; viewed as [numel/last, last]) per `spec`.
/// BF16 elements: x rounded to bfloat16 (saturated counts finite values that became inf).
/// Bit-exact with torchao 0.18: `to_mx` (E8M0), `nvfp4_quantize` (UE4M3), `hp_tensor_and_scale_to_float8`
/// with `amax_to_scale` (FP32), on blocks of any shape. Throws std::invalid_argument when a block
/// dimension does not divide the tensor's (naming both), or for an unsupported combination.
Quantized quantize(const torch::Tensor& x, const QuantSpec& spec);

/// The 16x16 randomized Hadamard transform along the last dimension (NVFP4 paper, arXiv 2509.25149
/// §4.2; Transformer Engine's RHT for Wgrad inputs): every 16 consecutive elements v become T·v with
/// T = H16 · diag(signs) / 4 (H16 the Sylvester Hadamard matrix, signs ±1 from SplitMix64(seed)).
/// T is orthogonal, so rht16(A)·rht16(B)ᵀ = A·Bᵀ in exact arithmetic. x: fp32 [..., K], K % 16 == 0
/// (else std::invalid_argument). Returns fp32, same shape.
torch::Tensor rht16(const torch::Tensor& x, std::uint64_t seed);
/// The 16x16 matrix T of rht16 (fp32).
torch::Tensor rht16_matrix(std::uint64_t seed);

// ───────────────────────────── GEMM and accumulation ─────────────────────────────

/// The accumulator of a GEMM. significand_bits = 0: fp32 (the product is one torch mm).
/// Otherwise the model of a limited-precision Tensor Core accumulator (DeepSeek-V3 §3.3.2, arXiv
/// 2412.19437: H800 FP8 GEMMs keep about 14 bits; fix: copy the partial sum to an fp32 register
/// every N_C = 128 elements): products of `chunk` consecutive k are summed in fp32 (Fasi et al.
/// 2021, "Numerical behavior of NVIDIA tensor cores": groups of 4 on V100), added to the
/// accumulator, and the sum is truncated (round toward zero) to `significand_bits` significant
/// bits. promote_every = N_C > 0: the accumulator is added into an fp32 sum and cleared every
/// N_C elements of k (N_C a multiple of chunk).
struct Accumulator {
  int significand_bits = 0;
  int chunk = 4;
  int promote_every = 0;
};

/// C = A · Btᵀ with A fp32 [m, k], Bt fp32 [n, k], accumulated per `acc`. Throws
/// std::invalid_argument on mismatched k or an invalid accumulator.
torch::Tensor gemm(const torch::Tensor& a, const torch::Tensor& bt, const Accumulator& acc);
/// Truncates fp32 tensor `x` toward zero to `bits` significant bits (1..24; 24 is the identity).
torch::Tensor truncate_significand(const torch::Tensor& x, int bits);

// ───────────────────────────── quantized linear layer ─────────────────────────────

/// One GEMM of a linear layer: both operands as [*, k] ("k-major": the reduction dimension last),
/// C = A · Btᵀ. out: A = x [M,K], Bt = W [N,K]; dgrad: A = dy [M,N], Bt = Wᵀ [K,N];
/// wgrad: A = dyᵀ [N,M], Bt = xᵀ [K,M]. So a block {1,128} of wgrad's A is a 128x1 block of dy.
struct GemmRecipe {
  QuantSpec a;
  QuantSpec b;
  bool rht = false;     ///< 16x16 RHT of both operands along k before quantizing (NVFP4: wgrad)
  Accumulator acc;
};

/// The three GEMMs of a linear layer. Defaults: everything fp32 (equals torch::linear).
struct QuantRecipe {
  std::string name = "fp32";
  GemmRecipe out, dgrad, wgrad;
  std::uint64_t seed = 0;  ///< stochastic rounding and RHT seeds derive from it, the step and the GEMM
};
/// Block sizes and gradient format of the named recipes (defaults: the published recipes).
struct RecipeOptions {
  std::int64_t tile = 128;          ///< blockwise: activation and gradient tiles 1 x tile (DeepSeek-V3: 128)
  std::int64_t weight_block = 128;  ///< blockwise: weight blocks weight_block x weight_block (DeepSeek-V3: 128)
  std::int64_t mx_block = 32;       ///< mxfp8 / mxfp8_floor / mxfp4: 1 x mx_block blocks (OCP MX v1.0: 32)
  /// The element of the gradient operands (dy in dgrad and wgrad): unset = the recipe's own
  /// (tensorwise E5M2, the others E4M3); E4M3 = "e4m3 everywhere", E5M2 = TE's HYBRID format.
  std::optional<Element> grad_element;
};
/// Named recipes: "fp32"; "bf16" (every GEMM operand cast to bf16, fp32 accumulation: autocast); "tensorwise" (torchao float8: E4M3 x and W, E5M2 dy, fp32 tensor scales);
/// "rowwise" (E4M3, per-row power-of-two scales, torchao ROWWISE); "blockwise" (DeepSeek-V3: 1x128
/// activation / gradient tiles, 128x128 weight blocks, E4M3, fp32 scales); "mxfp8" (E4M3, 1x32,
/// E8M0 RCEIL); "mxfp8_floor" (same, FLOOR); "nvfp4" (E2M1, 1x16 with UE4M3 scales and an fp32
/// tensor scale, 16x16 weight blocks, SR on dy, RHT on wgrad; NVFP4 paper); "mxfp4" (E2M1, 1x32, E8M0 FLOOR:
/// OCP MX v1.0). Throws
/// std::invalid_argument for another name.
QuantRecipe recipe(const std::string& name, const RecipeOptions& options = {});
/// The names recipe() accepts, in a stable order.
const std::vector<std::string>& recipe_names();

/// Why a linear layer of `m` samples, `k` inputs and `n` outputs cannot run under `r`: the first GEMM
/// operand (shapes as GemmRecipe) whose dimensions a block does not divide, as
/// "dgrad operand B (W^T [k, n]): block 1x128 does not divide ..."; "" when every block divides.
std::string shape_error(const QuantRecipe& r, std::int64_t m, std::int64_t k, std::int64_t n);

/// Bytes a linear layer [n, k] (with bias) of a training step on m samples keeps under `r`, counted
/// at the formats' own widths (emulation holds fp32 tensors; a real kernel stores the narrow codes).
/// weights: the fp32 master W and b plus the quantized copies of W the GEMMs read (out's B, and
///          dgrad's B when its blocks differ from out's under transposition: rowwise and MX keep a
///          row-wise and a column-wise copy, as TE's MXFP8 tensors do);
/// activations: x saved for the weight gradient, in wgrad's B format;
/// gradients: the fp32 weight and bias gradients;
/// scales: the scale values of every stored quantized tensor (fp32: 4 bytes, E8M0 / UE4M3: 1, plus 4
///         for an NVFP4 tensor scale).
struct StoredBytes {
  std::int64_t weights = 0, activations = 0, gradients = 0, scales = 0;
};
StoredBytes stored_bytes(const QuantRecipe& r, std::int64_t m, std::int64_t k, std::int64_t n);

/// stored_bytes measured instead of counted: every tensor stored_bytes counts is allocated on the
/// CPU in LibTorch's own dtype of its format (fp32 masters and gradients kFloat; bf16 kBFloat16;
/// E4M3 kFloat8_e4m3fn, E5M2 kFloat8_e5m2, E2M1 kFloat4_e2m1fn_x2 (two codes a byte); scales:
/// fp32 kFloat, E8M0 kFloat8_e8m0fnu, UE4M3 kFloat8_e4m3fn, an NVFP4 tensor scale one kFloat),
/// and each part is the live bytes core/runtime/memory's counting CPU allocator (install_counting_allocator,
/// called here) reports while those tensors are held, minus the bytes live before. std::nullopt
/// when this LibTorch lacks a dtype the recipe needs (1.13 has none of them; no LibTorch has an
/// FP6 dtype for E2M3 / E3M2). Mirrors TE's Float8Tensor / MXFP8Tensor / NVFP4Tensor storage.
std::optional<StoredBytes> measured_stored_bytes(const QuantRecipe& r, std::int64_t m, std::int64_t k, std::int64_t n);

// ───────────────────────────── delayed scaling ─────────────────────────────

/// How a delayed scale comes from the amax history (TE DelayedScaling.amax_compute_algo).
enum class AmaxComputeAlgo { Max, MostRecent };
/// Parses "max" | "most_recent"; throws std::invalid_argument.
AmaxComputeAlgo parse_amax_compute_algo(const std::string& name);

/// Transformer Engine's DelayedScaling recipe (transformer_engine.common.recipe): each tensor
/// role keeps the amax of its last `amax_history_len` steps; the scale a step uses comes from the
/// history of the steps before it: amax = max(history) or the most recent entry, and
/// scale = (fp8_max / amax) / 2^margin, kept unchanged when amax is 0 or not finite. The scale
/// starts at 1.
struct DelayedScaling {
  std::int64_t amax_history_len = 1024;  ///< TE's default; >= 1
  int margin = 0;                        ///< TE's default
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::Max;
};

/// The fp8 meta of one tensor role (TE's amax_history and scale of an FP8 tensor): history[0]
/// holds this step's amax, history[1..] the earlier ones.
class AmaxHistory {
 public:
  /// fp8_max: the role's element max (448 for E4M3, 57344 for E5M2). Throws std::invalid_argument
  /// for amax_history_len < 1.
  AmaxHistory(const DelayedScaling& recipe, double fp8_max);
  /// The scale this step's quantization uses (x·scale is cast).
  double scale() const { return scale_; }
  /// Records this step's amax (TE writes it into amax_history[0]; a second call in one step keeps the max).
  void record(double amax);
  /// End of step (TE's _compute_amax_and_update_history and _default_sf_compute): amax from the
  /// history, the new scale, then the history rolled by one with slot 0 cleared. In fp32 as TE.
  void update();
  const std::vector<double>& history() const { return history_; }

 private:
  DelayedScaling recipe_;
  double fp8_max_;
  double scale_ = 1.0;
  std::vector<double> history_;
};

/// What one operand's quantization did.
struct OperandLedger {
  double amax = 0;
  double scale_min = 0, scale_max = 0;  ///< over the blocks (x ≈ q · scale)
  double saturated_frac = 0;            ///< fraction of elements clamped at the element max
  double flushed_frac = 0;              ///< fraction of nonzero elements quantized to zero
};
/// One GEMM of one step.
struct GemmLedger {
  std::int64_t step = 0;
  std::string gemm;              ///< "out", "dgrad", "wgrad"
  OperandLedger a, b;
  double rel_error = 0;          ///< ‖C − C_fp32‖_F / ‖C_fp32‖_F (C_fp32: the fp32 GEMM of the unquantized operands)
};
/// Summary of an operand's Quantized.
OperandLedger operand_ledger(const Quantized& q);

/// Quantizes both operands per `r` and multiplies them: C = Q(A) · Q(Bt)ᵀ (shapes as GemmRecipe).
/// If `ledger` is given it is filled (amax, scales, fractions, rel_error; the fp32 reference GEMM
/// is computed only then). `seed` feeds stochastic rounding and the RHT.
torch::Tensor quantized_gemm(const torch::Tensor& a, const torch::Tensor& bt, const GemmRecipe& r,
                             std::uint64_t seed, GemmLedger* ledger = nullptr);

/// A linear layer y = x · Wᵀ + b whose three GEMMs quantize their operands per a QuantRecipe
/// (the torchao Float8Linear / TE Linear structure), as a torch::autograd::Function, so it trains.
/// Each forward appends "out", each backward "dgrad" and "wgrad" to ledger() for the current step
/// (step() counts forwards). The bias and its gradient stay fp32. x: [..., in], W: [out, in].
/// The module must outlive the backward pass of its outputs.
class QuantLinearImpl : public torch::nn::Module {
 public:
  /// Weights initialised as torch::nn::Linear's (kaiming uniform), bias optional.
  QuantLinearImpl(std::int64_t in_features, std::int64_t out_features, QuantRecipe r, bool bias = true);
  torch::Tensor forward(const torch::Tensor& x);
  const std::vector<GemmLedger>& ledger() const { return ledger_; }
  void clear_ledger() { ledger_.clear(); }
  std::int64_t step() const { return step_; }
  const QuantRecipe& recipe() const { return recipe_; }
  torch::Tensor weight, bias;

  // Used by the autograd function.
  QuantRecipe recipe_;
  std::vector<GemmLedger> ledger_;
  std::int64_t step_ = 0;
  bool keep_ledger = true;  ///< false: no ledger (saves the fp32 reference GEMMs)

  /// Switches the per-tensor fp32 scales of the three roles x, W, dy to delayed scaling (TE
  /// DelayedScaling; amax recorded in training mode only). Throws std::invalid_argument unless every
  /// operand of the recipe is per tensor with an fp32 scale (the tensorwise recipe).
  void set_delayed_scaling(const DelayedScaling& d);
  /// End of a training step: every role's scale from its history (AmaxHistory::update). No-op
  /// without delayed scaling.
  void update_scales();
  /// The roles' fp8 meta (x, W, dy), empty without delayed scaling.
  std::vector<AmaxHistory> amax_;
};
TORCH_MODULE(QuantLinear);

/// The functional form: y = x · Wᵀ + b with all three GEMMs quantized per `layer`'s recipe,
/// differentiable in x, W and b (b may be undefined).
torch::Tensor quantized_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                               QuantLinearImpl& layer);

namespace detail {

/// SplitMix64 (Steele, Lea, Flood 2014; the seeding generator of xoshiro): a counter-based
/// generator, so element i's random bits depend only on (seed, i).
inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace detail

}  // namespace mpt::quant
