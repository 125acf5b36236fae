// Default options of AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer for the
// sanitizer build (cmake -DMPT_SANITIZE=ON; scripts/test.sh --sanitize). Linked only into that
// build's binaries. The runtimes call these hooks at start-up (see the sanitizers'
// common flags: https://github.com/google/sanitizers/wiki/SanitizerCommonFlags); the
// ASAN_OPTIONS / LSAN_OPTIONS / UBSAN_OPTIONS environment variables still override them.
//
// The suppression files (tests/sanitize/*.supp) name only third-party libraries, each entry
// with its reason: LibTorch and Gloo are not instrumented, and what they do is not mpt's to fix.

extern "C" {

/// ASan: stop at the first error with a readable report, exit code 99 (no exit code of mpt's
/// own, so a finding never passes for an expected exit 1, 2 or 3 in a test). Leak checking is
/// on (LSan's suppressions below, for third-party libraries only).
const char* __asan_default_options() {
  return "halt_on_error=1:abort_on_error=0:exitcode=99:detect_leaks=1:strict_string_checks=1:"
         "detect_stack_use_after_return=0:check_initialization_order=1:"
         "suppressions=" MPT_SOURCE_DIR "/tests/sanitize/asan.supp";
}

/// LSan: the leak suppressions (third-party libraries only).
const char* __lsan_default_options() {
  return "suppressions=" MPT_SOURCE_DIR "/tests/sanitize/lsan.supp:print_suppressions=0";
}

/// UBSan: halt at the first finding, with a stack trace; suppressions for third-party code
/// inlined from headers.
const char* __ubsan_default_options() {
  return "halt_on_error=1:print_stacktrace=1:exitcode=99:"
         "suppressions=" MPT_SOURCE_DIR "/tests/sanitize/ubsan.supp";
}

}  // extern "C"
