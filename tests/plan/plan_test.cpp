// core/plan: each term against the closed form of its source, computed here independently.
#include "core/plan/plan.hpp"

#include <cmath>
#include <vector>

#include "catch.hpp"
#include "core/errors.hpp"
#include "core/pipeline/schedule.hpp"
#include "core/plan/plan_detail.hpp"

using namespace mpt::plan;

namespace {

// A system file: 8 devices of 80 GiB, 300 TFLOP/s in bf16 and fp16, no fp8, one link of
// 100 GB/s and 10 us for every collective (the all-to-all too).
nlohmann::json system_json() {
  nlohmann::json link = {{"busbw_gbps", 100}, {"latency_us", 10}};
  nlohmann::json l = {{"all_reduce", link}, {"all_gather", link}, {"reduce_scatter", link}, {"send_recv", link},
                      {"all_to_all", link}};
  return {{"name", "test"},
          {"devices_per_node", 8},
          {"memory_gib", 80},
          {"reserved_gib", 0},
          {"peak_tflops", {{"fp32", 20}, {"bf16", 300}, {"fp16", 300}, {"fp8", 0}}},
          {"gemm_efficiency", 0.5},
          {"memory_bandwidth_gbps", 2000},
          {"intra_node", l},
          {"inter_node", l}};
}

System test_system() { return parse_system(system_json(), "test"); }

double term(const Estimate& e, const std::string& name) {
  for (const auto& t : e.memory)
    if (t.name == name) return t.value;
  for (const auto& t : e.time)
    if (t.name == name) return t.value;
  FAIL("no term " << name);
  return 0;
}

/// Payload bytes per step of `name` ("group/collective") in the estimate's communication, 0 when absent.
double comm_bytes(const Estimate& e, const std::string& name) {
  for (const auto& c : e.comm)
    if (c.group + "/" + c.collective == name) return c.bytes;
  return 0.0;
}

/// The value of the routing term `name` of a mixture of experts (Estimate::moe).
double moe_term(const Estimate& e, const std::string& name) {
  for (const auto& t : e.moe)
    if (t.name == name) return t.value;
  FAIL("no MoE term " << name);
  return 0;
}

ModelShape gpt(int64_t layers, int64_t h, int64_t a, int64_t s) {
  ModelShape m = preset("megatron-1t");
  m.layers = layers;
  m.hidden = h;
  m.heads = m.kv_heads = a;
  m.ffn = 4 * h;
  m.sequence = s;
  return m;
}

}  // namespace

TEST_CASE("parameter counts: Megatron-LM's eq. 2 plus the final LayerNorm, and Llama 3 8B's 8,030,261,248", "[plan]") {
  // Narayanan et al. 2021, eq. 2: P = 12lh²(1 + 13/12h + (V + s)/12lh) = 12lh² + 13lh + (V + s)h
  const auto& m = preset("megatron-1t");
  const double l = 128, h = 25600, V = 51200, s = 2048;
  const double eq2 = 12 * l * h * h + 13 * l * h + (V + s) * h;
  CHECK(count_params(m).total == eq2 + 2 * h);
  CHECK(std::round(eq2 / 1e8) / 10 == 1008.0);  // the paper's 1008.0B
  CHECK(count_params(preset("llama3-8b")).total == 8030261248.0);
}

TEST_CASE("model states: ZeRO Figure 1 (Ψ = 7.5B, K = 12, N_d = 64)", "[plan]") {
  Training t;
  t.recipe = "fp16";
  t.optimizer = "adam";
  const double psi = 7.5e9;
  CHECK(model_states(psi, t, 0, 64).total() == 16 * psi);                      // 120 GB
  CHECK(model_states(psi, t, 1, 64).total() == 4 * psi + 12 * psi / 64);       // 31.4 GB
  CHECK(model_states(psi, t, 2, 64).total() == 2 * psi + 14 * psi / 64);       // 16.6 GB
  CHECK(model_states(psi, t, 3, 64).total() == 16 * psi / 64);                 // 1.9 GB
  t.recipe = "fp32";
  CHECK(model_states(psi, t, 0, 64).total() == 16 * psi);  // 4 + 4 + Adam's 8, no master copy
  t.optimizer = "sgd";
  CHECK(model_states(psi, t, 1, 64).total() == 8 * psi);
}

TEST_CASE("activations per layer: Korthikanti et al. 2022, Table 2", "[plan]") {
  const int64_t L = 8, h = 1024, a = 16, s = 512;
  const auto m = gpt(L, h, a, s);
  Training tr;
  tr.global_batch = 4;
  tr.microbatch = 2;
  tr.recipe = "bf16";
  tr.flash_attention = false;  // Korthikanti et al. store the scores
  const double b = 2, sbh = s * b * h;
  const System sys = test_system();
  for (int64_t t : {1, 2, 4}) {
    Layout lay;
    lay.tp = t;
    lay.dp = 1;
    for (const char* rc : {"none", "selective", "full"}) {
      for (bool sp : {false, true}) {
        lay.sequence_parallel = sp;
        tr.recompute = rc;
        REQUIRE(layout_error(m, tr, lay).empty());
        const double got = term(estimate(m, tr, lay, sys), "activations");
        double per = 0;
        const double tt = static_cast<double>(t);
        if (std::string(rc) == "full") per = sp ? 2 * sbh / tt : 2 * sbh;
        else if (std::string(rc) == "selective") per = sp ? 34 * sbh / tt : sbh * (10 + 24 / tt);
        else per = sp ? sbh / tt * (34 + 5.0 * a * s / h) : sbh * (10 + 24 / tt + 5.0 * a * s / (h * tt));
        INFO("t = " << t << ", recompute " << rc << ", sp " << sp);
        CHECK(std::fabs(got - L * per) <= 1e-12 * L * per);
      }
    }
  }
}

TEST_CASE("pipelined activations: 1F1B's first stage holds L layers' worth, GPipe all m microbatches", "[plan]") {
  auto m = gpt(8, 1024, 16, 512);
  m.vocab = 64;  // the last stage's logits stay small: the first stage holds most
  Training tr;
  tr.global_batch = 8;
  tr.microbatch = 1;
  tr.recompute = "full";
  Layout lay;
  lay.pp = 4;
  const System sys = test_system();
  const double per_layer = 2.0 * 512 * 1024;  // 2sbh
  lay.schedule = "1f1b";
  auto e = estimate(m, tr, lay, sys);
  CHECK(e.stage == "first");
  CHECK(term(e, "activations") == 8 * per_layer);  // p = 4 microbatches of 2 layers
  lay.schedule = "gpipe";
  CHECK(term(estimate(m, tr, lay, sys), "activations") == 8 * 2 * per_layer);  // m = 8 microbatches of 2 layers
}

TEST_CASE("FLOPs: Narayanan et al. 2021 eq. 3 with full recompute; the model FLOPs without", "[plan]") {
  const int64_t L = 24, h = 2304, a = 24, s = 2048;
  auto m = gpt(L, h, a, s);
  Training tr;
  tr.global_batch = 64;
  tr.microbatch = 4;
  tr.recompute = "full";
  tr.recipe = "fp16";
  Layout lay;
  lay.dp = 16;
  const double B = 64, V = 51200, l = L, hh = h, ss = s;
  const auto e = estimate(m, tr, lay, test_system());
  const double eq3 = 96 * B * ss * l * hh * hh * (1 + ss / (6 * hh) + V / (16 * l * hh));
  const double model = 72 * B * ss * l * hh * hh * (1 + ss / (6 * hh) + V / (12 * l * hh));
  CHECK(std::fabs(e.hardware_flops - eq3) <= 1e-12 * eq3);
  CHECK(std::fabs(e.model_flops - model) <= 1e-12 * model);
}

TEST_CASE("layouts that do not divide are refused naming the keys", "[plan]") {
  const auto m = gpt(6, 1024, 16, 512);
  Training tr;
  tr.global_batch = 8;
  Layout lay;
  lay.tp = 3;
  CHECK(layout_error(m, tr, lay).find("/model/heads = 16 is not a multiple of /layout/tp = 3") != std::string::npos);
  lay.tp = 1;
  lay.pp = 4;
  CHECK(layout_error(m, tr, lay).find("/model/layers = 6") != std::string::npos);
  lay.pp = 2;
  lay.dp = 3;
  CHECK(layout_error(m, tr, lay).find("/train/global_batch = 8 is not a multiple of /layout/dp") != std::string::npos);
  lay.dp = 1;
  lay.schedule = "interleaved-1f1b";
  lay.virtual_stages = 3;
  CHECK(layout_error(m, tr, lay).empty());  // 6 layers = 2 stages x 3 chunks, m = 8 a multiple of p = 2
  tr.global_batch = 3;  // m = 3: Megatron's interleaved schedule takes microbatches in groups of p
  CHECK(layout_error(m, tr, lay).find("/layout/schedule = interleaved-1f1b with 3 microbatches") != std::string::npos);
  tr.global_batch = 8;
  lay.virtual_stages = 1;
  CHECK(layout_error(m, tr, lay).find("/layout/virtual_stages") != std::string::npos);
}

