// mpt: mixed-precision and parallel-training experiments. All logic lives in the app layer
// (src/app: command line, harness), the experiment files (src/experiments) and the core
// library (src/core); this stays thin.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "app/cli.hpp"
#include "core/runtime/cpu_load.hpp"

namespace {

// Started from a folder that no longer exists (deleted while a shell was in it): LibTorch's
// initialisers then fail on their own (oneMKL's "Cannot load libtorch_cpu.so", exit 2), so this
// is checked first, before any shared library initialises, and named: exit 3 (a runtime error, as
// every unusable environment is).
void refuse_deleted_working_folder() {
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd)) != nullptr || errno != ENOENT) return;
  static const char msg[] =
      "mpt: the working folder no longer exists (it was deleted or moved after the shell entered it): "
      "cd to an existing folder and run again\n";
  (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
  ::_exit(3);
}

// OpenMP's wait policy, chosen from what else is running as mpt starts (docs/performance.md,
// "The defaults"). libgomp's default waiters spin for a bounded count (about 300,000 polls),
// then sleep: on an idle machine that is the fastest (the lossscale step at batch 64, 2 threads:
// 0.32 ms, PyTorch's loop 0.53 ms; PASSIVE 1.36 ms: every parallel region pays a sleep and a
// wake-up). Beside a process that keeps a core busy, a spinning waiter holds its core while
// the team's other thread waits for a time slice (1.2 ms; PASSIVE 0.73 ms). So this counts the
// other processes' runnable threads at exec (10 readings of /proc/stat's procs_running, 1 ms
// apart: core/runtime/cpu_load.hpp) and, at half a thread or more, runs with
// OMP_WAIT_POLICY=PASSIVE. libgomp reads the variable once, in its initialiser, and libc's
// initialiser resets the environment to the one the process started with (a setenv here does
// not survive), so the variable must be there at exec: this runs from the executable's
// DT_PREINIT_ARRAY, before any shared library's initialiser (LibTorch's included), and
// re-executes the binary once with OMP_WAIT_POLICY=PASSIVE, MPT_OMP_WAIT_POLICY_DEFAULT=PASSIVE
// and MPT_START_RUNNABLE_OTHERS (what env.threads_policy reports). The user's OMP_WAIT_POLICY,
// or MPT_OMP_WAIT_POLICY_DEFAULT (which mpt --nproc passes its workers, whose siblings would
// read as load), turns the measurement off. Costs about 10 ms at every start, and the re-exec
// about 30 ms more when it happens. A run under valgrind (whose tools would not follow the
// exec), a sanitizer, or `ld.so mpt` (where /proc/self/exe is the loader) is measured but never
// re-executed; anything that fails simply runs on with libgomp's default.
double parse_hundredths(const char* v) {
  long n = 0;
  bool dot = false;
  int frac = 0;
  for (; *v; ++v) {
    if (*v == '.' && !dot) dot = true;
    else if (*v >= '0' && *v <= '9' && (!dot || frac < 2)) n = n * 10 + (*v - '0'), frac += dot;
    else if (!(*v >= '0' && *v <= '9')) return -1;
    if (n > 100000000) return -1;  // not a thread count: no overflow
  }
  for (; frac < 2; ++frac) n *= 10;
  return static_cast<double>(n) / 100.0;
}

void choose_omp_wait_policy(int /*argc*/, char** argv, char** envp) {
  refuse_deleted_working_folder();
  if (envp == nullptr || argv == nullptr) return;
  std::size_t n = 0;
  bool decided = false, valgrind = false;
  for (char** e = envp; *e; ++e, ++n) {
    if (std::strncmp(*e, "OMP_WAIT_POLICY=", 16) == 0 || std::strncmp(*e, "MPT_OMP_WAIT_POLICY_DEFAULT=", 28) == 0)
      decided = true;
    if (std::strncmp(*e, "MPT_START_RUNNABLE_OTHERS=", 26) == 0) mpt::set_start_runnable_others(parse_hundredths(*e + 26));
    if (std::strncmp(*e, "LD_PRELOAD=", 11) == 0 && std::strstr(*e, "vgpreload") != nullptr) valgrind = true;
  }
  if (decided) return;
  const double others = mpt::runnable_others(10, 1000);
  mpt::set_start_runnable_others(others);
  if (others < 0.5 || valgrind) return;
#if defined(__SANITIZE_ADDRESS__)
  return;
#endif
  // Started as `ld.so mpt ...`, /proc/self/exe is the dynamic loader, not mpt: no re-exec.
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return;
  self[len] = '\0';
  const char* base = std::strrchr(self, '/');
  base = base ? base + 1 : self;
  if (std::strncmp(base, "ld-", 3) == 0 || std::strncmp(base, "ld.so", 5) == 0) return;
  // MPT_START_RUNNABLE_OTHERS=<hundredths>, written by hand: no stdio before libc's initialisers.
  static char measured[64] = "MPT_START_RUNNABLE_OTHERS=";
  long h = static_cast<long>(others * 100 + 0.5);
  char digits[24];
  int k = 0;
  do digits[k++] = static_cast<char>('0' + h % 10), h /= 10; while (h > 0 && k < 20);
  while (k < 3) digits[k++] = '0';
  char* out = measured + 26;
  for (int i = k - 1; i >= 0; --i) {
    *out++ = digits[i];
    if (i == 2) *out++ = '.';
  }
  *out = '\0';
  std::vector<char*> env(envp, envp + n);
  env.push_back(const_cast<char*>("OMP_WAIT_POLICY=PASSIVE"));
  env.push_back(const_cast<char*>("MPT_OMP_WAIT_POLICY_DEFAULT=PASSIVE"));
  env.push_back(measured);
  env.push_back(nullptr);
  ::execve(self, argv, env.data());  // returns only on failure: run on as we are
}

}  // namespace

__attribute__((section(".preinit_array"), used)) static void (*const mpt_preinit)(int, char**, char**) =
    &choose_omp_wait_policy;

int main(int argc, char** argv) { return mpt::main_cli(argc, argv); }
