// The threads executor's threads: a set kept from one step to the next, each bound to a CPU
// until another process is seen busy on one. See stage_threads.hpp.
#include "core/pipeline/stage_threads.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include "core/pipeline/executor.hpp"

namespace mpt {


std::vector<int> stage_thread_cpus(int threads) {
  std::vector<int> cpus;
#ifdef __linux__
  cpu_set_t set;
  CPU_ZERO(&set);
  if (threads < 1 || sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  for (int c = 0; c < CPU_SETSIZE && static_cast<int>(cpus.size()) < threads; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (static_cast<int>(cpus.size()) < threads || CPU_COUNT(&set) < 2) return {};
#else
  (void)threads;
#endif
  return cpus;
}

namespace {

using Clock = std::chrono::steady_clock;

/// The threads executor's threads, kept from one step to the next: a step's stages run on
/// threads that have run stages before, so thread start-up and first-use costs (LibTorch's
/// thread-local state, a malloc arena) stay out of every step but the first.
///
/// Binding. When a step has no more threads than usable CPUs, thread i is bound to the i-th
/// of them (stage_thread_cpus), as OMP_PROC_BIND=close binds OpenMP's: waiting threads poll
/// with sched_yield, and two of them left on one CPU take turns on it while the other CPU
/// idles (4 stages on 2 threads, 2 vCPUs: a 1F1B step 2.1-2.7 ms unbound, 1.4-1.6 ms bound).
/// A bound thread cannot leave a CPU another process is busy on, though (4-10 ms with a busy
/// loop on one of the 2 CPUs, against 2.1-2.5 ms unbound; docs/pipeline.md). So each bound
/// thread measures its share of its CPU (its CPU time / wall time, summed over steps until
/// kWindowS of wall time), and once a share falls below kMinShare the threads are unbound for
/// good (this process's later steps).
/// One step at a time: run() holds the set for the whole step (a second caller waits).
class StageThreads {
 public:
  static StageThreads& instance() {
    static StageThreads threads;
    return threads;
  }

  /// A bound thread with less than this share of its CPU (its CPU time / wall time over its
  /// tasks of at least kWindowS) has company there.
  static constexpr double kMinShare = 0.6;
  static constexpr double kWindowS = 0.003;

  /// Runs tasks[i] on thread i, all at once; returns when every one has returned. The tasks
  /// must not throw (run_pipeline's catch everything).
  void run(const std::vector<std::function<void()>>& tasks) {
    std::lock_guard<std::mutex> step(step_mu_);
    std::unique_lock<std::mutex> lock(mu_);
    while (threads_.size() < tasks.size()) {
      const std::size_t i = threads_.size();
      threads_.emplace_back([this, i] { loop(i); });
    }
    tasks_ = &tasks;
    intra_op_ = stage_thread_intra_op();
    cpus_ = unbound_why_.empty() ? stage_thread_cpus(static_cast<int>(tasks.size())) : std::vector<int>{};
    shares_.assign(tasks.size(), {0.0, 0.0});
    running_ = tasks.size();
    ++generation_;
    work_.notify_all();
    done_.wait(lock, [&] { return running_ == 0; });
    tasks_ = nullptr;
    ++steps_;
    // Each bound thread's share of its CPU, over steps adding up to kWindowS of its wall time
    // (one step's share moves with a single timer tick or page fault; a busy neighbour halves it).
    if (cpus_ != last_cpus_) {
      cpu_s_.assign(cpus_.size(), 0.0);
      wall_s_.assign(cpus_.size(), 0.0);
    }
    bool window = !cpus_.empty();
    for (std::size_t i = 0; i < cpus_.size(); ++i) {
      cpu_s_[i] += shares_[i].first;
      wall_s_[i] += shares_[i].second;
      window = window && wall_s_[i] >= kWindowS;
    }
    if (window) {
      for (std::size_t i = 0; i < cpus_.size() && unbound_why_.empty(); ++i)
        if (cpu_s_[i] < kMinShare * wall_s_[i])
          unbound_why_ = fmt::format("unbound after step {} of this process: thread {} had {:.0f} % of CPU {} over "
                                     "{:.1f} ms (it waited: for a message, a synthetic sleep or another process on that CPU)", steps_, i,
                                     100 * cpu_s_[i] / wall_s_[i], cpus_[i], 1e3 * wall_s_[i]);
      std::fill(cpu_s_.begin(), cpu_s_.end(), 0.0);
      std::fill(wall_s_.begin(), wall_s_.end(), 0.0);
    }
    last_cpus_ = cpus_;
  }

  /// How the last step's threads sat: "bound to CPUs 0,1", "not bound (...)" with the reason.
  std::string binding() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!last_cpus_.empty()) return fmt::format("bound to CPUs {}", fmt::join(last_cpus_, ","));
    if (!unbound_why_.empty()) return "not bound: " + unbound_why_;
    return steps_ == 0 ? "no step run" : "not bound (more threads than usable CPUs, or one CPU)";
  }

  ~StageThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  StageThreads() = default;

  static double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }

  void loop(std::size_t i) {
    uint64_t seen = 0;
    int bound = -1;  // the CPU this thread is bound to (-1: the process's set)
    int threads = 0;  // the intra-op threads this thread last set (0: none yet)
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      work_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (tasks_ == nullptr || i >= tasks_->size()) continue;
      const auto& task = (*tasks_)[i];
      const int cpu = cpus_.empty() ? -1 : cpus_[i];
      const int intra_op = intra_op_;
      lock.unlock();
      if (cpu != bound) bound = bind_this_thread(cpu) ? cpu : bound;
      // at::set_num_threads sets this thread's OpenMP and MKL counts (and ATen's process-wide
      // default, to the value it already has).
      if (intra_op != threads) at::set_num_threads(threads = intra_op);
      const double cpu0 = thread_cpu_seconds();
      const auto wall0 = Clock::now();
      task();
      const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
      const double cpu_s = thread_cpu_seconds() - cpu0;
      lock.lock();
      shares_[i] = {cpu_s, wall};
      if (--running_ == 0) done_.notify_all();
    }
  }

