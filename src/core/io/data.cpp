// Fashion-MNIST and text corpus loading. See data.hpp.
#include "core/io/data.hpp"

#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "core/io/config.hpp"
#include "core/errors.hpp"

namespace mpt {

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw RuntimeFailure(fmt::format("{}: {} (Fashion-MNIST comes from Debian's dataset-fashion-mnist package: "
                                   "apt-get install --reinstall dataset-fashion-mnist, or point the config's data "
                                   "folder, /data/dir (lossscale: /train/data_dir), at a folder with its files)",
                                   path, what));
}

uint32_t be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace

torch::Tensor read_idx_gz(const std::string& path, std::size_t max_bytes) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) bad(path, "cannot open");
  // Inflate only what the header promises (a gzip bomb must not reach memory): the header
  // first, then exactly its element count, then one byte more to tell a longer stream.
  auto read = [&](void* dst, std::size_t n) -> std::size_t {
    std::size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
      const int got = gzread(f, static_cast<unsigned char*>(dst) + done, chunk);
      if (got < 0) {
        int err = 0;
        const char* msg = gzerror(f, &err);
        const std::string text = msg ? msg : "";
        gzclose(f);
        bad(path, "corrupt gzip stream: " + text);
      }
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  };
  unsigned char head[4 + 4 * 4];
  if (read(head, 4) < 4) {
    gzclose(f);
    bad(path, "too short for an IDX header");
  }
  // IDX: 0, 0, type (0x08 = unsigned byte), number of dimensions; then big-endian sizes.
  if (head[0] != 0 || head[1] != 0 || head[2] != 0x08) {
    gzclose(f);
    bad(path, "not an unsigned-byte IDX file (bad magic number)");
  }
  const int ndim = head[3];
  if (ndim < 1 || ndim > 4 || read(head + 4, 4u * ndim) < 4u * ndim) {
    gzclose(f);
    bad(path, "bad IDX header");
  }
  std::vector<int64_t> shape;
  std::size_t count = 1;
  bool too_large = false;
  for (int i = 0; i < ndim; ++i) {
    shape.push_back(be32(&head[4 + 4 * i]));
    const auto dim = static_cast<std::size_t>(shape.back());
    if (dim != 0 && count > max_bytes / dim) too_large = true;  // no overflow: stop counting
    else count *= dim;
  }
  const std::size_t offset = 4 + 4 * ndim;
  if (too_large || count > max_bytes) {
    gzclose(f);
    std::string dims;
    for (auto d : shape) dims += (dims.empty() ? "" : " x ") + std::to_string(d);
    bad(path, fmt::format("its header promises {} bytes of data, more than the {} bytes mpt reads from an IDX file "
                          "(not a Fashion-MNIST file?)", dims, max_bytes));
  }
  auto t = torch::empty(shape, torch::kUInt8);
  const std::size_t got = read(t.data_ptr<uint8_t>(), count);
  unsigned char extra = 0;
  const bool longer = got == count && read(&extra, 1) == 1;
  gzclose(f);
  if (got != count)
    bad(path, fmt::format("size {} does not match its header ({} bytes expected): truncated?", offset + got,
                          offset + count));
  if (longer) bad(path, fmt::format("more data than its header promises ({} bytes): corrupt or not an IDX file?",
                                    offset + count));
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

void require_fashion_mnist(const std::string& dir, const std::string& pointer, bool with_test) {
  std::vector<std::string> stems{"train"};
  if (with_test) stems.push_back("t10k");
  for (const auto& stem : stems)
    for (const char* kind : {"-images-idx3-ubyte.gz", "-labels-idx1-ubyte.gz"}) {
      const std::string path = dir + "/" + stem + kind;
      std::error_code ec;
      const bool is_dir = std::filesystem::is_directory(path, ec);
      std::ifstream in(path, std::ios::binary);
      if (!in || is_dir) {
        const std::string why = is_dir ? "a directory" : std::strerror(errno);
        throw ConfigError(fmt::format("{}: expected a folder with Fashion-MNIST's IDX .gz files (Debian's "
                                      "dataset-fashion-mnist package: apt-get install dataset-fashion-mnist, "
                                      "files in {}), got '{}': {}: cannot open ({})",
                                      pointer, kFashionMnistDir, printable_text(dir, 200), stem + kind, why));
      }
    }
}

torch::Tensor shuffled_indices(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong));
}

std::string TextCorpus::decode(const torch::Tensor& tokens) const {
  auto flat = tokens.reshape({-1}).to(torch::kLong).contiguous();
  std::string out;
  out.reserve(static_cast<std::size_t>(flat.numel()));
  const auto* p = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) out.push_back(chars.at(static_cast<std::size_t>(p[i])));
  return out;
}

