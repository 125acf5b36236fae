// stdout and logging of the mpt binary: tables and --print-config go to stdout through
// emit(), and losing them is an error (exit 3) unless the reader went away on purpose
// (`mpt underflow | head -1`: EPIPE, SIGPIPE ignored). Logs go to stderr (spdlog).
#pragma once

#include <string>

namespace mpt {

/// Sets spdlog's default logger to stderr ("[level] message"): debug with `verbose`,
/// warnings and errors only with `quiet`, info otherwise.
void setup_logging(bool quiet, bool verbose);

/// Opens /dev/null on any of the descriptors 0, 1, 2 that mpt was started without, so that no
/// file mpt opens later (a result's temporary file) becomes its stdout or stderr. A worker of
/// `--nproc` learns of its launcher's closed stdout from MPT_STDOUT_CLOSED=1.
void guard_standard_descriptors();

/// Writes `text` to stdout and flushes it. Returns false, and remembers the reason, when it
/// did not get there (a closed pipe, a full disk, stdout closed); later calls then write nothing.
bool emit(const std::string& text);

/// At the end of main_cli: flushes stdout and checks that everything written there arrived.
/// Returns `code`, or 3 (with a message on stderr) when output was lost and the run had not
/// already failed; a reader that closed the pipe (EPIPE) is not an error.
int finish_stdout(int code);

/// True when fd 1 was closed when mpt started (or its launcher's was: MPT_STDOUT_CLOSED=1).
bool stdout_closed();

}  // namespace mpt
