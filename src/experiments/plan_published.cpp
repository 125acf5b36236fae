// mpt plan, section 5 — the model against published runs (--set published=true). See plan.cpp.
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/io/results.hpp"
#include "experiments/plan_parts.hpp"

namespace mpt::plan_published {

namespace {

namespace pl = mpt::plan;

struct PublishedRow {
  std::string name;      // row id
  std::string source;    // paper, table
  std::string quantity;  // what is compared
  double published = 0;
  double predicted = 0;
  double goal = 0;       // relative error the issue sets
};

std::vector<PublishedRow> zero_figure1() {
  // Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, K = 12, N_d = 64, GB = 1e9 bytes
  pl::Training t;
  t.recipe = "fp16";
  t.optimizer = "adam";
  const double psi = 7.5e9;
  const std::vector<std::pair<std::string, double>> stages = {{"baseline", 120}, {"P_os", 31.4}, {"P_os+g", 16.6}, {"P_os+g+p", 1.9}};
  std::vector<PublishedRow> rows;
  for (int z = 0; z < 4; ++z)
    rows.push_back({"zero_fig1_" + stages[static_cast<std::size_t>(z)].first, "Rajbhandari et al. 2020, Figure 1",
                    "model states per GPU, GB", stages[static_cast<std::size_t>(z)].second,
                    pl::model_states(psi, t, z, 64).total() / 1e9, 0.02});
  return rows;
}

// Narayanan et al. 2021, Table 1 (weak scaling on Selene's A100-80GB, 8 per node, HDR 200 Gb/s per
// GPU): s = 2048, V = 51,200, fp16, full recompute, shared word embeddings; the microbatch, the
// model chunks and the DDP implementation of each row from NVIDIA/Megatron-LM's reproduction
// script (examples/sc21/run_table_1.sh): "torch" DDP overlaps the all-reduce with the backward,
// "local" does not. Achieved TFLOP/s per GPU counts eq. 3's FLOPs (recompute included).
struct MegatronRow {
  const char* name;
  int64_t heads, hidden, layers, t, p, gpus, batch, microbatch, v;
  bool torch_ddp;
  double tflops;
};
const MegatronRow kMegatronTable1[] = {
    {"1.7B", 24, 2304, 24, 1, 1, 32, 512, 16, 1, true, 137},      {"3.6B", 32, 3072, 30, 2, 1, 64, 512, 16, 1, true, 138},
    {"7.5B", 32, 4096, 36, 4, 1, 128, 512, 16, 1, true, 142},     {"18.4B", 48, 6144, 40, 8, 1, 256, 1024, 8, 1, true, 135},
    {"39.1B", 64, 8192, 48, 8, 2, 512, 1536, 4, 1, false, 138},   {"76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 2, 3, false, 140},
    {"145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 2, 2, false, 148}, {"310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 1, 2, false, 155},
    {"529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 1, 3, false, 163}, {"1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 1, 1, false, 163},
};

std::vector<PublishedRow> megatron_table1(const pl::System& a100) {
  std::vector<PublishedRow> rows;
  for (const auto& r : kMegatronTable1) {
    pl::ModelShape m = pl::preset("megatron-1t");
    m.heads = m.kv_heads = r.heads;
    m.hidden = r.hidden;
    m.ffn = 4 * r.hidden;
    m.layers = r.layers;
    pl::Training t;
    t.global_batch = r.batch;
    t.microbatch = r.microbatch;
    t.recipe = "fp16";
    t.recompute = "full";
    t.flash_attention = false;  // 2021: scale-mask-softmax and dropout kernels over the s² scores
    pl::Layout l;
    l.tp = r.t;
    l.pp = r.p;
    l.dp = r.gpus / (r.t * r.p);
    l.virtual_stages = r.v;
    l.schedule = r.v > 1 ? "interleaved-1f1b" : "1f1b";
    l.sequence_parallel = false;
    l.zero = 0;
    l.overlap_dp = r.torch_ddp;
    l.pp_scatter_gather = true;  // the 2021 code's pipeline messages
    const auto e = pl::estimate(m, t, l, a100);
    rows.push_back({std::string("megatron_") + r.name, "Narayanan et al. 2021, Table 1", "TFLOP/s per GPU (eq. 3)", r.tflops,
                    e.flops_per_device / 1e12, 0.10});
  }
  return rows;
}

// Llama 3 405B, Table 4 of "The Llama 3 Herd of Models" (Llama Team, AI @ Meta 2024, §3.3.2), its two
// 8,192-token rows on H100-80GB (Grand Teton: 8 per server, NVLink; RoCE 400 Gb/s per GPU): TP 8,
// CP 1, PP 16, DP 64 / 128, batch size per DP group 32 / 16 sequences (16M tokens per batch),
// 430 / 400 TFLOP/s per GPU (BF16 MFU 43 % / 41 %). From the text: no activation checkpointing at
// 8K tokens; FSDP sharding the optimizer states and gradients, fp32 gradient accumulation and
// reduce-scatter; an interleaved schedule; one layer fewer on the first and the last stage, "the
// first model chunk on the first stage has only the embedding, and the last model chunk on the
// last stage has only output projection and loss calculation" (Megatron-core's
// account_for_embedding/loss_in_pipeline_split: 126 + 2 = 128 = 16 stages x 8 chunks of one layer).
// Assumed (not published): microbatch 1, virtual stages 8 (one layer per chunk, from the sentence
// above), Megatron's interleaved schedule (N = p), sequence parallelism (Korthikanti et al. cited
// for TP), FlashAttention, and the FSDP traffic as ZeRO-1's (one reduce-scatter and one all-gather
// per step, overlapped with the last backward; ZeRO-2 with pp > 1 is refused here).
/// The training of the H100 rows (Llama 3's and NeMo's): `batch` sequences a step, microbatch 1, bf16
/// with fp32 gradient accumulation and reduction (Megatron's main_grad), no recompute, FlashAttention.
pl::Training bf16_fp32_grads(int64_t batch) {
  pl::Training t;
  t.global_batch = batch;
  t.microbatch = 1;
  t.recipe = "bf16";
  t.recompute = "none";
  t.flash_attention = true;
  t.fp32_grads = true;
  return t;
}

struct LlamaRow {
  const char* name;
  int64_t gpus, dp, batch_per_dp;
  double tflops;
};
const LlamaRow kLlamaTable4[] = {{"llama3_405b_8k_gpus", 8192, 64, 32, 430}, {"llama3_405b_16k_gpus", 16384, 128, 16, 400}};

std::vector<PublishedRow> llama3_table4(const pl::System& h100) {
  std::vector<PublishedRow> rows;
  for (const auto& r : kLlamaTable4) {
    const pl::ModelShape m = pl::preset("llama3-405b");  // 126 layers, h 16384, f 53248, 128 heads / 8 K/V
    const pl::Training t = bf16_fp32_grads(r.dp * r.batch_per_dp);  // 2048 sequences of 8192 tokens: 16.8M tokens
    pl::Layout l;
    l.tp = 8;
    l.pp = 16;
    l.dp = r.dp;
    l.cp = 1;
    l.sequence_parallel = true;
    l.zero = 1;
    l.schedule = "interleaved-1f1b";
    l.virtual_stages = 8;
    l.account_for_embedding = l.account_for_loss = true;
    l.overlap_dp = true;
    const auto e = pl::estimate(m, t, l, h100);
    rows.push_back({r.name, "Llama 3 paper, Table 4", "TFLOP/s per GPU (model FLOPs)", r.tflops, e.flops_per_device / 1e12,
                    0.10});
  }
  return rows;
}

// NVIDIA's DGX Cloud benchmarking recipes (NVIDIA/dgxc-benchmarking, tag v25.04.02: llama3.1/README.md
// with NeMo 25.02.01, nemo_megatron/README_175b.md with NeMo 24.12), bf16 on H100-80GB SXM (8 per
// node), the smallest scale of each: each README's table of TP, PP, CP, DP, VP, MBS and GBS and its
// "Throughput in tokens per second" (sequence x GBS / step time; / GPUs here). From the recipes:
// pretrain_llama31.py runs NeMo's pretrain_recipe_*(performance_mode=True) with Transformer Engine's
// userbuffers TP overlap for 70B and 405B (userbuffers_bf16_h100_h8192_tp4 / h16384_tp8_cp2) and no
// activation recompute; gpt3_175b_hydra.yaml: sequence_parallel, ub_tp_comm_overlap, no
// activations_checkpoint_*, distributed_fused_adam with overlap_grad_sync and overlap_param_sync,
// dropout 0.1, vocabulary 50257 padded to a multiple of 128 x TP (50688). Assumed (NeMo's defaults,
// not in the READMEs): the distributed optimizer as ZeRO-1, fp32 gradient reduction (bf16_mixed's
// grad_reduce_in_fp32), sequence parallelism with TP, FlashAttention (Transformer Engine's fused
// attention), the ring for CP (TE's p2p) not overlapped, Megatron's interleaved schedule, tied
// embeddings for GPT-3 (NeMo's share_embeddings_and_output_weights), and for 405B the embedding and
// the loss counted as layers (126 layers only divide into 8 x 8 chunks with them).
struct NemoRow {
  const char* name;
  const char* preset;
  int64_t gpus, tp, pp, cp, vp, batch;
  double tokens_per_s;  // per GPU: the README's throughput / GPUs
  const char* readme;
};
const NemoRow kDgxcH100[] = {
    {"dgxc_llama31_8b", "llama3-8b", 8, 1, 1, 2, 1, 128, 85459.0 / 8, "llama3.1/README.md"},
    {"dgxc_llama31_70b", "llama3-70b", 64, 4, 4, 2, 5, 128, 71526.0 / 64, "llama3.1/README.md"},
    {"dgxc_llama31_405b", "llama3-405b", 512, 8, 8, 2, 8, 256, 106024.0 / 512, "llama3.1/README.md"},
    {"dgxc_gpt3_175b", "gpt3-175b", 128, 4, 8, 1, 6, 256, 63099.0 / 128, "nemo_megatron/README_175b.md"},
};

std::vector<PublishedRow> dgxc_h100(const pl::System& h100) {
  std::vector<PublishedRow> rows;
  for (const auto& r : kDgxcH100) {
    pl::ModelShape m = pl::preset(r.preset);
    if (std::string(r.preset) == "gpt3-175b") {
      m.vocab = 50688;
      m.tied = true;
    }
    const pl::Training t = bf16_fp32_grads(r.batch);
    pl::Layout l;
    l.tp = r.tp;
    l.pp = r.pp;
    l.cp = r.cp;
    l.dp = r.gpus / (r.tp * r.pp * r.cp);
    l.virtual_stages = r.vp;
    l.schedule = r.vp > 1 ? "interleaved-1f1b" : "1f1b";
    l.sequence_parallel = r.tp > 1;
    l.zero = 1;
    l.overlap_dp = true;
    l.overlap_tp = r.tp > 1;
    l.account_for_embedding = l.account_for_loss = std::string(r.preset) == "llama3-405b";
    const auto e = pl::estimate(m, t, l, h100);
    rows.push_back({r.name, fmt::format("NVIDIA dgxc-benchmarking v25.04.02, {}", r.readme), "tokens/s per GPU",
                    r.tokens_per_s, e.tokens_per_s / static_cast<double>(r.gpus), 0.10});
  }
  return rows;
}

// BLOOM-176B (BigScience, tr11-176B-ml) on 384 A100-80GB (48 nodes of 8, Jean Zay): the run's SLURM
// script (bigscience-workshop/bigscience, train/tr11-176B-ml/tr11-176B-ml.slurm): TP 4, PP 12 (DP 8),
// micro batch 2, global batch 2048, 70 layers, hidden 14336, 112 heads, sequence 2048, vocabulary
// padded to 250880, bf16, ALiBi, `--checkpoint-activations` (full recompute), `--pp-partition-method
// 'type:transformer|embedding'` (the tied embedding counted as a layer at both ends: 5, 6 x 10, 5;
// the run's README), ZeRO stage 0 with DeepSpeed's bf16 optimizer ("it implements its own zero stage
// 1 equivalent": fp32 gradient accumulation, a sharded fp32 master), Megatron's default dropout 0.1
// (the README), Megatron-DeepSpeed on DeepSpeed's PipelineEngine (1F1B; pipeline messages split over
// TP and gathered, is_pipe_partitioned; the gradients reduced after the last microbatch). Published:
// 149.77 TFLOP/s per GPU at iteration 85,376 (104.70 s per iteration, global batch 2048; the README's
// log line at the end of the first epoch), Megatron-DeepSpeed's eq. 3 count (recompute included).
// Not modelled: the embedding LayerNorm (2h parameters), DeepSpeed's all-reduce of the fp32
// gradients (modelled as ZeRO-1's reduce-scatter and all-gather, a quarter fewer bytes).
std::vector<PublishedRow> bloom_176b(const pl::System& a100) {
  pl::ModelShape m = pl::preset("megatron-1t");  // GPT style: LayerNorm, GELU, biases, dropout, tied
  m.name = "bloom-176b";
  m.layers = 70;
  m.hidden = 14336;
  m.heads = m.kv_heads = 112;
  m.ffn = 4 * 14336;
  m.vocab = 250880;
  m.sequence = 2048;
  m.learned_positions = false;  // ALiBi
  pl::Training t;
  t.global_batch = 2048;
  t.microbatch = 2;
  t.recipe = "bf16";
  t.recompute = "full";
  t.flash_attention = false;
  t.fp32_grads = true;
  pl::Layout l;
  l.tp = 4;
  l.pp = 12;
  l.dp = 8;
  l.sequence_parallel = false;
  l.zero = 1;
  l.schedule = "1f1b";
  l.overlap_dp = false;
  l.pp_scatter_gather = true;
  l.account_for_embedding = l.account_for_loss = true;
  const auto e = pl::estimate(m, t, l, a100);
  return {{"bloom_176b", "BigScience tr11-176B-ml (README, iteration 85376)", "TFLOP/s per GPU (eq. 3)", 149.77,
           e.flops_per_device / 1e12, 0.10}};
}

Table published_table(const std::vector<PublishedRow>& rows, Report& report) {
  Table tb{"published", "Published runs against the model (each row's own configuration; one GEMM efficiency per system)",
           {text_col("name", "row"), text_col("quantity", "quantity"), float_col("published", "published"),
            float_col("predicted", "predicted"), pct_col("error", "error", 1), text_col("source", "source")}};
  for (const auto& r : rows) {
    const double err = (r.predicted - r.published) / r.published;
    tb.rows.push_back({{"name", r.name}, {"quantity", r.quantity}, {"published", r.published}, {"predicted", r.predicted},
                       {"error", err}, {"source", r.source}});
    report.check("published_" + r.name, std::fabs(err), r.goal,
                 fmt::format("{}: {:.4g} predicted, {:.4g} published ({})", r.quantity, r.predicted, r.published, r.source));
  }
  tb.notes.emplace_back("ZeRO's figures are printed to 3 significant digits (1.875 GB shows as 1.9): the error is the rounding");
  return tb;
}

}  // namespace

Table published_runs_table(const pl::System& a100, const pl::System& h100, Report& report) {
  auto rows = zero_figure1();
  for (auto& r : megatron_table1(a100)) rows.push_back(std::move(r));
  for (auto& r : bloom_176b(a100)) rows.push_back(std::move(r));
  for (auto& r : llama3_table4(h100)) rows.push_back(std::move(r));
  for (auto& r : dgxc_h100(h100)) rows.push_back(std::move(r));
  return published_table(rows, report);
}

}  // namespace mpt::plan_published
