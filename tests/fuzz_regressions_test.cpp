// Replays the fuzz targets' seed corpus and regression inputs (tests/fuzz/) through the same
// bodies in the ordinary build (no sanitizers): each input must end cleanly or in a short,
// printable ConfigError. scripts/fuzz.sh replays them under ASan + UBSan as well.
#include <filesystem>
#include <fstream>
#include <iterator>

#include "catch.hpp"
#include "fuzz/fuzz_bodies.hpp"

namespace {

void replay(const std::string& target, void (*body)(const std::uint8_t*, std::size_t)) {
  namespace fs = std::filesystem;
  std::size_t n = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(MPT_SOURCE_DIR) / "tests" / "fuzz" / kind / target;
    REQUIRE(fs::is_directory(dir));
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::ifstream in(entry.path(), std::ios::binary);
      const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      INFO(entry.path().string());
      CHECK_NOTHROW(body(reinterpret_cast<const std::uint8_t*>(data.data()), data.size()));
      ++n;
    }
  }
  CHECK(n >= 5);
}

}  // namespace

TEST_CASE("fuzz inputs of the config loader end cleanly", "[fuzz]") { replay("config", mpt::fuzz::fuzz_config_one); }

TEST_CASE("fuzz inputs of the result reader end cleanly", "[fuzz]") { replay("compare", mpt::fuzz::fuzz_compare_one); }