TEST_CASE("search: every fitting layout uses all the devices and they come fastest first", "[plan]") {
  const auto m = gpt(8, 1024, 16, 512);
  Training tr;
  tr.global_batch = 64;
  const auto cs = search(m, tr, Layout{}, test_system(), 16);
  REQUIRE_FALSE(cs.empty());
  double last = 0;
  bool in_fitting = true;
  int fitting = 0;
  for (const auto& c : cs) {
    if (!c.rejected.empty()) {
      in_fitting = false;
      continue;
    }
    REQUIRE(in_fitting);  // no fitting layout after a rejected one
    CHECK(c.layout.devices() == 16);
    CHECK(c.est.fits);
    CHECK(c.est.step_s >= last);
    last = c.est.step_s;
    ++fitting;
  }
  CHECK(fitting > 0);
}

TEST_CASE("system files: a missing, mistyped or non-positive field is named", "[plan]") {
  const nlohmann::json j = system_json();
  const nlohmann::json link = j["intra_node"]["all_reduce"];
  CHECK_NOTHROW(parse_system(j, "f.json"));
  auto bad = j;
  bad["inter_node"]["send_recv"].erase("busbw_gbps");
  CHECK_THROWS_WITH(parse_system(bad, "f.json"), Catch::Contains("f.json: /inter_node/send_recv/busbw_gbps: missing"));
  bad = j;
  bad["gemm_efficiency"] = 0;
  CHECK_THROWS_WITH(parse_system(bad, "f.json"), Catch::Contains("/gemm_efficiency: expected a number in [0.001, 1], got 0"));
  bad = j;
  bad["memory_gib"] = "80";
  CHECK_THROWS_AS(parse_system(bad, "f.json"), mpt::ConfigError);
  bad = j;
  bad["gemm_eficiency"] = 0.5;
  CHECK_THROWS_WITH(parse_system(bad, "f.json"), Catch::Contains("/gemm_eficiency: unknown field"));
}

TEST_CASE("system files: out-of-range values, wrong types and unknown nested fields are named", "[plan]") {
  const nlohmann::json j = system_json();
  const nlohmann::json link = j["intra_node"]["all_reduce"];
  auto bad = j;
  bad["memory_bandwidth_gbps"] = 1e-320;  // would make every elementwise time inf
  CHECK_THROWS_WITH(parse_system(bad, "f.json"), Catch::Contains("/memory_bandwidth_gbps: expected a number in"));
  bad = j;
  bad["memory_gib"] = 1e308;
  CHECK_THROWS_WITH(parse_system(bad, "f.json"), Catch::Contains("/memory_gib: expected a number in"));
  bad = j;
  bad["name"] = 5;
  CHECK_THROWS_WITH(parse_system(bad, "f.json"), Catch::Contains("/name: expected a string, got 5"));
  bad = j;
  bad["peak_tflops"] = "lots";
  CHECK_THROWS_WITH(parse_system(bad, "f.json"), Catch::Contains("/peak_tflops: expected an object"));
  bad = j;
  bad["intra_node"]["broadcast"] = link;
  CHECK_THROWS_WITH(parse_system(bad, "f.json"), Catch::Contains("/intra_node/broadcast: unknown field"));
  bad = j;
  bad["intra_node"]["all_reduce"]["foo"] = 1;
  CHECK_THROWS_WITH(parse_system(bad, "f.json"), Catch::Contains("/intra_node/all_reduce/foo: unknown field"));
  bad = j;
  bad["peak_tflops"]["fp6"] = 1;
  CHECK_THROWS_WITH(parse_system(bad, "f.json"), Catch::Contains("/peak_tflops/fp6: unknown field"));
  bad = j;  // fp4 is known (nvfp4, mxfp4) and optional; a peak is a number
  bad["peak_tflops"]["fp4"] = "many";
  CHECK_THROWS_WITH(parse_system(bad, "f.json"), Catch::Contains("/peak_tflops/fp4: expected a number"));
}

TEST_CASE("layouts: K/V heads, sequence parallelism and ZeRO with pipelining are checked", "[plan]") {
  auto m = preset("llama3-70b");
  Training tr;
  tr.global_batch = 64;
  Layout lay;
  lay.tp = 16;  // 8 K/V heads
  CHECK(layout_error(m, tr, lay).find("/model/kv_heads = 8 is not a multiple of /layout/tp = 16") != std::string::npos);
  lay.tp = 8;
  lay.sequence_parallel = true;
  m.sequence = 8191;
  CHECK(layout_error(m, tr, lay).find("/model/sequence = 8191 is not a multiple of /layout/tp = 8") != std::string::npos);
  m.sequence = 8192;
  lay.pp = 2;
  lay.zero = 2;  // DeepSpeed's PipelineEngine: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism
  CHECK(layout_error(m, tr, lay).find("/layout/zero = 2 with /layout/pp = 2") != std::string::npos);
  lay.zero = 1;
  CHECK(layout_error(m, tr, lay).empty());
  lay.pp = 1;
  lay.virtual_stages = 2;
  CHECK(layout_error(m, tr, lay).find("/layout/virtual_stages = 2: model chunks per stage need /layout/pp > 1") !=
        std::string::npos);
}

TEST_CASE("communication: Megatron-LM's TP collectives, ZeRO's DP payloads, the pipeline's sends", "[plan]") {
  // A GPT of L = 4, h = 1024, a = 16, s = 512, V = 51200 (untied, LayerNorm, biases), microbatch 2, bf16.
  ModelShape m = gpt(4, 1024, 16, 512);
  m.tied = false;
  Training t;
  t.microbatch = 2;
  t.recompute = "none";
  const double L = 4, h = 1024, s = 512, b = 2, act = 2 * s * b * h, ce = 4 * s * b;
  SECTION("tp = 2 without SP: 4L + 2 all-reduces of sbh and the cross-entropy's 3 of 4sb per microbatch") {
    t.global_batch = 4;  // 2 microbatches
    Layout l;
    l.tp = 2;
    const Estimate e = estimate(m, t, l, test_system());
    CHECK(comm_bytes(e, "tp/all_reduce") == 2 * ((4 * L + 2) * act + 3 * ce));
    CHECK(comm_bytes(e, "tp/all_gather") == 0);
    CHECK(e.comm.size() == 1);
  }
  SECTION("tp = 2 with SP: 6L + 3 all-gathers, 4L + 2 reduce-scatters, the norms' and row biases' gradients once; "
          "learned positions: the embedding all-reduced, not reduce-scattered") {
    t.global_batch = 2;
    Layout l;
    l.tp = 2;
    l.sequence_parallel = true;
    m.learned_positions = false;
    Estimate e = estimate(m, t, l, test_system());
    CHECK(comm_bytes(e, "tp/all_gather") == (6 * L + 3) * act);
    CHECK(comm_bytes(e, "tp/reduce_scatter") == (4 * L + 2) * act);
    // per layer 2 LayerNorms (2h each) and 2 row-parallel biases (h each), the final LayerNorm 2h; bf16 gradients
    CHECK(comm_bytes(e, "tp/all_reduce") == 3 * ce + (L * 6 * h + 2 * h) * 2);
    m.learned_positions = true;
    e = estimate(m, t, l, test_system());
    CHECK(comm_bytes(e, "tp/all_gather") == (6 * L + 3) * act);
    CHECK(comm_bytes(e, "tp/reduce_scatter") == (4 * L + 1) * act);
    CHECK(comm_bytes(e, "tp/all_reduce") == act + 3 * ce + (L * 6 * h + 2 * h) * 2);
  }
  SECTION("dp = 4: ZeRO-0 one all-reduce, ZeRO-1 one reduce-scatter and all-gather, ZeRO-2 a reduce-scatter per "
          "microbatch, ZeRO-3 two all-gathers and one reduce-scatter per microbatch") {
    t.global_batch = 24;  // 3 microbatches per replica
    const double psi = count_params(m).total;
    for (int z = 0; z <= 3; ++z) {
      Layout l;
      l.dp = 4;
      l.zero = z;
      const Estimate e = estimate(m, t, l, test_system());
      INFO("ZeRO-" << z);
      CHECK(comm_bytes(e, "dp/all_reduce") == (z == 0 ? 2 * psi : 0) + 8);  // + the loss's mean for the log
      CHECK(comm_bytes(e, "dp/reduce_scatter") == (z == 0 ? 0 : z == 1 ? 2 * psi : 3 * 2 * psi));
      CHECK(comm_bytes(e, "dp/all_gather") == (z == 0 ? 0 : z == 3 ? 6 * 2 * psi : 2 * psi));
    }
  }
  SECTION("pp = 2: the last rank sends a gradient and receives an activation of sbh per microbatch (sbh/t with "
          "scatter/gather, then all-gathered); interleaved "
          "(v = 2) 3 each; a tied head all-reduces once") {
    t.global_batch = 8;
    Layout l;
    l.pp = 2;
    l.tp = 2;
    Estimate e = estimate(m, t, l, test_system());
    CHECK(comm_bytes(e, "pp/send") == 4 * act);  // 4 microbatches; every TP rank sends the whole activation
    CHECK(comm_bytes(e, "pp/recv") == 4 * act);
    l.pp_scatter_gather = true;  // Megatron-LM 2021: 1/t sent, gathered over TP on receipt
    e = estimate(m, t, l, test_system());
    CHECK(comm_bytes(e, "pp/send") == 4 * act / 2);
    CHECK(comm_bytes(e, "tp/all_gather") == 4 * act);
    CHECK(comm_bytes(e, "embedding/all_reduce") == 0);
    // the last stage has the head's all-reduce and the cross-entropy's, not the embedding's
    CHECK(comm_bytes(e, "tp/all_reduce") == 4 * ((4 * L / 2 + 1) * act + 3 * ce));
    l.schedule = "interleaved-1f1b";
    l.virtual_stages = 2;
    e = estimate(m, t, l, test_system());
    CHECK(comm_bytes(e, "pp/send") == 3 * 4 * act / 2);  // scatter/gather still on
    m.tied = true;
    e = estimate(m, t, l, test_system());
    CHECK(comm_bytes(e, "embedding/all_reduce") == 51200 * h / 2 * 2);
  }
}

