// stdout and logging of the mpt binary. See output.hpp.
#include "app/output.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/errors.hpp"

namespace mpt {

void setup_logging(bool quiet, bool verbose) {
  static auto logger = [] {
    auto l = spdlog::stderr_color_mt("mpt");
    l->set_pattern("%^[%l]%$ %v");
    return l;
  }();
  spdlog::set_default_logger(logger);
  spdlog::set_level(verbose ? spdlog::level::debug : quiet ? spdlog::level::warn : spdlog::level::info);
}

// ---------------------------------------------------------------------------
// stdout: tables and --print-config go there, and losing them is an error (exit 3) unless
// the reader went away on purpose (`mpt underflow | head -1`: EPIPE, SIGPIPE ignored).
// ---------------------------------------------------------------------------

namespace {

int g_stdout_errno = 0;        // errno of the first failed write to stdout; 0 while all went through
bool g_stdout_closed = false;  // fd 1 was closed when mpt started (now /dev/null)

}  // namespace

// Opens /dev/null on any of the descriptors 0, 1, 2 that mpt was started without, so that no
// file mpt opens later (a result's temporary file) becomes its stdout or stderr.
void guard_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    const int n = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (n >= 0 && n != fd) ::dup2(n, fd), ::close(n);
    if (fd == 1) g_stdout_closed = true;
  }
  // A worker of `--nproc` whose launcher was started without stdout: its fd 1 is the launcher's
  // /dev/null, so it learns of the closed stdout from the launcher (spawn below).
  if (const char* v = std::getenv("MPT_STDOUT_CLOSED"); v && std::string(v) == "1") g_stdout_closed = true;
}

// Writes `text` to stdout and flushes it. Returns false, and remembers the reason, when it
// did not get there (a closed pipe, a full disk, stdout closed); later calls then write nothing.
bool emit(const std::string& text) {
  if (g_stdout_errno != 0) return false;
  if (g_stdout_closed) {
    if (!text.empty()) g_stdout_errno = EBADF;
    return text.empty();
  }
  std::cout.flush();  // whatever went through std::cout first keeps its place
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    g_stdout_errno = errno != 0 ? errno : EIO;
    std::clearerr(stdout);
    if (g_stdout_errno == EPIPE) spdlog::info("stdout was closed by its reader: the rest of the tables is not printed");
    return false;
  }
  return true;
}

// At the end of main_cli: flushes stdout and checks that everything written there arrived,
// including errors that show only at close (a dup of fd 1 is closed: NFS, full disks).
// Exit code: 3 with a message when output was lost, unless the run already failed (2, 3); a
// reader that closed the pipe (EPIPE) is not an error: the run did its work and wrote its
// result file, as `mpt ... | head` expects.
int finish_stdout(int code) {
  errno = 0;
  std::cout.flush();
  if ((!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) && g_stdout_errno == 0)
    g_stdout_errno = errno != 0 ? errno : EIO;
  if (g_stdout_errno == 0 && !g_stdout_closed) {
    const int d = ::dup(1);
    if (d >= 0 && ::close(d) != 0 && errno != EINTR) g_stdout_errno = errno;
  }
  if (g_stdout_errno == 0 || g_stdout_errno == EPIPE) return code;
  std::cerr << "mpt: cannot write to stdout: " << std::strerror(g_stdout_errno)
            << (code == kExitOk || code == kExitCheckFailed ? " (output lost; exit 3)" : "") << "\n";
  return code == kExitOk || code == kExitCheckFailed ? static_cast<int>(kExitRuntime) : code;
}

bool stdout_closed() { return g_stdout_closed; }

}  // namespace mpt
