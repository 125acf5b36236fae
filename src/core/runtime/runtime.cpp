// Devices, capabilities, seeding, environment. See runtime.hpp.
#include "core/runtime/runtime.hpp"

#include "core/runtime/cpu_load.hpp"
#include "core/runtime/timing.hpp"
#include "core/numerics/rounding_simd.hpp"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <cerrno>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include "core/runtime/compat.hpp"
#ifdef MPT_WITH_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAFunctions.h>
#endif
#include <spdlog/spdlog.h>

#include "core/errors.hpp"

namespace mpt {

torch::Device choose_device(const std::string& want) {
  if (want == "cpu") return torch::Device(torch::kCPU);
  const bool cuda = compat::cuda_available();
  if (want == "auto") return cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (want == "cuda") {
    if (!compat::kBuiltWithCuda)
      throw RuntimeFailure("--device cuda: this mpt was built against a CPU-only LibTorch (" +
                           compat::torch_version() + "); rebuild with a CUDA LibTorch (scripts/setup.sh --torch pip)");
    if (!cuda) throw RuntimeFailure("--device cuda: no CUDA device is available on this machine");
    return torch::Device(torch::kCUDA, 0);
  }
  throw RuntimeFailure("unknown device \"" + want + "\" (expected auto, cpu or cuda)");
}

namespace {

std::set<std::string> cpu_flags();  // defined with the hardware fingerprint below
int onednn_effective_isa();         // dnnl_get_effective_cpu_isa(), or -1 where not exported
std::string dnnl_isa_name(int v);   // "avx2", "avx512_core", ...

// Whether LibTorch 1.13's CPU bf16 matrix product would abort the process rather than fail.
// 1.13 hands bf16 GEMMs to oneDNN whenever the CPU has AVX-512 BW/VL/DQ
// (aten/src/ATen/native/mkldnn/Utils.h, mkldnn_bf16_device_check(): cpuinfo, blind to oneDNN's
// ISA cap), and oneDNN 2.6 has no bf16 matmul below avx512_core: under ONEDNN_MAX_CPU_ISA /
// DNNL_MAX_CPU_ISA=AVX2 on such a CPU it throws dnnl::error ("could not create a primitive
// descriptor iterator") inside a noexcept frame of libtorch_cpu, which calls std::terminate —
// nothing can catch it, so the probe must not run it. LibTorch 2.x asks oneDNN itself
// (ideep::has_bf16_type_support()), which honours the cap, and falls back to its own GEMM.
// Returns the reason, or "" when the product is safe to run.
std::string bf16_matmul_would_abort(torch::Device device, torch::ScalarType dtype) {
  if (compat::kTorch2 || !device.is_cpu() || dtype != torch::kBFloat16) return "";
  const auto f = cpu_flags();
  if (!(f.count("avx512bw") && f.count("avx512vl") && f.count("avx512dq"))) return "";
  const int isa = onednn_effective_isa();
  constexpr int kAvx512Core = 0x27;  // dnnl_cpu_isa_avx512_core (dnnl_types.h, v2.6)
  if (isa < 0 || (isa & kAvx512Core) == kAvx512Core) return "";
  return fmt::format("LibTorch {}'s BFloat16 matrix product would abort the process: it sends bf16 GEMMs to oneDNN "
                     "on any CPU with AVX-512 BW/VL/DQ, but oneDNN is capped below avx512_core here (effective ISA "
                     "{}, from ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA), where it has no bf16 matmul and throws through a "
                     "noexcept frame (\"could not create a primitive descriptor\")",
                     compat::torch_version(), dnnl_isa_name(isa));
}

// probe_kernels' speed check: a native product in `dtype` against its emulation (the fp32
// product of the same rounded values, its result rounded to the dtype: core/train/amp's
// emulated path per GEMM). The values lie in [-1, 1) so neither side meets subnormals.
void time_against_emulation(KernelProbe& p, torch::ScalarType dtype) {
  try {
    torch::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(12345);  // not the global generator: seeds stay the user's
    auto a32 = (torch::rand({128, 128}, gen, torch::kFloat32) * 2 - 1).to(dtype).to(torch::kFloat32);
    auto b32 = (torch::rand({128, 128}, gen, torch::kFloat32) * 2 - 1).to(dtype).to(torch::kFloat32);
    auto a = a32.to(dtype), b = b32.to(dtype);
    auto native = [&] { (void)torch::mm(a, b); };
    auto emulated = [&] { (void)torch::mm(a32, b32).to(dtype).to(torch::kFloat32); };
    // One native call first: where it is very slow (hundreds of times fp32), that one call is
    // the warm-up, and three more cost tens of milliseconds, once per process.
    native();
    emulated();
    p.emulated_gemm_s = fastest_seconds(emulated, 3);
    p.native_gemm_s = fastest_seconds(native, 3);
  } catch (const c10::Error& e) {
    return;  // the products ran above: a failure here leaves the speed unknown, taken as fast
  }
  const double ratio = p.native_gemm_s / std::max(p.emulated_gemm_s, 1e-9);
  if (ratio > kNativeSlowdownLimit) {
    p.fast = false;
    p.reason = fmt::format("native {} matrix products run on this CPU but {:.0f}x slower than emulating them "
                           "(128^3: {:.3g} ms vs {:.3g} ms, the fastest of 3; limit {:g}x): emulated is the faster path, "
                           "train.compute=native still takes them",
                           c10::toString(dtype), ratio, p.native_gemm_s * 1e3, p.emulated_gemm_s * 1e3,
                           kNativeSlowdownLimit);
  }
}

KernelProbe run_probe(torch::Device device, torch::ScalarType dtype) {
  const auto name = std::string(c10::toString(dtype));
  KernelProbe p;
  if (auto why = bf16_matmul_would_abort(device, dtype); !why.empty()) {
    p.reason = why;
    return p;
  }
  try {
    torch::NoGradGuard no_grad;
    auto opts = torch::TensorOptions().dtype(dtype).device(device);
    auto a = torch::ones({2, 2}, opts);
    auto c = torch::matmul(a, a);
    if (c.scalar_type() != dtype || c.sum().item<double>() != 8.0) {
      p.reason = fmt::format("a 2x2 {} matmul gave {} (expected 8)", name, c.sum().item<double>());
      return p;
    }
  } catch (const c10::Error& e) {
    p.reason = fmt::format("a 2x2 {} matmul failed: {}", name, e.what_without_backtrace());
    return p;
  }
  try {
    // A linear layer's three GEMMs (output, input gradient, weight gradient). Every value is a
    // small multiple of a power of two, exact in fp16 and bf16, so the exact results are known.
    auto opts = torch::TensorOptions().dtype(dtype).device(device);
    auto x = torch::full({256, 128}, 0.5, opts).requires_grad_(true);
    auto w = torch::full({384, 128}, 0.25, opts).requires_grad_(true);
    auto b = torch::full({384}, 1.0, opts).requires_grad_(true);
    auto y = torch::nn::functional::linear(x, w, b);  // 128 * 0.125 + 1 = 17
    y.backward(torch::ones_like(y));                  // dx = 384 * 0.25 = 96, dW = 256 * 0.5 = 128, db = 256
    auto all = [](const torch::Tensor& t, double v) { return t.to(torch::kDouble).eq(v).all().item<bool>(); };
    if (y.scalar_type() != dtype || !all(y, 17.0) || !all(w.grad(), 128.0) || !all(b.grad(), 256.0)) {
      p.reason = fmt::format("a 256x128 -> 384 {} linear layer gave wrong values", name);
      return p;
    }
    p.runs = true;
    if (!all(x.grad(), 96.0)) {
      p.reason = fmt::format("{} matrix products accumulate in {} (a sum of 384 x 0.25 gave {:g}, not 96); "
                             "emulation accumulates in fp32, as GPUs and oneDNN do",
                             name, name, x.grad().to(torch::kDouble).max().item<double>());
      return p;
    }
    p.fp32_accumulation = true;
  } catch (const c10::Error& e) {
    p.reason = fmt::format("a 256x128 -> 384 {} linear layer (forward and backward) failed: {}", name,
                           e.what_without_backtrace());
    return p;
  }
  if (!device.is_cpu()) return p;  // GPUs' low-precision products are their fast path
  time_against_emulation(p, dtype);
  return p;
}

}  // namespace

KernelProbe probe_kernels(torch::Device device, torch::ScalarType dtype) {
  static std::mutex mu;
  static std::map<std::pair<std::string, int>, KernelProbe> cache;
  const auto key = std::make_pair(device.str(), static_cast<int>(dtype));
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  KernelProbe p = run_probe(device, dtype);
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(key, p).first->second;
}

bool native_matmul(torch::Device device, torch::ScalarType dtype) { return probe_kernels(device, dtype).native(); }

Compute resolve_compute(const std::string& request, Format f, torch::Device device) {
  if (request != "auto" && request != "native" && request != "emulated")
    throw std::invalid_argument("compute mode: expected auto, native or emulated, got \"" + request + "\"");
  if (f == Format::FP32) return Compute::Native;
  if (f == Format::FP8_E4M3 || f == Format::FP8_E5M2) {
    if (request == "native") throw RuntimeFailure("native " + format_name(f) + " compute: mpt has no native fp8 path; use emulated");
    return Compute::Emulated;
  }
  if (request == "emulated") return Compute::Emulated;
  const KernelProbe probe = probe_kernels(device, storage_dtype(f));
  if (request == "native" && probe.runs) {  // an explicit choice: taken where the kernels run
    if (!probe.native()) spdlog::warn("native {} compute as asked, although {}", format_name(f), probe.reason);
    return Compute::Native;
  }
  const bool has = probe.native();
  if (request == "native" && !has)
    throw RuntimeFailure(fmt::format("native {} compute: LibTorch {} has no working {} matrix product on {} ({}); "
                                     "use emulated (or a LibTorch 2.x build: scripts/setup.sh --torch pip)",
                                     format_name(f), compat::torch_version(), format_name(f), device.str(),
                                     probe.reason));
  return has ? Compute::Native : Compute::Emulated;
}

ThreadPolicy choose_threads(int64_t requested, int cores, int local_processes, const char* omp_num_threads) {
  ThreadPolicy p;
  p.cores = std::max(1, cores);
  p.local_processes = std::max(1, local_processes);
  if (requested > 0) {
    p.intra_op = static_cast<int>(requested);
    p.source = "config";
    return p;
  }
  // OMP_NUM_THREADS is how users of PyTorch set the count: taken when /threads does not say.
  if (omp_num_threads && *omp_num_threads) {
    char* end = nullptr;
    const long n = std::strtol(omp_num_threads, &end, 10);
    if (*end == '\0' && n >= 1 && n <= 1024) {
      p.intra_op = static_cast<int>(n);
      p.source = "OMP_NUM_THREADS";
      return p;
    }
    spdlog::warn("OMP_NUM_THREADS={}: not a thread count from 1 to 1024; ignored", omp_num_threads);
  }
  p.intra_op = std::max(1, p.cores / p.local_processes);
  p.source = "auto";
  return p;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int local_processes_from_environment() {
  auto positive = [](const char* name) -> int {
    const char* v = std::getenv(name);
    if (!v) return 0;
    const long n = std::isdigit(static_cast<unsigned char>(*v)) ? std::strtol(v, nullptr, 10) : 0;  // "4(x2)" -> 4
    if (n > 0 && n <= 1 << 20) return static_cast<int>(n);
    spdlog::warn("{}={}: not a process count; ignored for the thread policy", name, v);
    return 0;
  };
  // Each launcher's count only under that launcher (as dist::launch_from_environment tells them
  // apart): a stray LOCAL_WORLD_SIZE in a plain shell, or an salloc shell's SLURM_NTASKS_PER_NODE
  // outside any srun step, is no process of this run (a stray LOCAL_WORLD_SIZE=8 would cut one
  // process to 1 thread).
  auto set = [](const char* name) { return std::getenv(name) != nullptr; };
  std::vector<const char*> names;
  if (set("MPT_RANK")) names = {"MPT_WORLD_SIZE"};
  else if (set("RANK") && set("WORLD_SIZE")) names = {"LOCAL_WORLD_SIZE"};
  else if (set("SLURM_PROCID") && set("SLURM_NTASKS")) names = {"SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"};
  for (const char* name : names)
    if (const int n = positive(name)) return n;
  return 1;
}

std::vector<int> bind_cpus(const std::vector<int>& allowed, int local_rank, int local_processes, int intra_op) {
  if (local_processes < 2 || local_rank < 0 || local_rank >= local_processes || intra_op < 1) return {};
  const auto need = static_cast<std::size_t>(local_processes) * static_cast<std::size_t>(intra_op);
  if (need > allowed.size()) return {};
  const auto first = allowed.begin() + static_cast<std::ptrdiff_t>(local_rank) * intra_op;
  return {first, first + intra_op};
}

int local_rank_from_environment() {
  auto index = [](const char* name) {
    const char* v = std::getenv(name);
    if (!v) return -1;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    return end != v && *end == '\0' && r >= 0 && r < (1L << 20) ? static_cast<int>(r) : -1;
  };
  // The launcher as local_processes_from_environment tells it: mpt --nproc, torchrun, srun.
  if (std::getenv("MPT_RANK")) return index("MPT_LOCAL_RANK");
  if (std::getenv("RANK") && std::getenv("WORLD_SIZE")) return index("LOCAL_RANK");
  if (std::getenv("SLURM_PROCID") && std::getenv("SLURM_NTASKS")) return index("SLURM_LOCALID");
  return -1;
}

namespace {

/// "0-3,6" for {0, 1, 2, 3, 6}.
std::string cpu_list(const std::vector<int>& cpus) {
  std::string s;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    s += fmt::format("{}{}", s.empty() ? "" : ",", j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]));
    i = j + 1;
  }
  return s;
}