TEST_CASE("both ends on one device: pp = 1 and ZB-V's rank 0 hold the embedding and the head, a tied head once", "[plan]") {
  ModelShape m = gpt(8, 1024, 16, 512);
  Training t;
  t.microbatch = 1;
  t.global_batch = 16;
  t.recipe = "fp32";
  t.optimizer = "sgd";
  t.recompute = "none";
  SECTION("pp = 1, tied: every parameter once, 4 B each") {
    m.tied = true;
    const Estimate e = estimate(m, t, Layout{}, test_system());
    CHECK(term(e, "weights") == 4 * count_params(m).total);
  }
  SECTION("ZB-V over 2 ranks: rank 0 holds 4 of the 8 layers, the embedding, positions, head and final norm") {
    Layout l;
    l.pp = 2;
    l.schedule = "zb-v";
    l.virtual_stages = 2;
    l.tp = 2;
    m.tied = true;
    const ParamCounts pc = count_params(m);
    const Estimate e = estimate(m, t, l, test_system());
    REQUIRE(e.stage == "first");
    const double h = 1024, layer_tp = pc.matmul_per_layer / 2 + 4 * h + (h + 2 * h + 4 * h) / 2 + 2 * h;
    CHECK(term(e, "weights") == Approx(4 * (4 * layer_tp + pc.embedding / 2 + pc.positions + pc.final_norm)).epsilon(1e-12));
    CHECK(term(e, "logits") > 0);
    CHECK(comm_bytes(e, "embedding/all_reduce") == 0);  // the tied head is rank 0's own embedding
    // rank 0 runs the embedding's all-reduce and the head's: 4 per layer of its 4, + 2, per microbatch
    const double act = 4 * 512 * 1024;
    CHECK(comm_bytes(e, "tp/all_reduce") == 16 * ((4 * 4 + 2) * act + 3 * 4 * 512));
  }
}

TEST_CASE("context parallelism: activations and logits / cp, each attention's CP payload, ZeRO over dp x cp", "[plan]") {
  // A GPT of L = 4, h = 1024, a = 16, s = 512, microbatch 2, bf16, 2 microbatches; cp = 4.
  const ModelShape m = gpt(4, 1024, 16, 512);
  Training t;
  t.microbatch = 2;
  t.global_batch = 4;
  t.recompute = "selective";
  const double L = 4, h = 1024, S = 512, b = 2, c = 4, mb = 2;
  Layout one;
  one.zero = 1;
  Layout l = one;
  l.cp = 4;
  const System sys = test_system();
  REQUIRE(layout_error(m, t, l).empty());
  const Estimate e1 = estimate(m, t, one, sys), e = estimate(m, t, l, sys);
  // Korthikanti's selective 34sbh per layer with s = S/cp; the fp32 logits of S/cp positions.
  CHECK(term(e, "activations") == term(e1, "activations") / c);
  CHECK(term(e, "activations") == L * 34 * (S / c) * b * h);
  CHECK(term(e, "logits") == term(e1, "logits") / c);
  // ZeRO-1 shards the optimizer states over dp x cp = 4 ranks (Megatron's DP group with CP).
  CHECK(term(e, "optimizer states") == term(e1, "optimizer states") / c);
  // Ring: per layer and microbatch, (c - 1) K/V sends forward, (c - 1) K/V + c dK/dV backward, each K with V
  // of S/c positions (2 x (S/c)·b·h bf16 elements).
  const double kv_msg = 2 * (S / c) * b * h * 2;
  CHECK(comm_bytes(e, "cp/send") == mb * L * ((c - 1) + (c - 1) + c) * kv_msg);
  CHECK(comm_bytes(e, "cp/recv") == comm_bytes(e, "cp/send"));
  // All-gather: K and V gathered (output: all S positions), dK and dV reduce-scattered (input: S positions).
  l.cp_attention = "all_gather";
  Estimate ag = estimate(m, t, l, sys);
  CHECK(comm_bytes(ag, "cp/all_gather") == mb * L * 2 * S * b * h * 2);
  CHECK(comm_bytes(ag, "cp/reduce_scatter") == mb * L * 2 * S * b * h * 2);
  CHECK(comm_bytes(ag, "cp/send") == 0);
  // Ulysses: q, k, v, y forward and their gradients backward, each this rank's S/c positions.
  l.cp_attention = "ulysses";
  Estimate u = estimate(m, t, l, sys);
  CHECK(comm_bytes(u, "cp/all_to_all") == mb * L * 8 * (S / c) * b * h * 2);
  // the step: the same model FLOPs, a quarter of them per device
  CHECK(u.model_flops == e1.model_flops);
  // layouts: 2cp must divide the sequence; Ulysses needs whole heads per CP rank
  l.cp = 3;
  CHECK_THAT(layout_error(m, t, l), Catch::Matchers::Contains("/layout/cp"));
  l.cp = 32;  // 16 heads
  CHECK_THAT(layout_error(m, t, l), Catch::Matchers::Contains("Ulysses"));
  l.cp_attention = "ring";
  CHECK(layout_error(m, t, l).empty());
  l.cp_attention = "zigzag";
  CHECK_THAT(layout_error(m, t, l), Catch::Matchers::Contains("/layout/cp_attention"));
}

TEST_CASE("mixture of experts: parameters with E experts and the router, Mixtral 8x7B's 46.7B (12.9B active), "
          "mpt's MoE GPT as moe_gpt_num_params, the capacity", "[plan]") {
  // Mixtral 8x7B (Jiang et al. 2024, Table 1): per layer q, o 4096², k, v 4096·1024, 8 SwiGLU experts of 3·4096·14336,
  // the router 8·4096, two RMSNorms; embedding and untied head 32000·4096, the final norm.
  const double attn = 2.0 * 4096 * 4096 + 2.0 * 4096 * 1024, expert = 3.0 * 4096 * 14336, router = 8 * 4096.0;
  const double ends = 2 * 32000.0 * 4096 + 4096;
  const ParamCounts mx = count_params(preset("mixtral-8x7b"));
  CHECK(mx.total == 32 * (attn + 8 * expert + router + 2 * 4096) + ends);
  CHECK(mx.total == 46702792704.0);
  CHECK(mx.active == 32 * (attn + 2 * expert + router + 2 * 4096) + ends);
  CHECK(mx.active == 12879925248.0);
  CHECK(mx.matmul_per_layer == attn + router + 2 * expert);  // a token's GEMMs: attention, router, 2 experts
  // core/models/moe's MoE GPT at `mpt expertparallel`'s defaults (docs/expertparallel.md: 314,496):
  // per block LayerNorms 2·2C, c_attn 3C² + 3C, c_proj C² + C, router E·C, 8 experts of 2·C·H + H + C.
  const double C = 64, H = 128, E = 8;
  const double block = 4 * C + 3 * C * C + 3 * C + C * C + C + E * C + E * (2 * C * H + H + C);
  CHECK(count_params(preset("mpt-moe")).total == 96 * C + 32 * C + 2 * block + 2 * C + 96 * C);
  CHECK(count_params(preset("mpt-moe")).total == 314496.0);
  // dense models: E = 0 or 1 changes nothing
  ModelShape one = preset("llama3-8b");
  one.experts = 1;
  one.top_k = 1;
  CHECK(count_params(one).total == count_params(preset("llama3-8b")).total);
  // capacity = min(n, ceil(n·k·cf/E)), at least 1 (core/models/moe's capacity)
  CHECK(expert_capacity(32, 2, 1.25, 4) == 20);
  CHECK(expert_capacity(32, 2, 0.5, 4) == 8);
  CHECK(expert_capacity(32, 2, 4.0, 4) == 32);  // cf >= E/k: every token, never more
  CHECK(expert_capacity(1, 1, 0.01, 8) == 1);
}

