// mpt: mixed-precision and parallel-training experiments. All logic lives in the app layer
// (src/app: command line, harness), the experiment files (src/experiments) and the core
// library (src/core); this stays thin.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "app/cli.hpp"

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

// OpenMP threads that wait at a barrier spin by default (libgomp's OMP_WAIT_POLICY is ACTIVE
// for a while): when another process takes a core, the spinning thread holds the other one and
// the descheduled peer waits for a scheduler time slice — a 0.8 ms training step with 2 threads
// on 2 cores then takes 4–129 ms (measured: docs/performance.md, "Stable timings"). PASSIVE
// waiters sleep and give their core back. libgomp — whose threads LibTorch's OpenMP loops and
// MKL use — reads OMP_WAIT_POLICY once, in its initialiser, and libc's own initialiser resets
// the environment to the one the process started with (a setenv here does not survive), so the
// variable must be there at exec: this function runs from the executable's DT_PREINIT_ARRAY,
// before any shared library's initialiser (LibTorch's static initialisers included), and when
// OMP_WAIT_POLICY is unset it re-executes the binary once with OMP_WAIT_POLICY=PASSIVE and
// MPT_OMP_WAIT_POLICY_DEFAULT=PASSIVE (which env.threads_policy reports; setting either variable
// yourself turns the re-exec off). That costs a second exec and relocation, about 30 ms of a
// 0.3 s start here; nothing of LibTorch has initialised yet. A run under valgrind (whose tools
// would not follow the exec), a sanitizer, or `ld.so mpt` (where /proc/self/exe is the loader)
// is left alone; anything that fails simply runs on with libgomp's default.
void default_omp_wait_policy(int /*argc*/, char** argv, char** envp) {
  refuse_deleted_working_folder();
#if defined(__SANITIZE_ADDRESS__)
  return;
#endif
  if (envp == nullptr || argv == nullptr) return;
  std::size_t n = 0;
  for (char** e = envp; *e; ++e, ++n) {
    if (std::strncmp(*e, "OMP_WAIT_POLICY=", 16) == 0 || std::strncmp(*e, "MPT_OMP_WAIT_POLICY_DEFAULT=", 28) == 0)
      return;
    if (std::strncmp(*e, "LD_PRELOAD=", 11) == 0 && std::strstr(*e, "vgpreload") != nullptr) return;
  }
  // Started as `ld.so mpt ...`, /proc/self/exe is the dynamic loader, not mpt: no re-exec.
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return;
  self[len] = '\0';
  const char* base = std::strrchr(self, '/');
  base = base ? base + 1 : self;
  if (std::strncmp(base, "ld-", 3) == 0 || std::strncmp(base, "ld.so", 5) == 0) return;
  std::vector<char*> env(envp, envp + n);
  env.push_back(const_cast<char*>("OMP_WAIT_POLICY=PASSIVE"));
  env.push_back(const_cast<char*>("MPT_OMP_WAIT_POLICY_DEFAULT=PASSIVE"));
  env.push_back(nullptr);
  ::execve(self, argv, env.data());  // returns only on failure: run on as we are
}

}  // namespace

__attribute__((section(".preinit_array"), used)) static void (*const mpt_preinit)(int, char**, char**) =
    &default_omp_wait_policy;

int main(int argc, char** argv) { return mpt::main_cli(argc, argv); }
