// Fashion-MNIST loader (core/io/data): real files from Debian's package, and corrupt ones.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <sys/stat.h>

#include <unistd.h>
#include <zlib.h>

#include <fmt/format.h>

#include "catch.hpp"
#include "core/io/data.hpp"
#include "core/errors.hpp"

using namespace mpt;

TEST_CASE("Fashion-MNIST test split loads with the documented shape and labels", "[data]") {
  if (!std::filesystem::exists(std::string(kFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz")) {
    WARN("dataset-fashion-mnist is not installed; skipping");
    return;
  }
  Dataset d = load_fashion_mnist(kFashionMnistDir, "test", 500);
  CHECK(d.size() == 500);
  CHECK(d.images.sizes() == torch::IntArrayRef({500, 1, 28, 28}));
  CHECK(d.labels.min().item<int64_t>() >= 0);
  CHECK(d.labels.max().item<int64_t>() <= 9);
  // Fashion-MNIST's t10k labels start 9 (ankle boot), 2 (pullover), 1 (trouser), 1.
  CHECK(d.labels[0].item<int64_t>() == 9);
  CHECK(d.labels[1].item<int64_t>() == 2);
  CHECK(d.labels[2].item<int64_t>() == 1);
  Dataset all = load_fashion_mnist(kFashionMnistDir, "test");
  CHECK(all.size() == 10000);
}

TEST_CASE("missing and corrupt IDX files are RuntimeFailures naming the path and package", "[data]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("mpt_data_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  try {
    load_fashion_mnist(dir.string(), "test");
    FAIL("expected a RuntimeFailure");
  } catch (const RuntimeFailure& e) {
    std::string m = e.what();
    CHECK(m.find("t10k-images-idx3-ubyte.gz") != std::string::npos);
    CHECK(m.find("dataset-fashion-mnist") != std::string::npos);
  }
  // A gzip file whose IDX header promises more bytes than it holds.
  std::string path = (dir / "short.gz").string();
  gzFile f = gzopen(path.c_str(), "wb");
  const unsigned char hdr[] = {0, 0, 8, 1, 0, 0, 0, 10, 1, 2, 3};
  gzwrite(f, hdr, sizeof(hdr));
  gzclose(f);
  CHECK_THROWS_AS(read_idx_gz(path), RuntimeFailure);
  // Not gzip at all, and not IDX: bad magic.
  std::ofstream(dir / "plain.gz") << "hello world";
  CHECK_THROWS_AS(read_idx_gz((dir / "plain.gz").string()), RuntimeFailure);
  fs::remove_all(dir);
}

TEST_CASE("IDX headers are checked before inflating: a gzip bomb is refused early", "[data]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("mpt_data_bomb_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // A header that promises 10 bytes, then 64 MiB of zeros (a small gzip file): refused as
  // longer than its header, having inflated no more than header + 10 + 1 bytes.
  std::string bomb = (dir / "bomb.gz").string();
  gzFile f = gzopen(bomb.c_str(), "wb9");
  const unsigned char hdr[] = {0, 0, 8, 1, 0, 0, 0, 10};
  gzwrite(f, hdr, sizeof(hdr));
  std::vector<unsigned char> zeros(1 << 20, 0);
  for (int i = 0; i < 64; ++i) gzwrite(f, zeros.data(), static_cast<unsigned>(zeros.size()));
  gzclose(f);
  try {
    read_idx_gz(bomb);
    FAIL("expected a RuntimeFailure");
  } catch (const RuntimeFailure& e) {
    CHECK_THAT(e.what(), Catch::Contains("more data than its header promises (18 bytes)"));
  }
  // A header that promises more than the cap (4 x 2^32-1 dimensions: also no overflow).
  std::string huge = (dir / "huge.gz").string();
  f = gzopen(huge.c_str(), "wb");
  const unsigned char big[] = {0, 0, 8, 4, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
                               255, 255, 255, 255};
  gzwrite(f, big, sizeof(big));
  gzclose(f);
  try {
    read_idx_gz(huge);
    FAIL("expected a RuntimeFailure");
  } catch (const RuntimeFailure& e) {
    CHECK_THAT(e.what(), Catch::Contains("its header promises 4294967295 x 4294967295"));
  }
  // The cap is a parameter: 60000 x 28 x 28 passes the default, not a cap of 1 MiB.
  std::string ok = (dir / "ok.gz").string();
  f = gzopen(ok.c_str(), "wb");
  const unsigned char two[] = {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6};
  gzwrite(f, two, sizeof(two));
  gzclose(f);
  auto t = read_idx_gz(ok);
  CHECK(t.sizes() == torch::IntArrayRef({2, 3}));
  CHECK(t[1][2].item<int>() == 6);
  CHECK_THROWS_AS(read_idx_gz(ok, 5), RuntimeFailure);
  fs::remove_all(dir);
}

TEST_CASE("shuffled_indices is a permutation fixed by its seed", "[data]") {
  auto a = shuffled_indices(100, 5), b = shuffled_indices(100, 5), c = shuffled_indices(100, 6);
  CHECK(torch::equal(a, b));
  CHECK_FALSE(torch::equal(a, c));
  CHECK(torch::equal(std::get<0>(a.sort()), torch::arange(100)));
}

TEST_CASE("clean_fortune_text drops separators, overstrikes and non-ASCII, tabs become spaces", "[data]") {
  const std::string raw = "A\tb\n%\nc_\bd\xc3\xa9\n%\n";
  CHECK(clean_fortune_text(raw) == "A b\ncd\n");
}

TEST_CASE("the fortunes corpus: sorted character vocabulary, 90/10 split, decode inverts encode", "[data]") {
  TextCorpus c;
  try {
    c = load_text_corpus(kFortunesDir, kDefaultFortuneFiles);
  } catch (const RuntimeFailure& e) {
    FAIL("Debian's fortunes package (scripts/setup.sh installs it) is missing: " << e.what());
  }
  CHECK(c.vocab() <= 96);
  CHECK(c.vocab() > 60);
  CHECK(std::is_sorted(c.chars.begin(), c.chars.end()));
  const int64_t n = c.train.size(0) + c.val.size(0);
  CHECK(c.train.size(0) == static_cast<int64_t>(std::floor(0.9 * static_cast<double>(n))));
  CHECK(c.train.min().item<int64_t>() >= 0);
  CHECK(c.train.max().item<int64_t>() < c.vocab());
  const std::string text = c.decode(c.train);
  CHECK(text.size() == static_cast<std::size_t>(c.train.size(0)));
  CHECK(text.find("\n%\n") == std::string::npos);  // no separator line is left
  CHECK(text.find('\b') == std::string::npos);
}

TEST_CASE("text_file_problem: a directory or an empty file, found before reading; the loader says the same", "[data]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("mpt_text_problem_{}", ::getpid());
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "empty").close();
  std::ofstream(dir / "ok") << "%\nhello world\n%\n";
  fs::create_symlink(dir / "sub", dir / "link_to_dir");
  CHECK(text_file_problem((dir / "sub").string()) == "is a directory");
  CHECK(text_file_problem((dir / "link_to_dir").string()) == "is a directory");  // links followed
  CHECK(text_file_problem((dir / "empty").string()) == "is empty");
  CHECK(text_file_problem((dir / "ok").string()).empty());
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  CHECK(text_file_problem((dir / "fifo").string()) == "is not a regular file (a FIFO, device or socket)");  // never blocks
  CHECK(text_file_problem("/dev/zero") == "is not a regular file (a FIFO, device or socket)");
  CHECK(text_file_problem((dir / "missing").string()).empty());  // missing data: the loader's (exit 3)
  // Over the cap, found by its size without reading it: a sparse file one byte past 64 MiB.
  std::ofstream(dir / "huge").close();
  fs::resize_file(dir / "huge", kMaxTextFileBytes + 1);
  CHECK(text_file_problem((dir / "huge").string()) ==
        fmt::format("is {} bytes, larger than the {}-byte cap of a text file", kMaxTextFileBytes + 1, kMaxTextFileBytes));
  CHECK(text_file_problem((dir / "ok").string(), 5) == "is 16 bytes, larger than the 5-byte cap of a text file");
  CHECK(text_file_problem((dir / "ok").string(), 16).empty());
  for (const char* bad : {"sub", "empty", "huge"}) {
    INFO(bad);
    try {
      load_text_corpus(dir.string(), {"ok", bad});
      FAIL("expected a RuntimeFailure");
    } catch (const RuntimeFailure& e) {
      const std::string b = bad;
      CHECK(std::string(e.what()).find(b == "sub" ? "is a directory" : b == "empty" ? "is empty" : "-byte cap") !=
            std::string::npos);
    }
  }
  // "hello world\n" is 12 characters: the split at 10 % keeps ⌊10.8⌋ = 10 and 2; "hi\n" leaves 1 for validation.
  CHECK(read_text_corpus(dir.string(), {"ok"}) == "hello world\n");
  // An absolute name is taken as it is, not glued onto the folder (the probe: "/d//usr/share/...").
  CHECK(text_file_path("/some/dir", "f") == "/some/dir/f");
  CHECK(text_file_path("/some/dir", (dir / "ok").string()) == (dir / "ok").string());
  CHECK(read_text_corpus("/nonexistent", {(dir / "ok").string()}) == "hello world\n");
  CHECK(text_train_size(12, 0.1) == 10);
  CHECK(load_text_corpus(dir.string(), {"ok"}).val.numel() == 2);
  std::ofstream(dir / "short") << "hi\n";
  CHECK_THROWS_WITH(load_text_corpus(dir.string(), {"short"}), Catch::Contains("too short to split"));
  fs::remove_all(dir);
}

TEST_CASE("text_batch: windows and next-token targets, fixed by the generator's seed", "[data]") {
  auto tokens = torch::arange(100, torch::kLong);
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(5);
  auto g2 = at::make_generator<at::CPUGeneratorImpl>(5);
  auto [x, y] = text_batch(tokens, 4, 10, g1);
  auto [x2, y2] = text_batch(tokens, 4, 10, g2);
  CHECK(x.sizes() == torch::IntArrayRef({4, 10}));
  CHECK(torch::equal(y, x + 1));  // tokens are 0..99, so the next token is x + 1
  CHECK(torch::equal(x, x2));
  CHECK(x.max().item<int64_t>() <= 99 - 1);
  CHECK_THROWS_AS(text_batch(tokens, 4, 100, g1), std::invalid_argument);
  CHECK_THROWS_AS(text_batch(tokens, 0, 10, g1), std::invalid_argument);
  CHECK_THROWS_AS(load_text_corpus("/nonexistent", {"x"}), RuntimeFailure);
  CHECK_THROWS_AS(load_text_corpus(kFortunesDir, {}), std::invalid_argument);
}
