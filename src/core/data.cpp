// Fashion-MNIST loading. See data.hpp.
#include "core/data.hpp"

#include <zlib.h>

#include <fmt/format.h>

#include "core/errors.hpp"

namespace mpt {

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw RuntimeFailure(fmt::format("{}: {} (Fashion-MNIST comes from Debian's dataset-fashion-mnist package: "
                                   "apt-get install dataset-fashion-mnist, or set the data path in the config)",
                                   path, what));
}

uint32_t be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace

torch::Tensor read_idx_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) bad(path, "cannot open");
  std::vector<unsigned char> buf;
  unsigned char chunk[1 << 16];
  int n;
  while ((n = gzread(f, chunk, sizeof(chunk))) > 0) buf.insert(buf.end(), chunk, chunk + n);
  int err = 0;
  const char* msg = gzerror(f, &err);
  std::string errtext = (n < 0 && msg) ? msg : "";
  gzclose(f);
  if (n < 0) bad(path, "corrupt gzip stream: " + errtext);
  if (buf.size() < 4) bad(path, "too short for an IDX header");
  // IDX: 0, 0, type (0x08 = unsigned byte), number of dimensions; then big-endian sizes.
  if (buf[0] != 0 || buf[1] != 0 || buf[2] != 0x08) bad(path, "not an unsigned-byte IDX file (bad magic number)");
  const int ndim = buf[3];
  if (ndim < 1 || ndim > 4 || buf.size() < 4u + 4u * ndim) bad(path, "bad IDX header");
  std::vector<int64_t> shape;
  int64_t count = 1;
  for (int i = 0; i < ndim; ++i) {
    shape.push_back(be32(&buf[4 + 4 * i]));
    count *= shape.back();
  }
  const std::size_t offset = 4 + 4 * ndim;
  if (buf.size() != offset + static_cast<std::size_t>(count))
    bad(path, fmt::format("size {} does not match its header ({} bytes expected): truncated?", buf.size(),
                          offset + count));
  auto t = torch::empty(shape, torch::kUInt8);
  std::memcpy(t.data_ptr<uint8_t>(), buf.data() + offset, static_cast<std::size_t>(count));
  return t;
}

Dataset load_fashion_mnist(const std::string& dir, const std::string& split, int64_t limit) {
  if (split != "train" && split != "test") throw std::invalid_argument("split must be train or test");
  const std::string stem = split == "train" ? "train" : "t10k";
  const std::string ipath = dir + "/" + stem + "-images-idx3-ubyte.gz";
  const std::string lpath = dir + "/" + stem + "-labels-idx1-ubyte.gz";
  auto images = read_idx_gz(ipath);
  auto labels = read_idx_gz(lpath);
  if (images.dim() != 3 || images.size(1) != 28 || images.size(2) != 28) bad(ipath, "expected images of 28x28");
  if (labels.dim() != 1 || labels.size(0) != images.size(0))
    bad(lpath, fmt::format("{} labels for {} images", labels.size(0), images.size(0)));
  int64_t n = images.size(0);
  if (limit > 0 && limit < n) n = limit;
  Dataset d;
  constexpr double kMean = 0.2860, kStd = 0.3530;
  d.images = ((images.slice(0, 0, n).to(torch::kFloat) / 255.0 - kMean) / kStd).unsqueeze(1).contiguous();
  d.labels = labels.slice(0, 0, n).to(torch::kLong).contiguous();
  if (d.labels.max().item<int64_t>() > 9) bad(lpath, "label outside 0..9");
  return d;
}

torch::Tensor shuffled_indices(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong));
}

}  // namespace mpt
