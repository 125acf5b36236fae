// mpt: mixed-precision and parallel-training experiments. All logic lives in the app layer
// (src/app: command line, harness), the experiment files (src/experiments) and the core
// library (src/core); this stays thin.
#include "app/cli.hpp"

int main(int argc, char** argv) { return mpt::main_cli(argc, argv); }
