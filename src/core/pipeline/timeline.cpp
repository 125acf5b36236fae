// A run's timeline read back: the measured bubble and the text Gantt chart of a PipelineRun.
// See executor.hpp.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/pipeline/executor.hpp"

namespace mpt {

double measured_bubble(const PipelineRun& run) {
  if (run.busy_s.empty() || run.step_s <= 0) return 0;
  double sum = 0;
  for (double b : run.busy_s) sum += 1.0 - b / run.step_s;
  return sum / static_cast<double>(run.busy_s.size());
}

std::string render_gantt(const PipelineRun& run, int stages, int width) {
  if (run.step_s <= 0 || width < 1) return "";
  const double col = run.step_s / width;
  std::vector<std::string> rows(static_cast<std::size_t>(stages), std::string(static_cast<std::size_t>(width), '.'));
  const char* digits = "0123456789abcdefghijklmnopqrstuvwxyz";
  for (const auto& ev : run.events) {
    int a = static_cast<int>(ev.start_s / col + 0.5), b = static_cast<int>(ev.end_s / col + 0.5);
    a = std::clamp(a, 0, width - 1);
    b = std::clamp(b, a + 1, width);
    auto& row = rows[static_cast<std::size_t>(ev.stage)];
    const char fill = ev.op.kind == 'F' ? '-' : ev.op.kind == 'W' ? '~' : '=';
    for (int c = a; c < b; ++c) row[static_cast<std::size_t>(c)] = fill;
    // Odd model chunks (interleaved 1F1B) in lower case: F/B/W chunk 0, 2, ...; f/b/w chunk 1, 3, ...
    row[static_cast<std::size_t>(a)] = ev.op.chunk % 2 == 1 ? static_cast<char>(ev.op.kind - 'A' + 'a') : ev.op.kind;
    if (b - a >= 2) row[static_cast<std::size_t>(a + 1)] = digits[ev.op.microbatch % 36];
  }
  std::string out;
  for (int s = 0; s < stages; ++s) out += fmt::format("stage {} |{}|\n", s, rows[static_cast<std::size_t>(s)]);
  out += fmt::format("         0{:>{}}\n", fmt::format("{:.1f} ms", run.step_s * 1e3), width);
  return out;
}

}  // namespace mpt
