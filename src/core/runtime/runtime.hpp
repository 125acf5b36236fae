// Devices, capabilities, seeding and the environment block of the result file.
#pragma once

#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "core/numerics/precision.hpp"

namespace mpt {

using json = nlohmann::json;

/// Picks the device: "cpu", "cuda" (CUDA device 0), or "auto" (CUDA when available).
/// Throws RuntimeFailure (exit 3) when CUDA is asked for but not usable, naming why
/// (CPU-only build of mpt/LibTorch, or no device visible).
torch::Device choose_device(const std::string& want);

/// Outcome of probing the kernels of one dtype on one device (probe_kernels).
struct KernelProbe {
  bool runs = false;               ///< the dtype's matrix products run (no LibTorch error) in the dtype
  bool fp32_accumulation = false;  ///< ... and accumulate in fp32, rounding each result once, as
                                   ///< oneDNN, MKL, cuBLAS and Tensor Cores do
  bool fast = true;                ///< ... and not far slower than emulating them (CPU only: see probe_kernels)
  double native_gemm_s = 0;        ///< CPU: the fastest of 3 native 128^3 products, seconds (0: not timed)
  double emulated_gemm_s = 0;      ///< CPU: the fastest of 3 emulated ones (fp32 product + rounding), seconds
  std::string reason;              ///< why not native(): the LibTorch error, the wrong sum or the speed; "" when native
  /// Native compute as mpt means it: low-precision storage with fp32 accumulation, at a speed
  /// worth having. resolve_compute's "native" asks only for runs (and warns without the rest).
  bool native() const { return runs && fp32_accumulation && fast; }
};

/// How much slower than emulation a CPU's native product may be before compute=auto refuses it.
/// The margin keeps the choice off timing noise (it picks the path, so it picks the numbers):
/// the slow kernels it is for are 100-400x slower (fp16 on CPUs without AVX512-FP16, no
/// oneDNN kernel: ATen's scalar loop), the fast ones faster than fp32.
constexpr double kNativeSlowdownLimit = 4.0;

/// Probes `device`'s kernels for matrix products in `dtype` by running them, not by assuming:
/// a 2x2 matmul, then a linear layer's forward and backward (x 256x128, W 384x128, bias) past
/// the size where LibTorch hands bf16/fp16 GEMMs to oneDNN (2.x skips oneDNN below
/// m*n*k = 16^3), so it takes the experiments' path. Its input gradient sums 384 products of
/// 0.25: 96 with fp32 accumulation, 64 when the kernel accumulates in bf16 (64 + 0.25 rounds
/// back to 64) — as Debian's LibTorch 1.13 does on CPUs without AVX-512 (its generic bf16 GEMM).
/// Catches: no CPU fp16 matmul in 1.13; oneDNN capped below AVX-512 (DNNL_MAX_CPU_ISA=AVX2) on
/// a CPU with AVX-512 BF16, where 1.13 still routes bf16 to oneDNN and fails ("could not create
/// a primitive descriptor iterator"); low-precision accumulation. On the CPU it then times the
/// kernels against emulation, the fastest of 3 each after a warm-up: a 128x128 @ 128x128 product
/// in the dtype, against the fp32 product of the same values rounded to the dtype (what
/// emulation computes per GEMM); more than kNativeSlowdownLimit times slower is not fast
/// (reason says by how much). Cached per (device, dtype), so measured once per process;
/// thread-safe; never throws.
KernelProbe probe_kernels(torch::Device device, torch::ScalarType dtype);

/// Whether `device` has native kernels for matrix products in `dtype`: probe_kernels().native().
bool native_matmul(torch::Device device, torch::ScalarType dtype);


/// Resolves a compute request for format `f` on `device`: "emulated" → Emulated; "auto" → Native
/// where probe_kernels() finds native kernels (running, fp32 accumulation), else Emulated;
/// "native" → Native wherever the kernels run (with a warning on stderr when they accumulate in
/// the low format). fp32 is always Native (nothing to
/// emulate); fp8 is always Emulated (mpt has no native fp8 path). Throws RuntimeFailure (exit 3)
/// when "native" is asked for and the kernels do not run (naming LibTorch, device and
/// format), std::invalid_argument for any other request string.
Compute resolve_compute(const std::string& request, Format f, torch::Device device);

/// How many intra-op threads (torch.set_num_threads: ATen's pool, OpenMP, MKL) a process uses,
/// and why; recorded in every result's env.threads_policy. Oversubscribed cores make step
/// times bimodal (an OpenMP team spin-waits for a thread the kernel has descheduled), so mpt
/// never lets its processes together ask for more threads than the usable cores.
struct ThreadPolicy {
  int intra_op = 1;         ///< threads this process uses (>= 1)
  int cores = 1;            ///< CPUs this process may run on (sched_getaffinity; >= 1)
  int local_processes = 1;  ///< mpt processes sharing those cores on this machine (>= 1)
  std::string source;       ///< "config" (/threads > 0), "OMP_NUM_THREADS" (set, /threads 0) or "auto" (max(1, cores / local_processes))
  std::string cpu_bind;     ///< what apply_threads bound this process to ("cpus 1 of 0-1") or why it did not ("none: ...")
};

/// The CPUs local process `local_rank` of `local_processes` is bound to: its own `intra_op`
/// consecutive entries of `allowed` (this process's sched_getaffinity set, ascending), entries
/// local_rank·intra_op … (local_rank+1)·intra_op − 1. Empty — no binding — when there is nothing
/// to separate (one local process, a local_rank outside 0 … local_processes − 1) or the processes'
/// threads do not fit the allowed CPUs (local_processes · intra_op > allowed.size(): bound, they
/// would share cores all the same, and a launcher that binds, e.g. srun, has already left each
/// process its own set). The method of torch.backends.xeon.run_cpu (ipexrun) and of
/// `mpirun --bind-to core`: a rank's main thread, its intra-op threads and Gloo's threads then
/// hand work to each other on its own cores instead of being spread by the scheduler over the
/// other ranks' (docs/performance.md, "The DDP step's spread").
std::vector<int> bind_cpus(const std::vector<int>& allowed, int local_rank, int local_processes, int intra_op);

/// This process's index among the machine's mpt processes, from the launcher that
/// local_processes_from_environment finds: MPT_LOCAL_RANK (mpt --nproc: MPT_RANK set), LOCAL_RANK
/// (torchrun: RANK and WORLD_SIZE), SLURM_LOCALID (srun: SLURM_PROCID and SLURM_NTASKS); −1 with
/// no launcher, or when that variable is missing or not a non-negative integer.
int local_rank_from_environment();

/// The policy: `requested` > 0 (the config's /threads) is taken as given; else a valid
/// `omp_num_threads` (the OMP_NUM_THREADS value, 1–1024; a malformed one is warned about on
/// stderr and ignored), as PyTorch takes it; else max(1, cores / local_processes) — one process
/// gets every usable core, N processes on C cores get max(1, C/N) each. Does not apply it (see
/// apply_threads).
ThreadPolicy choose_threads(int64_t requested, int cores, int local_processes, const char* omp_num_threads = nullptr);

/// CPUs this process may run on: CPU_COUNT of sched_getaffinity (what taskset, cgroups' cpusets
/// and SLURM's binding leave), else std::thread::hardware_concurrency(); at least 1.
int usable_cores();

/// mpt processes on this machine in this run, from the launcher that started this process (as
/// dist::launch_from_environment tells them apart): under mpt --nproc (MPT_RANK set)
/// MPT_WORLD_SIZE (every rank here); under torchrun (RANK and WORLD_SIZE set) LOCAL_WORLD_SIZE;
/// in an srun task (SLURM_PROCID and SLURM_NTASKS set) SLURM_NTASKS_PER_NODE, else the first
/// count of SLURM_TASKS_PER_NODE ("4(x2)" -> 4); else 1, whatever other variables are set. A
/// malformed value is skipped (the next source counts) with a warning on stderr.
int local_processes_from_environment();

/// choose_threads(requested, usable_cores(), local_processes_from_environment(),
/// getenv("OMP_NUM_THREADS")), applied with torch::set_num_threads; warns on stderr when the
/// processes together ask for more threads than the usable cores; binds every thread of this
/// process (those running now, and so those they start) to bind_cpus(...) of the allowed CPUs
/// unless MPT_CPU_BIND=none or another process kept a core busy at start (start_runnable_others
/// ≥ 0.5, the wait policy's rule); then resolve_vml_dispatch(). Returns the policy for
/// env.threads_policy (cpu_bind says what was bound, or why not).
ThreadPolicy apply_threads(int64_t requested);

/// An ATen unary op whose contiguous fp32 / fp64 CPU kernel calls oneMKL's VML (ATen/cpu/vml.h's
/// IMPLEMENT_VML_MKL list: vmsSqrt, vmdSqrt, ...; each reached from a 1-element tensor, checked
/// with breakpoints on LibTorch 2.15's libtorch_cpu).
struct VmlOp {
  const char* name;                         ///< "sqrt", as torch.sqrt
  at::Tensor (*fn)(const at::Tensor&);      ///< at::sqrt
};

/// The 16 VML-routed ops: acos, asin, atan, cos, erf, erfc, erfinv, exp, log, log10, log2, sin,
/// sqrt, tan, tanh, trunc (tests/parity/mpt_threads.py keeps the same list for the Python side).
const std::vector<VmlOp>& vml_routed_ops();

/// Makes oneMKL choose its VML kernel for every function ATen's float and double unary ops call
/// (vml_routed_ops) before any intra-op parallel region can call one: each op runs once, in this
/// thread, on a 1-element fp32 and fp64 tensor (below every grain size, so never in parallel).
/// Why: oneMKL picks a VML function's kernel on its first call; when that first call runs on
/// several intra-op threads at once, one thread can run the low-accuracy AVX2 "EP" kernel for its
/// whole chunk although ATen asks for VML_HA (pytorch/pytorch#188792, oneMKL 2024.2 as linked into
/// the PyPI wheels; the warm-up is upstream's fix, pytorch/pytorch#188791). Seen in mpt: Adam's
/// sqrt of a 32×784 exp_avg_sq at the first step, the second thread's half off by up to 3.2e-4
/// relative, in 7 of 300 `golden_t2.shard` runs under ctest (0 of 300 with the warm-up). Once
/// per process (later calls return at once), from apply_threads; harmless where LibTorch has no
/// MKL. Returns whether ATen has MKL (at::hasMKL()), i.e. whether there was anything to resolve.
bool resolve_vml_dispatch();

/// {"intra_op", "cores", "local_processes", "source"} of `p`, with "omp_wait_policy" (the
/// OMP_WAIT_POLICY libgomp started with, null when unset: libgomp's spin-then-sleep default),
/// "omp_wait_policy_source" (environment, or mpt's choice and why: src/app/main.cpp sets PASSIVE
/// when other processes' threads were runnable at start) and "runnable_others_at_start"
/// (start_runnable_others(), null when not measured).
json to_json(const ThreadPolicy& p);

/// Seeds LibTorch's default generators (CPU, and CUDA when present), as torch.manual_seed.
void seed_all(std::uint64_t seed);

/// The state of generator `g` (a uint8 tensor), read under the generator's mutex: what
/// torch.random.get_rng_state / torch.cuda.get_rng_state return.
torch::Tensor generator_state(at::Generator g);

/// Sets generator `g`'s state (from generator_state() of a generator of the same kind) under its
/// mutex, as torch.random.set_rng_state. Throws c10::Error for a state of another kind.
void set_generator_state(at::Generator g, const torch::Tensor& state);

/// The `env` block: LibTorch version, device, CUDA, fp16/bf16 compute modes (with the reason
/// when emulated), intra-op threads, host name, compiler, mpt version, and `hardware`
/// (hardware_fingerprint). Run-dependent by nature.
json environment(torch::Device device);

/// What hardware and kernels produce the numbers, for result files' `env.hardware` and
/// `mpt env`: the CPU model and the ISA features that change kernels (avx2, avx512f,
/// avx512_bf16, avx512_fp16, amx_tile/amx_bf16, from /proc/cpuinfo), ATen's CPU capability
/// (the vectorised kernels' dispatch level, as torch.backends.cpu.get_cpu_capability()), the ISA
/// oneDNN dispatches to (asked of oneDNN itself where its C API is exported, as in Debian's
/// libdnnl; otherwise derived from the CPU flags and ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA, and
/// `source` says which), the BLAS LibTorch was built with and the BLAS library actually loaded
/// (from /proc/self/maps), intra- and inter-op threads, the environment variables that change
/// kernels, LibTorch / CUDA / cuDNN / NCCL versions, and each GPU's name, compute capability
/// and memory. Never throws: what cannot be read is reported as "unknown".
json hardware_fingerprint();

/// Seconds since an arbitrary epoch (steady clock), for timings.
double now_seconds();

/// The GPU of the process with local rank `local_rank` on this machine: cuda:<local_rank>, one
/// GPU per process as NCCL requires (torchrun's LOCAL_RANK convention). Throws RuntimeFailure
/// when the machine has fewer CUDA devices than local ranks (naming both), or in a CPU-only build.
torch::Device cuda_device_for_rank(int local_rank);

/// Makes `device` the current CUDA device of this process (torch.cuda.set_device), so that
/// NCCL and allocations without an explicit device use it; a no-op for the CPU.
void use_device(torch::Device device);

/// Waits until every kernel queued on `device` has finished (torch.cuda.synchronize); a no-op
/// on the CPU. Call before reading the clock around GPU work.
void sync_device(torch::Device device);

/// A one-line progress indicator on stderr ("\r<label> 120/400 steps  loss 0.5321"), redrawn at
/// most 10 times a second and erased when done, so stdout (the tables) stays clean. Does
/// nothing unless `enabled` (pass Context::tty: stderr is a terminal, not -q, rank 0).
class Progress {
 public:
  /// `total`: the count update() goes to (> 0); `unit`: what is counted, e.g. "steps".
  Progress(bool enabled, std::string label, int64_t total, std::string unit);
  /// Records `done` of total and an optional note (e.g. the current loss); redraws if due.
  void update(int64_t done, const std::string& note = "");
  /// Erases the line (also done by the destructor).
  void finish();
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

 private:
  bool enabled_;
  std::string label_, unit_;
  int64_t total_;
  double last_ = -1;
  bool drawn_ = false;
};

}  // namespace mpt