  /// Binds the calling thread to `cpu` (-1: every CPU of the process's own affinity, as it was
  /// when this was first called). False when the system refuses (the thread stays as it was).
  static bool bind_this_thread(int cpu) {
#ifdef __linux__
    static const cpu_set_t process_set = [] {
      cpu_set_t set;
      CPU_ZERO(&set);
      if (sched_getaffinity(0, sizeof(set), &set) != 0) CPU_ZERO(&set);
      return set;
    }();
    cpu_set_t set;
    if (cpu >= 0) {
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
    } else {
      set = process_set;
      if (CPU_COUNT(&set) == 0) return false;
    }
    return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
#else
    (void)cpu;
    return false;
#endif
  }

  std::mutex step_mu_;  // one step at a time
  std::mutex mu_;
  std::condition_variable work_, done_;
  std::vector<std::thread> threads_;
  const std::vector<std::function<void()>>* tasks_ = nullptr;
  int intra_op_ = 1;            // this step's intra-op threads per stage thread
  std::vector<int> cpus_;       // this step's binding: thread i on cpus_[i] (empty: none)
  std::vector<int> last_cpus_;  // the last finished step's
  std::vector<std::pair<double, double>> shares_;  // each thread's CPU and wall seconds in this step's task
  std::vector<double> cpu_s_, wall_s_;             // bound threads' sums over the current window
  std::string unbound_why_;     // set once a bound thread shared its CPU: no binding from then on
  uint64_t steps_ = 0;
  std::size_t running_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace

std::string stage_threads_binding() { return StageThreads::instance().binding(); }

int stage_thread_intra_op() { return std::max(1, at::get_num_threads()); }

void run_on_stage_threads(const std::vector<std::function<void()>>& tasks) { StageThreads::instance().run(tasks); }

}  // namespace mpt
