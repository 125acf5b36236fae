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

/// Reads a gzip-compressed IDX file (LeCun et al.'s MNIST format) into a uint8 tensor
/// of the shape its header gives. Throws RuntimeFailure naming the path.
torch::Tensor read_idx_gz(const std::string& path);

/// A fixed permutation of [0, n) from `seed` (independent of the global generator, so
/// data order does not shift model initialisation): torch.randperm with its own Generator.
torch::Tensor shuffled_indices(int64_t n, uint64_t seed);

}  // namespace mpt
