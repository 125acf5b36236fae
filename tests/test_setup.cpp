// Process-wide set-up for the unit-test binary, as the mpt binary does it (apply_threads):
// oneMKL's VML kernels are chosen once, in one thread, before any test runs an op in parallel
// (mpt::resolve_vml_dispatch, pytorch/pytorch#188792). A Catch2 listener, so it runs under
// either Catch2's own main. Kept out of the unity batches: v2 exposes listeners only where
// CATCH_CONFIG_EXTERNAL_INTERFACES comes before its header.
#if __has_include(<catch2/catch_test_macros.hpp>)  // Catch2 v3
#include <catch2/reporters/catch_reporter_event_listener.hpp>
#include <catch2/reporters/catch_reporter_registrars.hpp>
using ListenerBase = Catch::EventListenerBase;
#else
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>
using ListenerBase = Catch::TestEventListenerBase;
#endif

#include "core/runtime/runtime.hpp"

namespace {

/// Resolves the VML dispatch before the first test case (see mpt::resolve_vml_dispatch).
struct ResolveVmlDispatch : ListenerBase {
  using ListenerBase::ListenerBase;
  void testRunStarting(Catch::TestRunInfo const& info) override {
    ListenerBase::testRunStarting(info);
    mpt::resolve_vml_dispatch();
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(ResolveVmlDispatch)