std::string clean_fortune_text(const std::string& raw) {
  std::string out;
  out.reserve(raw.size());
  std::istringstream in(raw);
  std::string line;
  while (std::getline(in, line)) {
    if (line == "%") continue;
    const std::size_t line_start = out.size();
    for (const char ch : line) {
      const auto c = static_cast<unsigned char>(ch);
      // Overstriking (nroff's underline "_\bX" and bold "X\bX"): the backspace takes back
      // the character before it, so X is what stays.
      if (c == '\b') {
        if (out.size() > line_start) out.pop_back();
      } else if (c == '\t') out.push_back(' ');
      else if (c >= 0x20 && c <= 0x7E) out.push_back(static_cast<char>(c));
    }
    out.push_back('\n');
  }
  return out;
}

std::string text_file_problem(const std::string& path, std::size_t max_bytes) {
  namespace fs = std::filesystem;
  std::error_code e;
  const fs::file_status st = fs::status(path, e);
  if (e) return "";  // missing or not examinable: the reader says so at run time
  if (fs::is_directory(st)) return "is a directory";
  // A FIFO would block the reader forever, a device (/dev/zero) never ends: text is a file.
  if (!fs::is_regular_file(st)) return "is not a regular file (a FIFO, device or socket)";
  const auto size = fs::file_size(path, e);
  if (e) return "";
  if (size == 0) return "is empty";
  if (size > max_bytes) return fmt::format("is {} bytes, larger than the {}-byte cap of a text file", size, max_bytes);
  return "";
}

std::string text_file_path(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

std::string read_text_corpus(const std::string& dir, const std::vector<std::string>& files, std::size_t max_bytes) {
  auto fail = [](const std::string& path, const std::string& what) {
    return RuntimeFailure(fmt::format("{}: {} (the text corpus comes from Debian's fortunes package: "
                                      "apt-get install fortunes, or set the text path in the config)",
                                      path, what));
  };
  std::string text;
  for (const auto& name : files) {
    const std::string path = text_file_path(dir, name);
    if (const std::string problem = text_file_problem(path, max_bytes); !problem.empty()) throw fail(path, problem);
    std::ifstream f(path, std::ios::binary);
    if (!f) throw fail(path, "cannot open");
    std::string raw;
    raw.resize(max_bytes + 1);
    f.read(raw.data(), static_cast<std::streamsize>(raw.size()));
    if (f.bad()) throw fail(path, "read error");
    raw.resize(static_cast<std::size_t>(f.gcount()));
    if (raw.size() > max_bytes) throw fail(path, fmt::format("larger than {} bytes", max_bytes));  // grew since
    text += clean_fortune_text(raw);
  }
  return text;
}

int64_t text_train_size(int64_t n, double val_fraction) {
  return static_cast<int64_t>(std::floor((1.0 - val_fraction) * static_cast<double>(n)));
}

TextCorpus load_text_corpus(const std::string& dir, const std::vector<std::string>& files, double val_fraction,
                            std::size_t max_bytes) {
  if (files.empty()) throw std::invalid_argument("load_text_corpus: no files");
  if (!(val_fraction > 0.0 && val_fraction < 1.0))
    throw std::invalid_argument(fmt::format("load_text_corpus: val_fraction must be in (0, 1), got {}", val_fraction));
  const std::string text = read_text_corpus(dir, files, max_bytes);
  const std::set<char> set(text.begin(), text.end());
  TextCorpus c;
  c.chars.assign(set.begin(), set.end());
  int64_t index[256];
  for (std::size_t i = 0; i < c.chars.size(); ++i) index[static_cast<unsigned char>(c.chars[i])] = static_cast<int64_t>(i);
  auto ids = torch::empty({static_cast<int64_t>(text.size())}, torch::kLong);
  auto* p = ids.data_ptr<int64_t>();
  for (std::size_t i = 0; i < text.size(); ++i) p[i] = index[static_cast<unsigned char>(text[i])];
  const int64_t n_train = text_train_size(ids.size(0), val_fraction);
  if (n_train < 2 || ids.size(0) - n_train < 2)
    throw RuntimeFailure(fmt::format("{}: corpus of {} characters is too short to split at {}", dir, text.size(),
                                     val_fraction));
  c.train = ids.slice(0, 0, n_train).clone();
  c.val = ids.slice(0, n_train).clone();
  return c;
}

std::pair<torch::Tensor, torch::Tensor> text_batch(const torch::Tensor& tokens, int64_t batch, int64_t context,
                                                   at::Generator& gen) {
  const int64_t n = tokens.size(0);
  if (batch < 1) throw std::invalid_argument("text_batch: batch must be >= 1");
  if (n <= context)
    throw std::invalid_argument(fmt::format("text_batch: {} tokens are too few for a context of {}", n, context));
  auto ix = torch::randint(n - context, {batch}, gen, torch::TensorOptions().dtype(torch::kLong));
  auto offsets = ix.unsqueeze(1) + torch::arange(context, torch::kLong).unsqueeze(0);  // [batch, context]
  return {tokens.index({offsets}), tokens.index({offsets + 1})};
}

}  // namespace mpt
