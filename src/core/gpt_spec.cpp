#include "core/gpt_spec.hpp"

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
  s.strings(p + "/text_files", kDefaultFortuneFiles, {}, "cookie files read, in order");
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

void validate_gpt_keys(const Config& cfg, const std::string& p, const std::string& text_prefix) {
  const int64_t w = cfg.integer(p + "/width"), h = cfg.integer(p + "/heads");
  if (w % h != 0)
    throw ConfigError(fmt::format("{}/heads: expected a divisor of {}/width ({}), got {}", p, p, w, h));
  if (!text_prefix.empty() && cfg.strings(text_prefix + "/text_files").empty())
    throw ConfigError(fmt::format("{}/text_files: expected at least one file, got []", text_prefix));
}

TextCorpus load_text_corpus_at(const Config& cfg, const std::string& p) {
  return load_text_corpus(cfg.str(p + "/text_dir"), cfg.strings(p + "/text_files"));
}

}  // namespace mpt