/// Binds every thread of this process (/proc/self/task) to `cpus`; threads started later inherit
/// their creator's set. Returns the threads it could not bind (a thread that ended meanwhile is not one).
int bind_process(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  int failed = sched_setaffinity(0, sizeof(set), &set) == 0 ? 0 : 1;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const pid_t tid = static_cast<pid_t>(std::strtol(e.path().filename().c_str(), nullptr, 10));
    if (tid > 0 && sched_setaffinity(tid, sizeof(set), &set) != 0 && errno != ESRCH) ++failed;
  }
  return failed;
}

/// Binds this process as bind_cpus says (MPT_CPU_BIND=none: not at all); what it did, for
/// ThreadPolicy::cpu_bind.
std::string bind_to_own_cores(const ThreadPolicy& p) {
  if (const char* v = std::getenv("MPT_CPU_BIND"); v && std::string(v) == "none") return "none: MPT_CPU_BIND=none";
  if (p.local_processes < 2) return "none: one process on this machine";
  if (static_cast<int64_t>(p.local_processes) * p.intra_op > p.cores)
    return fmt::format("none: {} process(es) x {} thread(s) do not fit {} core(s)", p.local_processes, p.intra_op, p.cores);
  // The wait policy's measure (src/app/main.cpp): a process that keeps a core busy would share a
  // bound rank's core for the whole run, while an unbound rank moves to the less loaded one.
  if (const double others = start_runnable_others(); others >= 0.5)
    return fmt::format("none: {:.2f} other runnable threads at start (a busy core would slow the rank bound to it)",
                       others);
  const int lr = local_rank_from_environment();
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> allowed;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) allowed.push_back(c);
  const std::vector<int> cpus = bind_cpus(allowed, lr, p.local_processes, p.intra_op);
  if (cpus.empty())
    return lr < 0 ? "none: no local rank (MPT_LOCAL_RANK, LOCAL_RANK, SLURM_LOCALID)"
                  : fmt::format("none: local rank {} of {} processes", lr, p.local_processes);
  if (const int failed = bind_process(cpus); failed > 0)
    return fmt::format("none: sched_setaffinity failed for {} thread(s)", failed);
  return fmt::format("cpus {} of {} (local rank {} of {})", cpu_list(cpus), cpu_list(allowed), lr, p.local_processes);
}

}  // namespace

