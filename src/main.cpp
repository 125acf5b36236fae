// mpt: mixed-precision and parallel-training experiments. All logic lives in the core
// library (src/core) and the experiment files (src/experiments); this stays thin.
#include "core/harness.hpp"

int main(int argc, char** argv) { return mpt::main_cli(argc, argv); }
