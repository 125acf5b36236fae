// core/dist internals shared by its launch and group parts (not part of mpt's API).
#pragma once

#include <string>
#include <vector>

#include <fmt/format.h>

namespace mpt::dist::detail {

/// The first line of a message (LibTorch's errors carry backtraces after it).
inline std::string first_line(const std::string& s) {
  auto p = s.find('\n');
  std::string line = p == std::string::npos ? s : s.substr(0, p);
  // Gloo's enforce text starts with its source location ("[/__w/pytorch/.../pair.cc:561] ") and
  // may end in advice for PyTorch's bug tracker ("This is typically caused by a remote worker
  // crashing. ... GLHF!"): neither says anything to an mpt user, who gets mpt's own diagnosis
  // next to it.
  if (line.size() > 2 && line[0] == '[') {
    const auto close = line.find("] ");
    if (close != std::string::npos && line.rfind(':', close) != std::string::npos &&
        line.find_first_not_of("0123456789", line.rfind(':', close) + 1) == close)
      line = line.substr(close + 2);
  }
  if (const auto advice = line.find(" This is typically caused by"); advice != std::string::npos)
    line = line.substr(0, advice);
  return line;
}

/// Key (in the job's store, no group prefix) under which rank `rank` lists the ranks that did
/// not answer when its collective failed: the launcher reads it to name a hung rank.
inline std::string unresponsive_key(int rank) { return fmt::format("mpt/unresponsive/{}", rank); }

/// "3,1" -> {3, 1}; entries that are not integers are skipped.
inline std::vector<int> parse_ranks(const std::string& s) {
  std::vector<int> out;
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    try {
      out.push_back(std::stoi(s.substr(i, j - i)));
    } catch (const std::exception&) {
    }
    i = j + 1;
  }
  return out;
}

}  // namespace mpt::dist::detail