ThreadPolicy apply_threads(int64_t requested) {
  ThreadPolicy p =
      choose_threads(requested, usable_cores(), local_processes_from_environment(), std::getenv("OMP_NUM_THREADS"));
  // Every process of the machine computes the same policy: the first local one says it, once.
  auto first_local_process = [] {
    for (const char* name : {"MPT_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID"})
      if (const char* v = std::getenv(name)) return std::string(v) == "0";
    return true;
  };
  if (static_cast<int64_t>(p.intra_op) * p.local_processes > p.cores && first_local_process())
    spdlog::warn("{} intra-op threads in each of {} process(es) on {} usable core(s): the cores are oversubscribed and "
                 "step times will vary ({})",
                 p.intra_op, p.local_processes, p.cores,
                 p.intra_op == 1              ? "more processes than cores: each already runs one thread"
                 : p.source == "OMP_NUM_THREADS" ? "unset OMP_NUM_THREADS, or lower it, for max(1, cores / processes)"
                                                 : "set threads to 0 for max(1, cores / processes)");
  // Before set_num_threads: the intra-op pool it starts inherits the binding.
  p.cpu_bind = bind_to_own_cores(p);
  torch::set_num_threads(p.intra_op);
  resolve_vml_dispatch();
  return p;
}

namespace {
std::atomic<bool> g_vml_resolved{false};
}  // namespace

