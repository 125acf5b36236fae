// libFuzzer target: the config loader and merger (--config text and --set strings).
// Built and run by scripts/fuzz.sh; the body is in fuzz_bodies.hpp.
#include "fuzz_bodies.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  mpt::fuzz::fuzz_config_one(data, size);
  return 0;
}
