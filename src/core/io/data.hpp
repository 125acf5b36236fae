// Data: Fashion-MNIST from Debian's `dataset-fashion-mnist` package (IDX files, gzip),
// English text from Debian's `fortunes` package (character-level corpus), and synthetic data. Loading is real: the IDX headers are checked (magic numbers
// 0x00000803 images / 0x00000801 labels, counts agree) and a missing or corrupt file
// is a RuntimeFailure (exit 3) naming the package and the path.
#pragma once

#include <string>
#include <utility>
#include <vector>

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

/// Checks, before any work, that `dir` holds readable Fashion-MNIST files for the splits a run
/// loads ("train": train-*-ubyte.gz; `with_test`: t10k-*-ubyte.gz too), so that a wrong data
/// path fails once, in the launcher, as bad input. Only opens the files: their contents are
/// checked by load_fashion_mnist. Throws ConfigError naming `pointer` (the config key holding
/// `dir`, e.g. "/data/dir"), the file and the OS's reason (exit 2).
void require_fashion_mnist(const std::string& dir, const std::string& pointer, bool with_test);

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

// ─────────────────────────── text (character level) ───────────────────────────

/// Folder of Debian's `fortunes` package (fortune(6)'s cookie files: English text, one cookie
/// after another, each ended by a line holding only "%").
inline const char* kFortunesDir = "/usr/share/games/fortunes";
/// The cookie files the text lessons read by default (plain English: 480 KB, 95 characters).
inline const std::vector<std::string> kDefaultFortuneFiles = {"computers", "science", "literature", "wisdom"};
/// The largest text file a corpus reads (64 MiB: the fortunes package's files are ≤ 0.3 MB).
inline constexpr std::size_t kMaxTextFileBytes = std::size_t{64} << 20;

/// A character-level corpus (nanoGPT's shakespeare_char recipe): the vocabulary is the sorted set
/// of characters in the text, a token is a character's index in it, the first (1 − val_fraction)
/// of the tokens are the training split and the rest the validation split.
struct TextCorpus {
  std::string chars;    ///< the vocabulary, sorted by byte value; token i is chars[i]
  torch::Tensor train;  ///< [N_train] int64 token ids
  torch::Tensor val;    ///< [N_val] int64 token ids
  int64_t vocab() const { return static_cast<int64_t>(chars.size()); }
  /// Tokens (any shape, int64) back to text, row-major.
  std::string decode(const torch::Tensor& tokens) const;
};

/// fortune(6) text to plain text: the "%" separator lines are dropped, a backspace takes back the
/// character before it (the files' nroff overstriking "_\bX", "X\bX" leaves X), tabs become
/// spaces and only printable ASCII (0x20–0x7E) and newlines are kept (the few UTF-8 bytes go),
/// so the vocabulary is ≤ 96 characters on every machine.
std::string clean_fortune_text(const std::string& raw);

/// What makes `path` unusable as a file of a text corpus, found without reading it (symbolic links
/// followed): "is a directory", "is not a regular file (a FIFO, device or socket)" (a FIFO would
/// block the reader, /dev/zero never ends), "is empty" (0 bytes; a file that cleans to no text is
/// not found here), "is N bytes, larger than the `max_bytes`-byte cap", or "" for a regular file
/// within the cap and for a path that does not exist or cannot be examined (load_text_corpus
/// reports those at run time, as missing data: exit 3). For an experiment's validate(), which
/// names the config key (gpt_spec's validate_text_files).
std::string text_file_problem(const std::string& path, std::size_t max_bytes = kMaxTextFileBytes);

/// The path of a corpus file `name` in folder `dir`: dir/name, or `name` itself when it is absolute
/// (std::filesystem::path's operator/, as Python's os.path.join).
std::string text_file_path(const std::string& dir, const std::string& name);

/// Reads `files` (names inside `dir`, or absolute paths: text_file_path) in order, cleans each (clean_fortune_text) and joins them.
/// Throws RuntimeFailure naming the path and the `fortunes` package for a missing or unreadable
/// file, any text_file_problem, or a file over `max_bytes`.
std::string read_text_corpus(const std::string& dir, const std::vector<std::string>& files,
                             std::size_t max_bytes = kMaxTextFileBytes);

/// Tokens of the training split of an `n`-token text: ⌊(1 − val_fraction)·n⌋ (the rest is validation).
int64_t text_train_size(int64_t n, double val_fraction);

/// The corpus of read_text_corpus(dir, files, max_bytes), tokenised by its sorted characters and split
/// at text_train_size. Throws what read_text_corpus throws, RuntimeFailure for a corpus too short
/// to split (fewer than 2 tokens on either side); std::invalid_argument for val_fraction outside
/// (0, 1) or no files.
TextCorpus load_text_corpus(const std::string& dir, const std::vector<std::string>& files, double val_fraction = 0.1,
                            std::size_t max_bytes = kMaxTextFileBytes);

/// A batch of `batch` random windows of `context` tokens and their next tokens, as nanoGPT's
/// get_batch: ix = torch.randint(len(tokens) − context, (batch,), generator=gen); x[b] =
/// tokens[ix[b] : ix[b] + context], y[b] = tokens[ix[b] + 1 : ix[b] + 1 + context].
/// tokens [N] int64 → (x, y), each [batch, context] int64. Throws std::invalid_argument when
/// N ≤ context or batch < 1.
std::pair<torch::Tensor, torch::Tensor> text_batch(const torch::Tensor& tokens, int64_t batch, int64_t context,
                                                   at::Generator& gen);

}  // namespace mpt