const std::vector<VmlOp>& vml_routed_ops() {
  static const std::vector<VmlOp> ops{
      {"acos", &at::acos}, {"asin", &at::asin},     {"atan", &at::atan}, {"cos", &at::cos},     {"erf", &at::erf},
      {"erfc", &at::erfc}, {"erfinv", &at::erfinv}, {"exp", &at::exp},   {"log", &at::log},     {"log10", &at::log10},
      {"log2", &at::log2}, {"sin", &at::sin},       {"sqrt", &at::sqrt}, {"tan", &at::tan},     {"tanh", &at::tanh},
      {"trunc", &at::trunc}};
  return ops;
}

bool resolve_vml_dispatch() {
  static const bool has_mkl = [] {
    // No grad mode, no autocast: plain ATen kernels. One element is below every grain size
    // (TensorIterator's 32768, the VML kernels' 2048), so each call runs here, in one thread.
    c10::InferenceMode guard;
    for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
      const auto x = torch::full({1}, 0.5, torch::TensorOptions().dtype(dtype));
      for (const auto& op : vml_routed_ops()) (void)op.fn(x);
    }
    g_vml_resolved = true;
    return at::hasMKL();
  }();
  return has_mkl;
}

json to_json(const ThreadPolicy& p) {
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  const char* by_mpt = std::getenv("MPT_OMP_WAIT_POLICY_DEFAULT");
  const double others = start_runnable_others();
  const std::string measured = others >= 0 ? fmt::format("{:.2f} other runnable threads at start", others) : "";
  std::string source = "libgomp's default (spin, then sleep)";
  if (wait && by_mpt && std::string(by_mpt) == wait)
    source = fmt::format("mpt's default: {} (>= 0.5: another process keeps a core busy; src/app/main.cpp)", measured);
  else if (wait)
    source = "environment";
  else if (others >= 0)
    source = fmt::format("mpt's default: libgomp's (spin, then sleep), {} ({})", measured,
                         others < 0.5 ? "< 0.5" : "kept by MPT_OMP_WAIT_POLICY_DEFAULT");
  return {{"intra_op", p.intra_op},
          {"cores", p.cores},
          {"local_processes", p.local_processes},
          {"source", p.source},
          {"cpu_bind", p.cpu_bind},
          {"omp_wait_policy", wait ? json(wait) : json(nullptr)},
          {"omp_wait_policy_source", source},
          {"runnable_others_at_start", others >= 0 ? json(std::round(others * 100) / 100) : json(nullptr)}};
}

