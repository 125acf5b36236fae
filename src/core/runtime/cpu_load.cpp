// Other processes' runnable threads as mpt starts (core/runtime/cpu_load.hpp).
#include "core/runtime/cpu_load.hpp"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstring>

namespace mpt {
namespace {

double g_start_runnable = -1;  // constant-initialised: valid before any constructor runs

// procs_running from /proc/stat, read with open/read into a stack buffer and parsed by hand (no
// allocation, no stdio, no locale): -1 when unreadable.
int procs_running() noexcept {
  const int fd = ::open("/proc/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[16384];  // the per-CPU lines come first: 16 KiB holds ~100 CPUs' before procs_running
  ssize_t n = 0, r = 0;
  while (n < static_cast<ssize_t>(sizeof(buf)) - 1 && (r = ::read(fd, buf + n, sizeof(buf) - 1 - n)) > 0) n += r;
  ::close(fd);
  buf[n > 0 ? n : 0] = '\0';
  const char* p = std::strstr(buf, "\nprocs_running ");
  if (p == nullptr) return -1;
  p += std::strlen("\nprocs_running ");
  int v = 0;
  if (*p < '0' || *p > '9') return -1;
  for (; *p >= '0' && *p <= '9'; ++p) v = v * 10 + (*p - '0');
  return v;
}

}  // namespace

double runnable_others(int samples, int interval_us) noexcept {
  double sum = 0;
  int got = 0;
  for (int i = 0; i < samples; ++i) {
    if (i > 0) {
      timespec ts{0, static_cast<long>(interval_us) * 1000L};
      ::nanosleep(&ts, nullptr);
    }
    const int v = procs_running();
    if (v < 0) continue;
    sum += v > 0 ? v - 1 : 0;  // less the thread reading, which is running
    ++got;
  }
  return got > 0 ? sum / got : -1;
}

double start_runnable_others() noexcept { return g_start_runnable; }

void set_start_runnable_others(double v) noexcept { g_start_runnable = v; }

}  // namespace mpt