TEST_CASE("expert parallelism: the experts' states over ep and the expert-DP group, the all-to-all payload, the "
          "padded rows' FLOPs and activations, the routing bounds", "[plan]") {
  // A GPT of L = 4, h = 1024, a = 16, s = 512 (f = 4h, LayerNorm, biases, learned positions, tied, dropout)
  // with E = 8 experts, top-2, capacity factor 1.25; bf16, Adam, ZeRO-1; dp 4 with ep 2, microbatch 2,
  // 2 microbatches per replica.
  ModelShape m = gpt(4, 1024, 16, 512);
  m.experts = 8;
  m.top_k = 2;
  Training t;
  t.microbatch = 2;
  t.global_batch = 16;
  t.recompute = "selective";
  t.capacity_factor = 1.25;
  Layout l;
  l.dp = 4;
  l.ep = 2;
  l.zero = 1;
  const System sys = test_system();
  const double L = 4, h = 1024, f = 4096, s = 512, b = 2, E = 8, k = 2, mb = 2;
  const ParamCounts pc = count_params(m);
  const double expert = 2 * h * f + f + h;  // one GELU expert with its biases
  REQUIRE(pc.expert == expert);
  SECTION("tp = 1: a rank routes n = sb = 1024 tokens, cap = ceil(1024·2·1.25/8) = 320, E·cap = 2560 rows") {
    REQUIRE(layout_error(m, t, l).empty());
    const Estimate e = estimate(m, t, l, sys);
    const double n = s * b, cap = 320, rows = E * cap;
    // the E/ep = 4 experts of each layer on this device; the dense parameters whole (ZeRO-1 shards the states)
    const double experts_dev = L * (E / 2) * expert, dense = pc.total - L * E * expert;
    CHECK(term(e, "expert weights") == 2 * experts_dev);
    CHECK(term(e, "expert gradients") == 2 * experts_dev);
    CHECK(term(e, "weights") == 2 * dense);
    // ZeRO-1: master and Adam over the expert-DP group of dp/ep = 2 ranks; the dense ones over dp = 4
    CHECK(term(e, "expert master weights") == 4 * experts_dev / 2);
    CHECK(term(e, "expert optimizer states") == 8 * experts_dev / 2);
    CHECK(term(e, "optimizer states") == 8 * dense / 4);
    // 4 all-to-alls per layer and microbatch of the [E, cap, h] buffer, bf16
    CHECK(comm_bytes(e, "ep/all_to_all") == mb * L * 4 * rows * h * 2);
    // ZeRO-1's reduce-scatter and all-gather: the dense gradients over dp, the experts' over the expert-DP group
    CHECK(comm_bytes(e, "dp/reduce_scatter") == 2 * dense);
    CHECK(comm_bytes(e, "edp/reduce_scatter") == 2 * experts_dev);
    CHECK(comm_bytes(e, "edp/all_gather") == 2 * experts_dev);
    // the routing per microbatch and layer
    CHECK(moe_term(e, "tokens routed") == n);
    CHECK(moe_term(e, "capacity") == cap);
    CHECK(moe_term(e, "expert rows") == rows);
    CHECK(moe_term(e, "padding, at least") == Approx(1 - n * k / rows).epsilon(1e-15));  // 0.2
    CHECK(moe_term(e, "dropped fraction, at least") == 0);  // E·cap >= n·k: a balanced router keeps every choice
    CHECK(moe_term(e, "dropped fraction, at most") == 1 - cap / n);  // 0.6875
    // FLOPs: the model's count k·n rows per expert GEMM, the hardware's the E·cap padded rows (8 microbatches of
    // the global batch, 3 passes)
    CHECK(e.hardware_flops - e.model_flops == Approx(3 * L * 2 * (2 * h * f) * (rows - k * n) * 8 + L * 4 * b * s * s * h * 8)
                                                   .epsilon(1e-12));
    // activations: the MLP's 4sbf replaced by 4·rows·f, plus the dispatched buffer 2·rows·h, the combine's
    // 2·n·k·h and the router's fp32 probabilities 4·n·E, per layer
    ModelShape dense_m = m;
    dense_m.experts = 0;
    Layout dl = l;
    dl.ep = 1;
    const Estimate d = estimate(dense_m, t, dl, sys);
    CHECK(term(e, "activations") - term(d, "activations") ==
          L * (4 * rows * f - 4 * s * b * f + 2 * rows * h + 2 * n * k * h + 4 * n * E));
    // cf = 0.5: cap 128, at least 1 - 8·128/2048 = 1/2 of the choices dropped, the payload shrinks with it
    t.capacity_factor = 0.5;
    const Estimate half = estimate(m, t, l, sys);
    CHECK(moe_term(half, "capacity") == 128);
    CHECK(moe_term(half, "dropped fraction, at least") == 0.5);
    CHECK(comm_bytes(half, "ep/all_to_all") == mb * L * 4 * (E * 128) * h * 2);
  }
  SECTION("tp = 2 with SP: a rank routes sb/t = 512 tokens (cap 160), the expert-TP GEMMs on the t ranks' rows") {
    l.tp = 2;
    l.sequence_parallel = true;
    REQUIRE(layout_error(m, t, l).empty());
    const Estimate e = estimate(m, t, l, sys);
    const double rows = E * 160, rows_dev = 2 * rows;
    CHECK(moe_term(e, "tokens routed") == 512);
    CHECK(moe_term(e, "capacity") == 160);
    // each expert's matrices and column-parallel bias split over TP, its row-parallel bias replicated
    CHECK(term(e, "expert weights") == 2 * L * (E / 2) * (h * f + f / 2 + h));
    CHECK(comm_bytes(e, "ep/all_to_all") == mb * L * 4 * rows * h * 2);
    // TP all-gathers per microbatch: sbh for the attention (1 forward, 2 backward per layer), the head's (1 forward,
    // 1 backward) and the embedding's backward; t·E·cap·h for the experts' rows (1 forward, 1 backward per layer)
    const double act = 2 * s * b * h, xact = 2 * rows_dev * h;
    CHECK(comm_bytes(e, "tp/all_gather") == mb * ((L + 1 + 2 * L + 1 + 1) * act + 2 * L * xact));
    CHECK(comm_bytes(e, "tp/reduce_scatter") == mb * ((L + L + 1) * act + 2 * L * xact));
  }
  SECTION("layouts: ep divides dp and E, only with experts; k in 1 .. E; a capacity factor > 0") {
    l.ep = 3;
    CHECK_THAT(layout_error(m, t, l), Catch::Matchers::Contains("/layout/ep = 3 does not divide /layout/dp = 4"));
    l.ep = 4;
    m.experts = 6;
    CHECK_THAT(layout_error(m, t, l), Catch::Matchers::Contains("/model/experts = 6 is not a multiple of /layout/ep = 4"));
    m.experts = 8;
    m.top_k = 9;
    CHECK_THAT(layout_error(m, t, l), Catch::Matchers::Contains("/model/top_k = 9"));
    m.top_k = 2;
    t.capacity_factor = 0;
    CHECK_THAT(layout_error(m, t, l), Catch::Matchers::Contains("/train/capacity_factor"));
    t.capacity_factor = 1.25;
    CHECK(layout_error(m, t, l).empty());
    m.experts = 0;
    CHECK_THAT(layout_error(m, t, l), Catch::Matchers::Contains("/layout/ep = 4: expert parallelism needs"));
  }
  SECTION("the search tries every ep dividing dp and E; a dense model only ep = 1") {
    const auto cs = search(m, t, Layout{}, sys, 16);
    bool ep_fits = false;
    for (const auto& c : cs) {
      CHECK(c.layout.dp % c.layout.ep == 0);
      CHECK(m.experts % c.layout.ep == 0);
      if (c.rejected.empty() && c.layout.ep > 1) ep_fits = true;
    }
    CHECK(ep_fits);
    ModelShape dense_m = m;
    dense_m.experts = 0;
    for (const auto& c : search(dense_m, t, Layout{}, sys, 16)) CHECK(c.layout.ep == 1);
  }
}