void seed_all(std::uint64_t seed) { torch::manual_seed(seed); }

torch::Tensor generator_state(at::Generator g) {
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

void set_generator_state(at::Generator g, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(state);
}

json environment(torch::Device device) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const KernelProbe fp16 = probe_kernels(device, torch::kHalf), bf16 = probe_kernels(device, torch::kBFloat16);
  json env = {
      {"torch", compat::torch_version()},
      {"device", device.str()},
      {"cuda", device.is_cuda()},
      {"cuda_build", compat::kBuiltWithCuda},
      {"fp16_compute", fp16.native() ? "native" : "emulated"},
      {"bf16_compute", bf16.native() ? "native" : "emulated"},
      {"threads", torch::get_num_threads()},
      {"host", host},
      {"compiler", fmt::format("{} {}", "gcc", __VERSION__)},
      {"mpt", MPT_VERSION},
  };
  if (!fp16.native()) env["fp16_compute_reason"] = fp16.reason;
  if (!bf16.native()) env["bf16_compute_reason"] = bf16.reason;
  env["hardware"] = hardware_fingerprint();
  // The vector level of core/numerics/rounding_simd's fp16 / bf16 rounding loops (MPT_SIMD or the CPU's
  // best; every level gives the same values). Throws ConfigError for a bad MPT_SIMD.
  env["hardware"]["rounding_simd"] = simd::level_name(simd::active_level());
  return env;
}

