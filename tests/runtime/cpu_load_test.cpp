// core/runtime/cpu_load: counting other runnable threads from /proc/stat's procs_running.
#include <atomic>
#include <thread>

#include "catch.hpp"
#include "core/runtime/cpu_load.hpp"

using namespace mpt;

TEST_CASE("runnable_others counts a thread that keeps a core busy", "[cpu_load]") {
  // Whatever else runs on the machine, the count is a non-negative average.
  const double before = runnable_others(3, 100);
  REQUIRE(before >= 0);
  // A spinning thread is runnable at every reading: with it the average is at least one more
  // than nothing (the reading thread itself is not counted).
  std::atomic<bool> stop{false};
  std::thread spinner([&] {
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  const double with_spinner = runnable_others(20, 500);
  stop = true;
  spinner.join();
  CHECK(with_spinner >= 0.95);
}

TEST_CASE("start_runnable_others holds what was recorded", "[cpu_load]") {
  const double was = start_runnable_others();
  set_start_runnable_others(1.25);
  CHECK(start_runnable_others() == 1.25);
  set_start_runnable_others(was);
}