TEST_CASE("system files: the all-to-all of each link is read, and named when missing", "[plan]") {
  nlohmann::json j = system_json();
  j["inter_node"]["all_to_all"]["busbw_gbps"] = 25;
  CHECK(parse_system(j, "f.json").inter.all_to_all.busbw == 25e9);
  j["intra_node"]["all_to_all"].erase("busbw_gbps");
  CHECK_THROWS_WITH(parse_system(j, "f.json"), Catch::Contains("f.json: /intra_node/all_to_all/busbw_gbps: missing"));
  j["intra_node"].erase("all_to_all");  // a file from before expert parallelism
  CHECK_THROWS_WITH(parse_system(j, "f.json"), Catch::Contains("f.json: /intra_node/all_to_all: missing"));
}

TEST_CASE("uneven stages: Megatron-core's first/last stage layers and the embedding and loss counted as layers; the "
          "rules, each refusal naming the keys", "[plan]") {
  ModelShape m = gpt(10, 1024, 16, 512);
  Training t;
  t.global_batch = 8;
  Layout l;
  l.pp = 4;
  SECTION("the split: the counts as set, the middle stages sharing the rest; only the first set, the rest over p - 1") {
    l.first_stage_layers = 1;
    l.last_stage_layers = 1;
    REQUIRE(layout_error(m, t, l).empty());
    CHECK(stage_layers(m, l) == std::vector<int64_t>{1, 4, 4, 1});
    l.last_stage_layers = 0;
    m.layers = 7;  // 1, then 6 over the other 3 stages
    REQUIRE(layout_error(m, t, l).empty());
    CHECK(stage_layers(m, l) == std::vector<int64_t>{1, 2, 2, 2});
    l.first_stage_layers = 0;
    m.layers = 8;  // even: L/p each
    CHECK(stage_layers(m, l) == std::vector<int64_t>{2, 2, 2, 2});
  }
  SECTION("the embedding and the loss as layers: BLOOM's 70 + 2 on 12 stages, Llama 3's 126 + 2 on 16 in chunks of one") {
    m.layers = 70;
    m.heads = m.kv_heads = 16;
    l.pp = 12;
    l.account_for_embedding = l.account_for_loss = true;
    t.global_batch = 24;
    REQUIRE(layout_error(m, t, l).empty());
    std::vector<int64_t> bloom(12, 6);
    bloom.front() = bloom.back() = 5;  // the run's README: [embed | 5], 6 x 10, [5 | embed]
    CHECK(stage_layers(m, l) == bloom);
    m.layers = 126;
    l.pp = 16;
    l.schedule = "interleaved-1f1b";
    l.virtual_stages = 8;  // 128 = 16 x 8 chunks of one layer: the first chunk the embedding, the last the loss
    t.global_batch = 32;
    REQUIRE(layout_error(m, t, l).empty());
    std::vector<int64_t> llama(16, 8);
    llama.front() = llama.back() = 7;
    CHECK(stage_layers(m, l) == llama);
    l.account_for_loss = false;  // 127 over 16 stages
    CHECK_THAT(layout_error(m, t, l), Catch::Matchers::Contains("= 127 is not a multiple of /layout/pp = 16"));
  }
  SECTION("refused, naming the keys") {
    auto err = [&]() { return layout_error(m, t, l); };
    l.pp = 2;
    l.first_stage_layers = 4;
    l.last_stage_layers = 4;  // 8 of 10 layers, no middle stage to take the rest
    CHECK_THAT(err(), Catch::Matchers::Contains("/layout/first_stage_layers + /layout/last_stage_layers = 4 + 4 = 8: "
                                                "expected /model/layers = 10"));
    l.pp = 4;
    l.first_stage_layers = l.last_stage_layers = 5;  // the two middle stages would hold 0 layers
    CHECK_THAT(err(), Catch::Matchers::Contains("a stage would hold no layer"));
    l.first_stage_layers = 2;
    l.last_stage_layers = 3;  // 5 layers over 2 middle stages
    CHECK_THAT(err(), Catch::Matchers::Contains("= 5 is not a multiple of the other 2 stage(s)"));
    l.first_stage_layers = 1;
    l.last_stage_layers = 1;
    l.schedule = "interleaved-1f1b";
    l.virtual_stages = 2;  // Megatron-core: a stage's layers a multiple of its chunks
    CHECK_THAT(err(), Catch::Matchers::Contains("/layout/first_stage_layers = 1 is not a multiple of /layout/virtual_stages = 2"));
    l.schedule = "1f1b";
    l.virtual_stages = 1;
    l.account_for_embedding = true;
    CHECK_THAT(err(), Catch::Matchers::Contains("cannot be set with /layout/account_for_embedding"));
    l.first_stage_layers = l.last_stage_layers = 0;  // 11 over 4 stages
    CHECK_THAT(err(), Catch::Matchers::Contains("= 11 is not a multiple of /layout/pp = 4"));
    m.layers = 2;
    l.account_for_loss = true;  // 4 over 4 stages: the first and the last would hold the embedding and the loss only
    CHECK_THAT(err(), Catch::Matchers::Contains("without a transformer layer"));
    m.layers = 10;
    l.pp = 1;
    CHECK_THAT(err(), Catch::Matchers::Contains("uneven stages need /layout/pp > 1"));
    l.pp = 2;
    l.schedule = "zb-v";
    l.virtual_stages = 2;
    CHECK_THAT(err(), Catch::Matchers::Contains("not the V of zb-v"));
    l.schedule = "1f1b";
    l.virtual_stages = 1;
    l.account_for_embedding = l.account_for_loss = false;
    CHECK(err().empty());  // even again
  }
}

TEST_CASE("uneven stages: the stage that needs most memory, the slowest stage's pace and bubble, its sends and "
          "gradients", "[plan]") {
  // A GPT of L = 10 (h = 1024, a = 16, s = 512, f = 4h, V = 64, LayerNorm, biases, dropout, tied) on 4 stages of
  // 1, 4, 4, 1 layers; fp32 with plain SGD (4 + 4 B per parameter), full recompute, FlashAttention, microbatch 1,
  // 8 microbatches, 1F1B: stage i holds p - i = 4, 3, 2, 1 microbatches at its peak.
  ModelShape m = gpt(10, 1024, 16, 512);
  m.vocab = 64;
  Training t;
  t.global_batch = 8;
  t.recipe = "fp32";
  t.optimizer = "sgd";
  t.recompute = "full";
  Layout l;
  l.pp = 4;
  l.first_stage_layers = 1;
  l.last_stage_layers = 1;
  const System sys = test_system();
  const double s = 512, b = 1, h = 1024, f = 4096, V = 64, mb = 8, p = 4;
  const double per_layer = count_params(m).per_layer;
  REQUIRE(per_layer == 12 * h * h + 13 * h);
  SECTION("memory: a middle stage (4 layers, 3 microbatches held) needs more than the first (1 layer, 4 held)") {
    REQUIRE(layout_error(m, t, l).empty());
    const Estimate e = estimate(m, t, l, sys);
    CHECK(e.stage == "middle");
    CHECK(term(e, "weights") == 4 * 4 * per_layer);
    CHECK(term(e, "gradients") == 4 * 4 * per_layer);
    // full recompute keeps the layer input, 2sbh elements of 4 bytes, per layer: 4 layers x 3 microbatches
    CHECK(term(e, "activations") == 3 * 4 * (2 * s * b * h * 2));
  }
  SECTION("time: the middle stages set the pace; the step is m times their time plus (p - 1) times it (1F1B)") {
    const Estimate e = estimate(m, t, l, sys);
    REQUIRE(e.comm_device.rfind("middle stage", 0) == 0);
    // per layer and microbatch: GEMM FLOPs 2 x 12h^2 x sb + 4bs^2h forward at 20 TFLOP/s x 0.5; elementwise
    // (3sbf + 16sbh) x 4 bytes forward at 2000 GB/s; backward twice, the recompute once more: 4 of each
    const double rate = 20e12 * 0.5, fwd = 2 * 12 * h * h * s * b + 4 * b * s * s * h;
    const double mem = (3 * s * b * f + 16 * s * b * h) * 4 / 2000e9;
    const double t_mid = 4 * (4 * fwd / rate + 4 * mem);
    const double t_last = (4 * fwd + 3 * 2 * V * h * s * b) / rate + 4 * mem;  // 1 layer and the logits
    REQUIRE(t_mid > t_last);
    CHECK(term(e, "compute") == Approx(mb * 4 * 4 * fwd / rate).epsilon(1e-12));
    CHECK(term(e, "elementwise") == Approx(mb * 4 * 4 * mem).epsilon(1e-12));
    CHECK(term(e, "bubble") == Approx((p - 1) * t_mid).epsilon(1e-12));
    // that bubble, at the slowest stage's time, bounds the schedule's own timeline from above: core/pipeline's
    // simulate_schedule replays 1F1B with each stage's own forward and backward (1, 4, 4, 1 layers, the logits last)
    std::vector<double> fs, bs, ws;
    for (int i = 0; i < 4; ++i) {
      const double Li = (i == 0 || i == 3) ? 1 : 4, logits = i == 3 ? 2 * V * h * s * b : 0.0;
      fs.push_back((Li * fwd + logits) / rate + Li * mem);
      bs.push_back((2 * (Li * fwd + logits) + Li * fwd) / rate + 3 * Li * mem);
      ws.push_back(0.0);
    }
    const double replayed = mpt::simulate_schedule(mpt::make_schedule(mpt::ScheduleKind::OneFOneB, 4, 8), fs, bs, ws).step_s;
    CHECK(replayed >= mb * t_mid);
    CHECK(replayed <= term(e, "compute") + term(e, "elementwise") + term(e, "bubble"));
    // a middle rank sends an activation and a gradient of sbh (4 bytes) per microbatch, and receives as many
    CHECK(comm_bytes(e, "pp/send") == mb * 2 * s * b * h * 4);
    CHECK(comm_bytes(e, "pp/recv") == mb * 2 * s * b * h * 4);
    CHECK(comm_bytes(e, "embedding/all_reduce") == 0);  // the tied embedding's all-reduce is the ends' own
  }
  SECTION("communication follows the stage: TP per layer only, the gradients of its 4 layers, no loss all-reduce") {
    t.recompute = "none";
    l.tp = 2;
    const Estimate e = estimate(m, t, l, sys);
    REQUIRE(e.comm_device.rfind("middle stage", 0) == 0);
    // 2 all-reduces forward, 2 backward per layer of sbh (4 bytes): no embedding's, head's or cross-entropy's
    CHECK(comm_bytes(e, "tp/all_reduce") == mb * 4 * 4 * (s * b * h * 4));
    l.tp = 1;
    l.dp = 2;
    t.global_batch = 16;  // 8 microbatches per replica
    const Estimate d = estimate(m, t, l, sys);
    CHECK(comm_bytes(d, "dp/all_reduce") == 4 * per_layer * 4);  // ZeRO-0: its 4 layers' fp32 gradients, once
  }
  SECTION("even stages: the last stage sets the pace and is the one modelled, as before") {
    m.layers = 8;
    l.first_stage_layers = l.last_stage_layers = 0;
    const Estimate e = estimate(m, t, l, sys);
    CHECK(e.comm_device == "last stage");
    CHECK(e.stage == "first");
  }
}