// ---------------------------------------------------------------------------------------------
// Hardware fingerprint
// ---------------------------------------------------------------------------------------------
namespace {

/// "key: value" lines of /proc/cpuinfo's first processor.
std::map<std::string, std::string> cpuinfo_first() {
  std::map<std::string, std::string> out;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) break;  // end of the first processor's block
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto trim = [](std::string v) {
      v.erase(0, v.find_first_not_of(" \t"));
      v.erase(v.find_last_not_of(" \t") + 1);
      return v;
    };
    out[trim(line.substr(0, colon))] = trim(line.substr(colon + 1));
  }
  return out;
}

// The word after `prefix` in at::show_config()'s text (letters, digits, '.', '_'), e.g.
// "AVX2" after "CPU capability usage: "; "unknown" when absent.
std::string show_config_field(const std::string& config, const std::string& prefix) {
  auto at = config.find(prefix);
  if (at == std::string::npos) return "unknown";
  at += prefix.size();
  auto end = at;
  while (end < config.size() && (std::isalnum(static_cast<unsigned char>(config[end])) || config[end] == '.' ||
                                 config[end] == '_'))
    ++end;
  return end > at ? config.substr(at, end - at) : std::string("unknown");
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string(fallback);
}

// oneDNN's dnnl_cpu_isa_t values (include/oneapi/dnnl/dnnl_types.h, v2.6 and v3.x).
std::string dnnl_isa_name(int v) {
  static const std::map<int, std::string> names = {
      {0x0, "default"},         {0x1, "sse41"},           {0x3, "avx"},
      {0x7, "avx2"},            {0x407, "avx2_vnni"},     {0xc07, "avx2_vnni_2"},
      {0xf, "avx512_mic"},      {0x1f, "avx512_mic_4ops"}, {0x27, "avx512_core"},
      {0x67, "avx512_core_vnni"}, {0xe7, "avx512_core_bf16"}, {0x1ef, "avx512_core_fp16"},
      {0x3e7, "avx512_core_amx"}, {0x3ef, "avx512_core_amx_fp16"}, {0x1e7, "avx10_1_512"},
  };
  auto it = names.find(v);
  return it != names.end() ? it->second : fmt::format("0x{:x}", v);
}

