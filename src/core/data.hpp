// Data: Fashion-MNIST from Debian's `dataset-fashion-mnist` package (IDX files, gzip)
// and synthetic data. Loading is real: the IDX headers are checked (magic numbers
// 0x00000803 images / 0x00000801 labels, counts agree) and a missing or corrupt file
// is a RuntimeFailure (exit 3) naming the package and the path.
#pragma once

#include <string>

#include <torch/torch.h>

namespace mpt {

/// Default folder of Debian's dataset-fashion-mnist package.
inline const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// A labelled data set held in memory.
struct Dataset {
  torch::Tensor images;  ///< [N, 1, 28, 28] float32, normalised (x/255 − mean)/std
  torch::Tensor labels;  ///< [N] int64 in [0, 10)
  int64_t size() const { return labels.size(0); }
};

/// Loads split "train" (60000) or "test" (10000) from `dir`, keeping the first `limit`
/// samples (limit ≤ 0: all). Pixels scaled to [0,1] then normalised with Fashion-MNIST's
/// usual mean 0.2860 and std 0.3530 (as torchvision examples do).
/// Throws RuntimeFailure for a missing, truncated or malformed file.
Dataset load_fashion_mnist(const std::string& dir, const std::string& split, int64_t limit = 0);

/// Most data bytes read from one IDX file (Fashion-MNIST's largest holds 47,040,000).
inline constexpr std::size_t kMaxIdxBytes = std::size_t{1} << 28;

/// Reads a gzip-compressed IDX file (LeCun et al.'s MNIST format) into a uint8 tensor
/// of the shape its header gives. The header is checked first: a promise of more than
/// `max_bytes` is refused, and no more than header + promised bytes (+1) are ever inflated,
/// so a gzip bomb fails fast. Throws RuntimeFailure naming the path.
torch::Tensor read_idx_gz(const std::string& path, std::size_t max_bytes = kMaxIdxBytes);

/// A fixed permutation of [0, n) from `seed` (independent of the global generator, so
/// data order does not shift model initialisation): torch.randperm with its own Generator.
torch::Tensor shuffled_indices(int64_t n, uint64_t seed);

}  // namespace mpt
