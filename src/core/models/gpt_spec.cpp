#include "core/models/gpt_spec.hpp"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "core/errors.hpp"

namespace mpt {

void add_gpt_keys(ConfigSpec& s, const std::string& p, const GptKeyDefaults& d) {
  s.integer(p + "/layers", d.layers, "transformer blocks", 1, 64);
  s.integer(p + "/width", d.width, "model width C (n_embd)", 1, 4096);
  s.integer(p + "/heads", d.heads, "attention heads (must divide the width)", 1, 256);
  s.integer(p + "/context", d.context, "tokens per sequence T (block size)", 1, 4096);
  s.integer(p + "/mlp_ratio", d.mlp_ratio, "MLP hidden width / width", 1, 16);
}

void add_text_keys(ConfigSpec& s, const std::string& p) {
  s.string(p + "/text_dir", kFortunesDir, "folder of the text corpus (Debian's fortunes package)");
  s.strings(p + "/text_files", kDefaultFortuneFiles, {}, "cookie files read, in order (names inside text_dir, or absolute paths)");
}

void add_gpt_training_keys(ConfigSpec& s, const std::string& p, double lr, double momentum) {
  Param l{ParamType::Number, lr, "SGD learning rate (> 0)"};
  l.exclusive_min = 0.0;
  s.add(p + "/lr", l);
  Param m{ParamType::Number, momentum, "SGD momentum (in [0, 1))"};
  m.min = 0.0;
  m.exclusive_max = 1.0;
  s.add(p + "/momentum", m);
  s.integer(p + "/eval_batches", 4, "validation batches (windows of the last 10% of the text)", 1, 100000);
  s.integer(p + "/mean_of_last", 10, "training loss reported: the mean of the last N steps (all of them if fewer)", 1,
            10'000'000);
}

GptConfig gpt_config_at(const Config& cfg, const std::string& p, int64_t vocab) {
  GptConfig g;
  g.vocab = vocab;
  g.layers = cfg.integer(p + "/layers");
  g.width = cfg.integer(p + "/width");
  g.heads = cfg.integer(p + "/heads");
  g.context = cfg.integer(p + "/context");
  g.mlp_ratio = cfg.integer(p + "/mlp_ratio");
  return g;
}

void validate_gpt_keys(const Config& cfg, const std::string& p, const std::string& text_prefix, bool validation_windows) {
  const int64_t w = cfg.integer(p + "/width"), h = cfg.integer(p + "/heads");
  if (w % h != 0)
    throw ConfigError(fmt::format("{}/heads: expected a divisor of {}/width ({}), got {}", p, p, w, h));
  if (!text_prefix.empty()) validate_text_files(cfg, text_prefix, p + "/context", validation_windows);
}

void validate_text_files(const Config& cfg, const std::string& p, const std::string& context_key,
                         bool validation_windows) {
  const auto files = cfg.strings(p + "/text_files");
  if (files.empty()) throw ConfigError(fmt::format("{}/text_files: expected at least one file, got []", p));
  const std::string dir = cfg.str(p + "/text_dir");
  bool all_there = true;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string path = text_file_path(dir, files[i]);
    if (const std::string problem = text_file_problem(path); !problem.empty())
      throw ConfigError(fmt::format("{}/text_files/{}: expected a text file (a fortune cookie file inside {}/text_dir), "
                                    "got \"{}\": {} {}", p, i, p, printable_text(files[i]), printable_text(path), problem));
    std::error_code e;
    all_there = all_there && std::filesystem::exists(path, e);
  }
  if (!all_there) return;  // missing data: load_text_corpus says so at run time (exit 3)
  // The files are regular and within the cap (a few hundred KB by default): read them to check the split.
  std::string text;
  try {
    text = read_text_corpus(dir, files);
  } catch (const RuntimeFailure&) {
    return;  // unreadable: an I/O failure, reported at run time
  }
  const auto n = static_cast<int64_t>(text.size());
  const int64_t train = text_train_size(n, kTextValFraction), val = n - train;
  if (train < 2 || val < 2)
    throw ConfigError(fmt::format("{}/text_files: expected a corpus long enough to split into training and validation "
                                  "text ({} %: at least 2 characters each), got {} characters after cleaning",
                                  p, 100 * kTextValFraction, n));
  if (context_key.empty()) return;
  const int64_t t = cfg.integer(context_key);
  const bool short_train = train <= t, short_val = validation_windows && val <= t;
  if (short_train || short_val)
    throw ConfigError(fmt::format("{}: expected fewer tokens than the {} split of {}/text_files ({} of {} "
                                  "characters; windows of context + 1 tokens are drawn from it), got {}",
                                  context_key, short_train ? "training" : "validation", p, short_train ? train : val,
                                  n, t));
}

TextCorpus load_text_corpus_at(const Config& cfg, const std::string& p) {
  return load_text_corpus(cfg.str(p + "/text_dir"), cfg.strings(p + "/text_files"), kTextValFraction);
}

}  // namespace mpt