// ---- The MLP (ModelShape::widths): mpt's own experiments' networks (own runs: tests/plan/own_runs.py)

namespace {

// fp32 with SGD and no recompute, as mpt's MLP experiments train: `global` samples a step in microbatches of `micro`.
Training fp32_sgd(int64_t global, int64_t micro) {
  Training t;
  t.recipe = "fp32";
  t.optimizer = "sgd";
  t.recompute = "none";
  t.global_batch = global;
  t.microbatch = micro;
  return t;
}

ModelShape mlp_shape(std::vector<int64_t> widths) {
  ModelShape m;
  m.name = "custom";
  m.widths = std::move(widths);
  m.layers = static_cast<int64_t>(m.widths.size()) - 1;
  m.sequence = 1;
  m.dropout = false;
  return m;
}

}  // namespace

TEST_CASE("MLP: parameters, and the activations autograd keeps for Linear + ReLU in each recipe", "[plan][mlp]") {
  const ModelShape m = mlp_shape({784, 128, 128, 10});  // mpt accumulate's memory table
  CHECK(count_params(m).total == 784.0 * 128 + 128 + 128.0 * 128 + 128 + 128.0 * 10 + 10);  // 118,282
  Training t;
  t.recipe = "fp32";
  t.recompute = "none";
  const double b = 512;
  // every Linear's input (784, 128, 128 wide) and the fp32 loss input (10 wide)
  CHECK(mlp_activation_bytes(m, t, 512, 0, 3) == 4 * b * (784 + 128 + 128) + 4 * b * 10);
  // a stage of the first layer alone: its input and its ReLU output (the next stage keeps a copy)
  CHECK(mlp_activation_bytes(m, t, 512, 0, 1) == 4 * b * (784 + 128));
  // the last layer alone: its input and the loss input
  CHECK(mlp_activation_bytes(m, t, 512, 2, 3) == 4 * b * 128 + 4 * b * 10);
  // selective recompute drops attention scores: an MLP has none
  t.recompute = "selective";
  CHECK(mlp_activation_bytes(m, t, 512, 0, 3) == 4 * b * (784 + 128 + 128 + 10));
  // full recompute: every layer keeps its input only (the loss's input stays)
  t.recompute = "full";
  CHECK(mlp_activation_bytes(m, t, 512, 0, 1) == 4 * b * 784);
  CHECK(mlp_activation_bytes(m, t, 512, 0, 3) == 4 * b * (784 + 128 + 128) + 4 * b * 10);
  // bf16: 2-byte activations, the loss input in fp32
  t.recompute = "none";
  t.recipe = "bf16";
  CHECK(mlp_activation_bytes(m, t, 512, 0, 3) == 2 * b * (784 + 128 + 128) + 4 * b * 10);
  // dropout: every ReLU output kept besides its dropout output (the next input) and a 1-byte mask
  ModelShape d = m;
  d.dropout = true;
  t.recipe = "fp32";
  CHECK(mlp_activation_bytes(d, t, 512, 0, 2) == 4 * b * (784 + 128) + 2 * (4 + 1) * b * 128);
  CHECK_THROWS_AS(mlp_activation_bytes(m, t, 512, 2, 4), std::invalid_argument);
}

TEST_CASE("MLP: one device's model states and activations, its DP payload, ZeRO's", "[plan][mlp]") {
  const ModelShape m = mlp_shape({784, 128, 128, 10});
  const double psi = 118282;
  Training t = fp32_sgd(512, 128);
  Layout l;  // dp = tp = pp = 1
  const System sys = test_system();
  REQUIRE(layout_error(m, t, l).empty());
  Estimate e = estimate(m, t, l, sys);
  CHECK(e.stage == "only");
  CHECK(term(e, "weights") == 4 * psi);
  CHECK(term(e, "gradients") == 4 * psi);
  CHECK(term(e, "master weights") == 0);
  CHECK(term(e, "optimizer states") == 0);
  CHECK(term(e, "activations") == 4.0 * 128 * (784 + 128 + 128 + 10));  // one microbatch at a time
  CHECK(e.microbatches == 4);
  CHECK(e.comm.empty());
  CHECK(e.model_flops == 6.0 * (784 * 128 + 128 * 128 + 128 * 10) * 512);
  // dp 2, ZeRO-0: the loss's 8 B and the fp32 gradients once per step
  l.dp = 2;
  e = estimate(m, t, l, sys);
  CHECK(comm_bytes(e, "dp/all_reduce") == 8 + 4 * psi);
  // bf16 with Adam and ZeRO-1: 2 + 2 B/param, the fp32 master and Adam's 8 B/param over dp
  t.recipe = "bf16";
  t.optimizer = "adam";
  l.zero = 1;
  e = estimate(m, t, l, sys);
  CHECK(term(e, "weights") == 2 * psi);
  CHECK(term(e, "master weights") == 4 * psi / 2);
  CHECK(term(e, "optimizer states") == 8 * psi / 2);
  CHECK(comm_bytes(e, "dp/reduce_scatter") == 2 * psi);
  CHECK(comm_bytes(e, "dp/all_gather") == 2 * psi);
  // fp8: a 1-byte copy of each weight matrix (not the biases)
  t.recipe = "fp8-tensorwise";
  Training fp8 = t;
  System s8 = test_system();
  s8.peak_fp8 = 600e12;
  CHECK(term(estimate(m, fp8, l, s8), "fp8 weight copies") == 784.0 * 128 + 128.0 * 128 + 128.0 * 10);
  CHECK(term(estimate(m, fp8, l, s8), "fp8 weight scales") == 3 * 4.0);  // one fp32 scale per matrix
}