// The ISA oneDNN would pick from the CPU's flags under a cap, in oneDNN's order (used where
// oneDNN's C API is not exported, as in PyPI's LibTorch, which links oneDNN statically).
std::string derived_dnnl_isa(const std::set<std::string>& f, const std::string& cap) {
  std::vector<std::pair<std::string, bool>> order = {
      {"avx512_core_amx", f.count("amx_tile") && f.count("amx_bf16") && f.count("avx512_bf16")},
      {"avx512_core_fp16", f.count("avx512_fp16") && f.count("avx512_bf16")},
      {"avx512_core_bf16", f.count("avx512_bf16") && f.count("avx512bw")},
      {"avx512_core_vnni", f.count("avx512_vnni") && f.count("avx512bw")},
      {"avx512_core", f.count("avx512f") && f.count("avx512bw") && f.count("avx512vl") && f.count("avx512dq")},
      {"avx2_vnni", f.count("avx_vnni") && f.count("avx2")},
      {"avx2", f.count("avx2") > 0},
      {"avx", f.count("avx") > 0},
      {"sse41", f.count("sse4_1") > 0},
  };
  std::string c = cap;
  std::transform(c.begin(), c.end(), c.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  bool allowed = c.empty() || c == "all" || c == "default";
  for (const auto& [isa, has] : order) {
    if (!allowed && isa == c) allowed = true;  // the cap and everything below it
    if (allowed && has) return isa;
  }
  return "default";
}

/// The resolved path of the first loaded library whose file name contains `needle`.
std::string loaded_library(const std::vector<std::string>& needles) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    std::string file = path.substr(path.rfind('/') + 1);
    for (const auto& n : needles)
      if (file.find(n) != std::string::npos) return path;
  }
  return "";
}

template <typename Fn>
Fn find_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

/// The first processor's feature flags in /proc/cpuinfo ("flags", or "Features" on Arm).
std::set<std::string> cpu_flags() {
  auto info = cpuinfo_first();
  std::set<std::string> flags;
  std::istringstream in(info.count("flags") ? info["flags"] : info["Features"]);
  for (std::string f; in >> f;) flags.insert(f);
  return flags;
}

int onednn_effective_isa() {
  auto get_isa = find_symbol<int (*)()>("dnnl_get_effective_cpu_isa");
  return get_isa ? get_isa() : -1;
}

}  // namespace

