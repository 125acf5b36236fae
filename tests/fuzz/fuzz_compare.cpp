// libFuzzer target: the result reader of `mpt compare` (two result files and the comparison).
// Built and run by scripts/fuzz.sh; the body is in fuzz_bodies.hpp.
#include "fuzz_bodies.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  mpt::fuzz::fuzz_compare_one(data, size);
  return 0;
}