TEST_CASE("weight copies and scales per recipe: partial blocks padded, W and Wᵀ where the blocks differ",
          "[plan][fp8][fp4]") {
  using mpt::plan::detail::weight_copy_bytes;
  // W [10, 784]: mpt fp8's last Linear transposed, 7840 elements; 784 = 6·128 + 16 = 24·32 + 16 = 49·16
  auto check = [](const std::string& r, double copies, double scales) {
    const auto c = weight_copy_bytes(r, 10, 784);
    CHECK(c.copies == copies);
    CHECK(c.scales == scales);
  };
  check("fp8-tensorwise", 7840, 4);
  check("fp8-rowwise", 2 * 7840, 4 * 10 + 4 * 784);         // a scale per row of W (10) and of Wᵀ (784)
  check("fp8-blockwise", 7840, 4 * 1 * 7);                  // ceil(10/128)·ceil(784/128) = 1·7 blocks
  check("mxfp8", 2 * 7840, 10 * 25 + 784 * 1);              // ceil(784/32) = 25 per row of W; ceil(10/32) = 1 of Wᵀ
  check("nvfp4", 3920, 1 * 49 + 4);                         // 16x16 blocks ceil(10/16)·49, the fp32 tensor scale
  check("mxfp4", 2 * 3920, 10 * 25 + 784 * 1);
  check("bf16", 0, 0);
  // an odd element count: E2M1 packs two a byte, ceil
  CHECK(weight_copy_bytes("nvfp4", 3, 5).copies == 8);
  CHECK(weight_copy_bytes("mxfp4", 3, 5).copies == 16);

  // the MLP 784-128-128-10 (mpt fp8's tiny config) under each recipe: the layers' sums
  const ModelShape m = mlp_shape({784, 128, 128, 10});
  Training t;
  t.optimizer = "sgd";
  t.recompute = "none";
  t.global_batch = t.microbatch = 128;
  Layout l;
  System s8 = test_system();
  s8.peak_fp8 = 600e12;
  const double mat = 784.0 * 128 + 128.0 * 128 + 128.0 * 10;
  auto est = [&](const std::string& r, const System& s) {
    t.recipe = r;
    return estimate(m, t, l, s);
  };
  CHECK(term(est("fp8-rowwise", s8), "fp8 weight copies") == 2 * mat);
  CHECK(term(est("fp8-rowwise", s8), "fp8 weight scales") == 4.0 * (128 + 784) + 4.0 * (128 + 128) + 4.0 * (10 + 128));
  CHECK(term(est("fp8-blockwise", s8), "fp8 weight copies") == mat);
  CHECK(term(est("fp8-blockwise", s8), "fp8 weight scales") == 4.0 * (7 + 1 + 1));
  CHECK(term(est("mxfp8", s8), "fp8 weight copies") == 2 * mat);
  CHECK(term(est("mxfp8", s8), "fp8 weight scales") == (128.0 * 25 + 784 * 4) + (128.0 * 4 + 128 * 4) + (10.0 * 4 + 128 * 1));
  // fp4: refused without the system's fp4 peak, as every recipe without its peak (peak_tflops.fp4: optional)
  CHECK_THROWS_AS(est("nvfp4", s8), std::invalid_argument);
  auto j4 = system_json();
  j4["peak_tflops"]["fp4"] = 1200;
  System s4 = parse_system(j4, "fp4.json");
  CHECK(s4.peak_fp4 == 1200e12);
  CHECK(s4.peak_for("mxfp4") == 1200e12);
  s4.peak_fp8 = 600e12;
  CHECK(term(est("nvfp4", s4), "fp4 weight copies") == mat / 2);
  CHECK(term(est("nvfp4", s4), "fp4 weight scales") == (8.0 * 49 + 4) + (8.0 * 8 + 4) + (1.0 * 8 + 4));
  CHECK(term(est("mxfp4", s4), "fp4 weight copies") == mat);
  CHECK(term(est("mxfp4", s4), "fp4 weight scales") == term(est("mxfp8", s8), "fp8 weight scales"));
  CHECK(term(est("nvfp4", s4), "weights") == 2 * count_params(m).total);  // bf16 weights, fp32 master
  CHECK(term(est("nvfp4", s4), "master weights") == 4 * count_params(m).total);

  // the GPT: per layer QKV [(h + 2kv)/t, h], projection [h, h/t], fc1 [f/t, h], fc2 [h, f/t] (h = 192, f = 768,
  // t = 2: 288x192, 192x96, 384x192, 192x384), not the biases, norms, embedding or head
  const ModelShape g = gpt(2, 192, 4, 64);
  Training tg;
  tg.recipe = "fp8-blockwise";
  tg.optimizer = "adam";
  tg.global_batch = 8;
  tg.microbatch = 1;
  Layout lg;
  lg.tp = 2;
  lg.dp = 8;
  REQUIRE(layout_error(g, tg, lg).empty());
  const Estimate eg = estimate(g, tg, lg, s8);
  CHECK(term(eg, "fp8 weight copies") == 2 * (288.0 * 192 + 192.0 * 96 + 384.0 * 192 + 192.0 * 384));
  // 128x128 blocks: ceil(288/128)·ceil(192/128) = 3·2, 2·1, 3·2, 2·3
  CHECK(term(eg, "fp8 weight scales") == 2 * 4.0 * (6 + 2 + 6 + 6));
}

TEST_CASE("MLP: pipeline stages of their own width, the schedule's held microbatches, the boundary messages",
          "[plan][mlp]") {
  // mpt pipeline's default network: 16 -> 64 (x7) -> 1, 8 layers on 4 stages of 2
  const ModelShape m = mlp_shape({16, 64, 64, 64, 64, 64, 64, 64, 1});
  Training t;
  t.recipe = "fp32";
  t.optimizer = "sgd";
  t.recompute = "none";
  t.global_batch = 64;
  t.microbatch = 16;  // m = 4
  Layout l;
  l.pp = 4;
  l.schedule = "1f1b";
  const System sys = test_system();
  REQUIRE(layout_error(m, t, l).empty());
  Estimate e = estimate(m, t, l, sys);
  REQUIRE(e.stages.size() == 4);
  const double b = 16;
  // per microbatch: stage 0 its inputs 16 + 64 and its last ReLU output 64; the middle stages 64 + 64
  // + 64; the last 64 + 64 and the loss input 1
  const double first = 4 * b * (16 + 64 + 64), mid = 4 * b * (64 + 64 + 64), last = 4 * b * (64 + 64) + 4 * b * 1;
  CHECK(e.stages[0].per_microbatch == first);
  CHECK(e.stages[1].per_microbatch == mid);
  CHECK(e.stages[3].per_microbatch == last);
  // 1F1B: stage s holds min(p - s, m) microbatches (Narayanan et al. 2021)
  CHECK(e.stages[0].held == 4);
  CHECK(e.stages[1].held == 3);
  CHECK(e.stages[3].held == 1);
  CHECK(e.stages[1].activations == 3 * mid);
  CHECK(e.stages[1].params == 2 * (64.0 * 64 + 64));
  CHECK(e.stages[1].layers == "2-3");
  // stage 1: 8 B/param (fp32 weights and gradients, SGD) of its 8320 and 3 microbatches: the most
  CHECK(e.stage == "middle");
  CHECK(term(e, "activations") == 3 * mid);
  // stages 1 and 2 have the most GEMM FLOPs (2·64·64 per sample each): the later is modelled, a middle
  // rank receiving its input and its output's gradient (b·64 floats each) and sending as many, per microbatch
  CHECK(e.comm_device == "middle stage (stage 2, layers 4-5)");
  CHECK(comm_bytes(e, "pp/recv") == 4 * 2 * b * 64 * 4);
  CHECK(comm_bytes(e, "pp/send") == 4 * 2 * b * 64 * 4);
  CHECK(comm_bytes(e, "dp/all_reduce") == 0);  // dp = 1
  // GPipe holds all m = 4 microbatches on every stage
  l.schedule = "gpipe";
  e = estimate(m, t, l, sys);
  for (const auto& st : e.stages) CHECK(st.held == 4);
  CHECK(term(e, "activations") == 4 * mid);
  // ZB-V: rank 0 runs the first and the last of 2p = 4 chunks (V placement): two sends per microbatch
  const ModelShape v = mlp_shape({8, 16, 16, 16, 1});
  Layout lv;
  lv.pp = 2;
  lv.virtual_stages = 2;
  lv.schedule = "zb-v";
  t.global_batch = 8;
  t.microbatch = 2;
  REQUIRE(layout_error(v, t, lv).empty());
  e = estimate(v, t, lv, sys);
  CHECK(e.comm_device.rfind("first stage", 0) == 0);
  CHECK(e.stages[0].layers == "0, 3");
  CHECK(comm_bytes(e, "pp/send") == 4 * (2 * 16 * 4 + 2 * 16 * 4));
}

TEST_CASE("MLP: layouts it cannot run are refused naming the keys", "[plan][mlp]") {
  const ModelShape m = mlp_shape({784, 128, 128, 10});
  Training t;
  t.global_batch = 512;
  t.microbatch = 64;
  Layout l;
  l.tp = 2;
  CHECK(layout_error(m, t, l).rfind("/layout/tp = 2: the MLP model is planned without tensor parallelism", 0) == 0);
  l.tp = 1;
  l.pp = 2;
  CHECK(layout_error(m, t, l) ==
        "/model/widths: the MLP's 3 Linear layers are not a multiple of /layout/pp · /layout/virtual_stages = 2 · 1");
  l.pp = 1;
  t.global_batch = 500;
  CHECK(layout_error(m, t, l).rfind("/train/global_batch = 500", 0) == 0);
  t.global_batch = 512;
  l.cp = 2;
  CHECK(layout_error(m, t, l).rfind("/layout/cp = 2", 0) == 0);
  l.cp = 1;
  CHECK(layout_error(mlp_shape({784}), t, l).rfind("/model/widths: expected at least 2 widths", 0) == 0);
}

