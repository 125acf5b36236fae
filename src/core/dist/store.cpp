// core/dist, store: the job's store as a wire — waiting until its host listens
// (wait_until_listening) and values of any length in pieces (store_set_pieces /
// store_get_pieces). Declarations: job_state.hpp.
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "core/dist/job_state.hpp"
#include "core/errors.hpp"
#include "core/runtime/runtime.hpp"

namespace mpt::dist::detail {

std::string wait_until_listening(const std::string& host, int port, double deadline, bool* fatal) {
  std::string why = "timed out";
  *fatal = false;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      why = fmt::format("cannot resolve {}: {}", host, ::gai_strerror(gai));
    } else {
      for (addrinfo* a = res; a; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          pollfd pfd{fd, POLLOUT, 0};
          const double left_ms = std::max(1.0, (deadline - now_seconds()) * 1000.0);
          if (::poll(&pfd, 1, static_cast<int>(std::min(left_ms, 1000.0))) == 1) {
            int err = 0;
            socklen_t len = sizeof(err);
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            rc = err == 0 ? 0 : -1;
            errno = err;
          } else {
            errno = ETIMEDOUT;
          }
        }
        const int err = errno;
        if (rc == 0) {
          pollfd pfd{fd, POLLIN, 0};
          const bool spoke = ::poll(&pfd, 1, 100) == 1;
          char byte = 0;
          const ssize_t got = spoke ? ::recv(fd, &byte, 1, MSG_PEEK) : -1;
          ::close(fd);
          ::freeaddrinfo(res);
          if (!spoke) return {};
          *fatal = true;
          return got > 0 ? "it sent data before any request: not a TCPStore"
                         : "it closed the connection at once: not a TCPStore that accepts this rank";
        }
        ::close(fd);
        why = std::strerror(err);
      }
      ::freeaddrinfo(res);
    }
    if (now_seconds() >= deadline) return why;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

namespace {

constexpr std::size_t kStorePieceBytes = std::size_t{1} << 20;

// The key of piece `i` of the value under `key`.
std::string piece_key(const std::string& key, std::size_t i) { return fmt::format("{}/piece/{}", key, i); }

}  // namespace

void store_set_pieces(JobState& job, c10d::Store& store, const std::string& key, const std::string& value,
                      const std::string& what) {
  const std::size_t n = (value.size() + kStorePieceBytes - 1) / kStorePieceBytes;
  for (std::size_t i = 0; i < n; ++i) {
    StoreWatchdog::Call call(job.watchdog.get(), what);
    const std::size_t at = i * kStorePieceBytes;
    store_set(store, piece_key(key, i), value.substr(at, std::min(kStorePieceBytes, value.size() - at)));
  }
  StoreWatchdog::Call call(job.watchdog.get(), what);
  store_set(store, key, fmt::format("{} {}", n, value.size()));
}

std::string store_get_pieces(JobState& job, c10d::Store& store, const std::string& key, const std::string& what,
                             bool erase) {
  std::string header;
  {
    StoreWatchdog::Call call(job.watchdog.get(), what);
    const auto v = store.get(key);
    header.assign(v.begin(), v.end());
  }
  unsigned long long n = 0, bytes = 0;
  char extra = 0;
  if (std::sscanf(header.c_str(), "%llu %llu%c", &n, &bytes, &extra) != 2 ||
      n != (bytes + kStorePieceBytes - 1) / kStorePieceBytes)
    throw RuntimeFailure(fmt::format("{}: the store's '{}' is '{}', expected '<pieces> <bytes>' (is every rank the "
                                     "same mpt?)", what, key, first_line(header.substr(0, 80))));
  std::string value;
  value.reserve(static_cast<std::size_t>(bytes));
  for (std::size_t i = 0; i < n; ++i) {
    StoreWatchdog::Call call(job.watchdog.get(), what);
    const auto v = store.get(piece_key(key, i));
    value.append(v.begin(), v.end());
    if (erase) store.deleteKey(piece_key(key, i));
  }
  if (value.size() != bytes)
    throw RuntimeFailure(fmt::format("{}: the store's '{}' holds {} bytes in {} pieces, its header says {}", what, key,
                                     value.size(), n, bytes));
  if (erase) {
    StoreWatchdog::Call call(job.watchdog.get(), what);
    store.deleteKey(key);
  }
  return value;
}

}  // namespace mpt::dist::detail