json hardware_fingerprint() {
  json hw;
  // --- CPU ---
  auto info = cpuinfo_first();
  const std::set<std::string> flags = cpu_flags();
  json isa = json::object();
  for (const char* f : {"avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
                        "amx_bf16", "amx_int8", "avx_vnni", "f16c", "fma"})
    isa[f] = flags.count(f) > 0;
  hw["cpu"] = {
      {"model", info.count("model name") ? info["model name"] : "unknown"},
      {"vendor", info.count("vendor_id") ? info["vendor_id"] : "unknown"},
      {"logical_cpus", static_cast<int>(std::thread::hardware_concurrency())},
      {"isa", isa},
  };
  // --- LibTorch's kernels ---
  const std::string config = at::show_config();
  hw["aten_cpu_capability"] = show_config_field(config, "CPU capability usage: ");
  json dnnl = {{"version", show_config_field(config, "MKL-DNN v")}};
  const std::string cap = env_or("ONEDNN_MAX_CPU_ISA", env_or("DNNL_MAX_CPU_ISA", "").c_str());
  dnnl["max_cpu_isa_env"] = cap.empty() ? json(nullptr) : json(cap);
  if (const int effective = onednn_effective_isa(); effective >= 0) {
    dnnl["isa"] = dnnl_isa_name(effective);
    dnnl["isa_source"] = "oneDNN (dnnl_get_effective_cpu_isa)";
  } else {
    dnnl["isa"] = derived_dnnl_isa(flags, cap);
    dnnl["isa_source"] = "derived from the CPU flags and the ISA cap (oneDNN's API is not exported by this LibTorch)";
  }
  hw["onednn"] = dnnl;
  std::string blas_lib = loaded_library({"libmkl_", "libopenblas", "libblis", "libblas", "libflexiblas"});
  if (blas_lib.empty() && show_config_field(config, "BLAS_INFO=") == "mkl")
    blas_lib = "MKL, linked into libtorch_cpu";
  hw["blas"] = {{"build", show_config_field(config, "BLAS_INFO=")},
                {"library", blas_lib.empty() ? "unknown" : blas_lib}};
  if (at::hasMKL()) {
    // "... Math Kernel Library Version 2024.2-Product Build 20240605 ..." -> "2024.2-Product Build 20240605"
    const std::string key = "Math Kernel Library Version ";
    const auto pos = config.find(key);
    const auto from = pos == std::string::npos ? pos : pos + key.size();
    const auto to = from == std::string::npos ? from : config.find(" for ", from);
    hw["blas"]["mkl_version"] = to == std::string::npos ? std::string("unknown") : config.substr(from, to - from);
    hw["blas"]["vml_first_calls"] = g_vml_resolved ? "resolved in one thread at start (pytorch/pytorch#188792)"
                                                   : "not resolved: this process never applied its threads";
  }
  hw["threads"] = {{"intra_op", at::get_num_threads()}, {"inter_op", at::get_num_interop_threads()}};
  json vars = json::object();
  for (const char* v : {"OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                        "DNNL_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "OPENBLAS_CORETYPE",
                        "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE"})
    if (const char* x = std::getenv(v)) vars[v] = x;
  hw["kernel_env"] = vars;
  // --- versions ---
  hw["torch"] = compat::torch_version();
  json cuda = {{"build", compat::kBuiltWithCuda}};
  if (compat::kBuiltWithCuda) {
    cuda["version_build"] = show_config_field(config, "CUDA_VERSION=");
    cuda["cudnn_build"] = show_config_field(config, "CUDNN_VERSION=");
    int v = 0;
    if (auto f = find_symbol<int (*)(int*)>("cudaRuntimeGetVersion"); f && f(&v) == 0)
      cuda["runtime"] = fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
    if (auto f = find_symbol<int (*)(int*)>("cudaDriverGetVersion"); f && f(&v) == 0 && v > 0)
      cuda["driver"] = fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
    if (auto f = find_symbol<std::size_t (*)()>("cudnnGetVersion")) {
      const auto c = static_cast<long>(f());
      cuda["cudnn_runtime"] = c >= 90000 ? fmt::format("{}.{}.{}", c / 10000, (c % 10000) / 100, c % 100)
                                         : fmt::format("{}.{}.{}", c / 1000, (c % 1000) / 100, c % 100);
    }
    if (auto f = find_symbol<int (*)(int*)>("ncclGetVersion"); f && f(&v) == 0)
      cuda["nccl"] = v >= 10000 ? fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
                                : fmt::format("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100);
  }
  json gpus = json::array();
#ifdef MPT_WITH_CUDA
  if (compat::cuda_available()) {
    for (int i = 0; i < static_cast<int>(torch::cuda::device_count()); ++i) {
      const auto* p = at::cuda::getDeviceProperties(i);
      gpus.push_back({{"index", i},
                      {"name", p->name},
                      {"compute_capability", fmt::format("{}.{}", p->major, p->minor)},
                      {"memory_bytes", static_cast<int64_t>(p->totalGlobalMem)},
                      {"multiprocessors", p->multiProcessorCount}});
    }
  }
#endif
  cuda["gpus"] = gpus;
  hw["cuda"] = cuda;
  return hw;
}

torch::Device cuda_device_for_rank(int local_rank) {
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (local_rank < 0 || local_rank >= count)
    throw RuntimeFailure(fmt::format("local rank {} has no GPU of its own: this machine has {} CUDA device(s) and NCCL "
                                     "needs one per process; run fewer processes per machine or use --device cpu (Gloo)",
                                     local_rank, count));
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

void use_device(torch::Device device) {
#ifdef MPT_WITH_CUDA
  if (device.is_cuda() && device.has_index()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

void sync_device(torch::Device device) {
#ifdef MPT_WITH_CUDA
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
#else
  (void)device;
#endif
}

Progress::Progress(bool enabled, std::string label, int64_t total, std::string unit)
    : enabled_(enabled && total > 0), label_(std::move(label)), unit_(std::move(unit)), total_(total) {}

void Progress::update(int64_t done, const std::string& note) {
  if (!enabled_) return;
  const double t = now_seconds();
  if (done < total_ && last_ >= 0 && t - last_ < 0.1) return;
  last_ = t;
  std::string line = fmt::format("{} {}/{} {}", label_, done, total_, unit_);
  if (!note.empty()) line += "  " + note;
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
  drawn_ = false;
}

Progress::~Progress() { finish(); }

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace mpt