TEST_CASE("GEMM time: the measured rate of its size, log-log between sizes, peak x efficiency without rates",
          "[plan][mlp]") {
  System s = test_system();  // fp32: 20 TFLOP/s x 0.5
  CHECK(s.gemm_seconds("fp32", 64, 32, 16) == Approx(2.0 * 64 * 32 * 16 / 10e12).epsilon(1e-12));
  auto j = system_json();
  j["gemm_tflops_by_n"] = {{"fp32", {{16, 1}, {64, 4}}}};
  s = parse_system(j, "t.json");
  // N = cbrt(mnk) = 32: halfway between 16 and 64 in log N, so sqrt(1 x 4) = 2 TFLOP/s
  CHECK(s.gemm_seconds("fp32", 32, 32, 32) == Approx(2.0 * 32 * 32 * 32 / 2e12).epsilon(1e-12));
  CHECK(s.gemm_seconds("fp32", 64, 32, 16) == Approx(2.0 * 64 * 32 * 16 / 2e12).epsilon(1e-12));  // same FLOPs
  CHECK(s.gemm_seconds("fp32", 8, 8, 8) == Approx(2.0 * 512 / 1e12).epsilon(1e-12));  // below: the smallest's rate
  // above the largest size: the larger of its rate and peak x efficiency (10 TFLOP/s here)
  CHECK(s.gemm_seconds("fp32", 128, 128, 128) == Approx(2.0 * 128 * 128 * 128 / 10e12).epsilon(1e-12));
  CHECK(s.gemm_seconds("bf16", 32, 32, 32) == Approx(2.0 * 32 * 32 * 32 / 150e12).epsilon(1e-12));  // no bf16 rates
  // the fp4 recipes read the fp4 rates, not fp8's: without them peak_fp4 x efficiency
  auto j4 = j;
  j4["peak_tflops"]["fp8"] = 600;
  j4["peak_tflops"]["fp4"] = 1200;
  j4["gemm_tflops_by_n"]["fp8"] = {{16, 1}, {64, 4}};
  s = parse_system(j4, "t.json");
  CHECK(s.gemm_seconds("mxfp8", 32, 32, 32) == Approx(2.0 * 32 * 32 * 32 / 2e12).epsilon(1e-12));
  CHECK(s.gemm_seconds("nvfp4", 32, 32, 32) == Approx(2.0 * 32 * 32 * 32 / 600e12).epsilon(1e-12));
  j4["gemm_tflops_by_n"]["fp4"] = {{16, 2}, {64, 8}};
  s = parse_system(j4, "t.json");
  CHECK(s.gemm_seconds("mxfp4", 32, 32, 32) == Approx(2.0 * 32 * 32 * 32 / 4e12).epsilon(1e-12));
  auto bad = j;
  bad["gemm_tflops_by_n"]["fp32"] = {{64, 1}, {16, 4}};
  CHECK_THROWS_WITH(parse_system(bad, "t.json"),
                    Catch::Contains("t.json: /gemm_tflops_by_n/fp32/1: expected N in [1, 10^7], above the previous pair's"));
  bad["gemm_tflops_by_n"]["fp32"] = {{16, 0}};
  CHECK_THROWS_WITH(parse_system(bad, "t.json"), Catch::Contains("/gemm_tflops_by_n/fp32/0: expected TFLOP/s"));
  bad["gemm_tflops_by_n"] = {{"fp64", {{16, 1}}}};
  CHECK_THROWS_WITH(parse_system(bad, "t.json"), Catch::Contains("/gemm_tflops_by_n/fp64: unknown field"));
  bad = j;
  bad["pass_overhead_us"] = "1";
  CHECK_THROWS_WITH(parse_system(bad, "t.json"), Catch::Contains("/pass_overhead_us: expected a number"));
  bad = j;
  bad["op_overhead_us"] = -1;
  CHECK_THROWS_WITH(parse_system(bad, "t.json"), Catch::Contains("/op_overhead_us: expected a number in [0, 1e+06]"));
}

TEST_CASE("MLP step time: each GEMM the step runs, its operators' dispatch, gradient accumulation", "[plan][mlp]") {
  const ModelShape m = mlp_shape({784, 128, 128, 10});
  Training t = fp32_sgd(512, 128);
  auto j = system_json();
  j["op_overhead_us"] = 5;
  j["pass_overhead_us"] = 20;
  const System sys = parse_system(j, "t.json");
  // forward: 3 addmm + 2 ReLU + the loss's 3; backward: 3 dW, 3 bias sums, 2 dX (none for layer 0), 2 ReLU, 3
  const MlpOperators o = mlp_operators(m, t, 128, 0, 3, sys);
  CHECK(o.forward == 3 + 2 + 3);
  CHECK(o.backward == 3 + 3 + 2 + 2 + 3);
  const double g0 = 2.0 * 128 * 784 * 128 / 10e12, g1 = 2.0 * 128 * 128 * 128 / 10e12, g2 = 2.0 * 128 * 128 * 10 / 10e12;
  CHECK(o.gemm_forward_s == Approx(g0 + g1 + g2).epsilon(1e-12));
  CHECK(o.gemm_backward_s == Approx(g0 + 2 * g1 + 2 * g2).epsilon(1e-12));
  // dropout: its mask and multiply forward, one backward, after each hidden layer; full recompute: the forward again
  ModelShape md = m;
  md.dropout = true;
  Training full = t;
  full.recompute = "full";
  const MlpOperators od = mlp_operators(md, full, 128, 0, 3, sys);
  CHECK(od.forward == 8 + 2 * 2);
  CHECK(od.backward == 13 + 2 * 1 + od.forward);
  CHECK(od.gemm_backward_s == Approx(o.gemm_backward_s + o.gemm_forward_s).epsilon(1e-12));
  CHECK_THROWS_AS(mlp_operators(m, t, 128, 1, 4, sys), std::invalid_argument);
  // the estimate: 4 microbatches of 128 on one device
  Layout l;
  const Estimate e = estimate(m, t, l, sys);
  CHECK(term(e, "compute") == Approx(4 * (o.gemm_forward_s + o.gemm_backward_s)).epsilon(1e-12));
  CHECK(term(e, "dispatch") == Approx(4 * (21 * 5e-6 + 20e-6)).epsilon(1e-12));  // + the pass's, per microbatch
  const double psi = 118282;  // 3 microbatches after the first add 2 x 3 operators and 3 x 4 psi bytes each
  CHECK(term(e, "gradient accumulation") == Approx(3 * (6 * 5e-6 + 12 * psi / 2000e9)).epsilon(1e-12));
  double sum = 0;
  for (const auto& x : e.time) sum += x.value;
  CHECK(sum == Approx(e.step_s).epsilon(1e-12));  // the terms add up to the step
  // one microbatch: nothing accumulated
  t.microbatch = 512;
  CHECK(term(estimate(m, t, l, sys), "gradient accumulation") == 0);
}

TEST_CASE("system files: a measured GEMM rate above its format's peak is refused (MFU would pass 100 %)", "[plan]") {
  auto j = system_json();  // fp32 peak 20 TFLOP/s
  j["gemm_tflops_by_n"] = {{"fp32", {{16, 1}, {64, 20}}}};
  CHECK_NOTHROW(parse_system(j, "t.json"));
  j["gemm_tflops_by_n"]["fp32"][1][1] = 20.5;
  CHECK_THROWS_WITH(parse_system(j, "t.json"),
                    Catch::Contains("/gemm_tflops_by_n/fp32/1: expected TFLOP/s at most /peak_tflops/fp32 = 20, got 20.5"));
}

TEST_CASE("MLP step time: the compute term is the GEMMs' own time, whatever the overheads beside it", "[plan][mlp]") {
  // a GEMM of 2 FLOPs beside overheads of a quarter of a second: the difference of sums would lose it
  const ModelShape m = mlp_shape({1, 1, 1});
  Training t = fp32_sgd(64, 16);
  auto j = system_json();
  j["gemm_tflops_by_n"] = {{"fp32", {{16, 20}}}};
  j["op_overhead_us"] = 274746.19;
  j["pass_overhead_us"] = 664727.93;
  const System sys = parse_system(j, "t.json");
  const Estimate e = estimate(m, t, Layout{}, sys);
  const MlpOperators o = mlp_operators(m, t, 16, 0, 2, sys);
  CHECK(term(e, "compute") == Approx(4 * (o.gemm_forward_s + o.gemm_backward_s)).epsilon(1e-12));
  CHECK(term(e, "compute") > 0);
}
