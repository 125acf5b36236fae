// The command line of the `mpt` binary (CLI11): `list`, `env`, `compare` and one
// subcommand per experiment of the registry, with the options every experiment has.
#pragma once

namespace mpt {

/// Entry point of the `mpt` binary: parses argv and dispatches; returns the exit code
/// (0 ok, 1 a check failed, 2 usage or config error, 3 runtime error or lost output).
int main_cli(int argc, char** argv);

}  // namespace mpt
