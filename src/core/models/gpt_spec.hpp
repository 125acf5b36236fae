// The config keys of a tiny GPT and of its text corpus (core/models/gpt, core/io/data), declared once so
// that every experiment that trains the GPT names them the same way under its own prefix
// ("/model" in shard and fp8, "/gpt/model" in lossscale), with the same bounds and checks.
#pragma once

#include <string>

#include "core/io/config.hpp"
#include "core/io/data.hpp"
#include "core/models/gpt.hpp"

namespace mpt {

/// Defaults of the GPT keys (an experiment picks what keeps its defaults within budget).
struct GptKeyDefaults {
  int64_t layers = 2, width = 64, heads = 4, context = 32, mlp_ratio = 4;
};

/// Adds `prefix`/layers, /width, /heads, /context and /mlp_ratio (GptConfig's fields; the
/// vocabulary comes from the corpus) to `s`. `prefix` is a JSON pointer such as "/model".
void add_gpt_keys(ConfigSpec& s, const std::string& prefix, const GptKeyDefaults& d = {});

/// Adds `prefix`/text_dir and /text_files: the fortune(6) cookie files of Debian's `fortunes`
/// package that load_text_corpus reads (kFortunesDir, kDefaultFortuneFiles).
void add_text_keys(ConfigSpec& s, const std::string& prefix);

/// Adds the keys of SGD with momentum on the GPT (core/train/amp's SgdMomentum, as torch.optim.SGD):
/// `prefix`/lr (> 0, default `lr`), /momentum (in [0, 1), default `momentum`), and how the loss is
/// reported: /eval_batches (validation batches of the last 10 % of the text) and /mean_of_last (the
/// training loss shown: the mean of the last N steps).
void add_gpt_training_keys(ConfigSpec& s, const std::string& prefix, double lr, double momentum);

/// The GptConfig the keys under `prefix` describe, with `vocab` tokens (TextCorpus::vocab()).
GptConfig gpt_config_at(const Config& cfg, const std::string& prefix, int64_t vocab);

/// Cross-key checks, for an experiment's validate(): heads divides width, and when `text_prefix`
/// is given its text keys' (validate_text_files, with `prefix`/context as the context key). Throws
/// ConfigError naming the pointer.
void validate_gpt_keys(const Config& cfg, const std::string& prefix, const std::string& text_prefix = "",
                       bool validation_windows = true);

/// The validation fraction of every GPT corpus (load_text_corpus's default: the last 10 %).
inline constexpr double kTextValFraction = 0.1;

/// Cross-key checks of the text keys under `prefix`, for an experiment's validate(): at least one
/// file; no entry that is a directory, empty, not a regular file or over the size cap (core/io/data's
/// text_file_problem); and, when every file exists and reads, a cleaned corpus that splits into
/// training and validation text of ≥ 2 tokens each and, when `context_key` is given, a training
/// split (and with `validation_windows` a validation split) of more tokens than the context (the
/// windows of context + 1 tokens that text_batch draws). Throws ConfigError naming
/// the entry's pointer (`prefix`/text_files/i, its path and what it is), `prefix`/text_files or
/// `context_key`. A missing or unreadable file is left to load_text_corpus at run time (missing
/// data: RuntimeFailure, exit 3).
void validate_text_files(const Config& cfg, const std::string& prefix, const std::string& context_key = "",
                         bool validation_windows = true);

/// The corpus the text keys under `prefix` name (load_text_corpus). Throws RuntimeFailure for a
/// missing or unreadable file (the message names the path and the package).
TextCorpus load_text_corpus_at(const Config& cfg, const std::string& prefix);

}  // namespace mpt
