// Shared models. See mlp.hpp.
#include "core/models/mlp.hpp"

#include "core/runtime/runtime.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include <emmintrin.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>

#include <fmt/format.h>

namespace mpt {

torch::nn::Sequential deep_sigmoid_net(int64_t in_dim, int64_t width, int64_t depth) {
  if (in_dim < 1 || width < 1 || depth < 1) throw std::invalid_argument("deep_sigmoid_net: sizes must be >= 1");
  torch::nn::Sequential net;
  int64_t d = in_dim;
  for (int64_t i = 0; i < depth; ++i) {
    net->push_back(torch::nn::Linear(d, width));
    net->push_back(torch::nn::Sigmoid());
    d = width;
  }
  net->push_back(torch::nn::Linear(width, 1));
  return net;
}

torch::nn::Sequential mlp(int64_t in_dim, const std::vector<int64_t>& hidden, int64_t out_dim, bool batchnorm) {
  if (in_dim < 1 || out_dim < 1) throw std::invalid_argument("mlp: sizes must be >= 1");
  // Pushed one by one: in Sequential(a, b, c) C++ may construct the arguments in any order,
  // and the order of construction is the order of the RNG draws.
  torch::nn::Sequential net;
  net->push_back(torch::nn::Flatten());
  int64_t d = in_dim;
  for (const int64_t w : hidden) {
    if (w < 1) throw std::invalid_argument("mlp: hidden widths must be >= 1");
    net->push_back(torch::nn::Linear(d, w));
    if (batchnorm) net->push_back(torch::nn::BatchNorm1d(w));
    net->push_back(torch::nn::ReLU());
    d = w;
  }
  net->push_back(torch::nn::Linear(d, out_dim));
  return net;
}

// ---------------------------------------------------------------------------------------------
// Dropout
// ---------------------------------------------------------------------------------------------
namespace {

// The words an at::mt19937 gives for `count` calls, written to out[0 .. count), and the state it
// is left in: the engine's operator() (ATen/core/MT19937RNGEngine.h) one refill of 624 words at a
// time. A call decrements left_ and refills the state when it reaches 0 (then left_ = 624,
// next_ = 0), reads state_[next_++] and tempers it; so left_ − 1 words can be read before the next
// refill, and left_ = 625 after a refill stands for "the first read refilled".
void mt19937_words(at::mt19937_data_pod& d, std::uint32_t* out, int64_t count) {
  constexpr int N = at::MERSENNE_STATE_N, M = at::MERSENNE_STATE_M;
  auto twist = [](std::uint32_t u, std::uint32_t v) {
    return (((u & at::UMASK) | (v & at::LMASK)) >> 1) ^ ((v & 1u) ? at::MATRIX_A : 0u);
  };
  while (count > 0) {
    if (d.left_ == 1) {  // the next call refills: the engine's next_state()
      std::uint32_t* s = d.state_.data();
      for (int j = 0; j < N - M; ++j) s[j] = s[j + M] ^ twist(s[j], s[j + 1]);
      for (int j = N - M; j < N - 1; ++j) s[j] = s[j + M - N] ^ twist(s[j], s[j + 1]);
      s[N - 1] = s[M - 1] ^ twist(s[N - 1], s[0]);
      d.left_ = N + 1;
      d.next_ = 0;
    }
    const int64_t k = std::min<int64_t>(count, d.left_ - 1);
    const std::uint32_t* s = d.state_.data() + d.next_;
    int64_t i = 0;
    // The tempering, four words at a time (SSE2: every x86-64 CPU has it), then the rest one by one.
    for (; i + 4 <= k; i += 4) {
      __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      y = _mm_xor_si128(y, _mm_srli_epi32(y, 11));
      y = _mm_xor_si128(y, _mm_and_si128(_mm_slli_epi32(y, 7), _mm_set1_epi32(static_cast<int>(0x9d2c5680u))));
      y = _mm_xor_si128(y, _mm_and_si128(_mm_slli_epi32(y, 15), _mm_set1_epi32(static_cast<int>(0xefc60000u))));
      y = _mm_xor_si128(y, _mm_srli_epi32(y, 18));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), y);
    }
    for (; i < k; ++i) {
      std::uint32_t y = s[i];
      y ^= (y >> 11);
      y ^= (y << 7) & 0x9d2c5680u;
      y ^= (y << 15) & 0xefc60000u;
      y ^= (y >> 18);
      out[i] = y;
    }
    d.next_ += static_cast<std::uint32_t>(k);
    d.left_ -= static_cast<int>(k);
    out += k;
    count -= k;
  }
}

// Puts the default CPU generator's state back as it was at construction (also on an exception).
class RestoreCpuGenerator {
 public:
  RestoreCpuGenerator() : g_(at::detail::getDefaultCPUGenerator()), start_(generator_state(g_)) {}
  ~RestoreCpuGenerator() { rewind(); }
  RestoreCpuGenerator(const RestoreCpuGenerator&) = delete;
  RestoreCpuGenerator& operator=(const RestoreCpuGenerator&) = delete;
  torch::Tensor state() const { return generator_state(g_); }
  void rewind() { set_generator_state(g_, start_); }

 private:
  at::Generator g_;
  torch::Tensor start_;
};

bool same_floats(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat && a.numel() == b.numel() &&
         std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), sizeof(float) * static_cast<std::size_t>(a.numel())) == 0;
}

// torch::dropout itself is input * (empty_like.bernoulli_(1 − p).div_(1 − p)) on the default CPU
// generator, and dropout_noise gives that noise: torch::dropout(ones, p, true) (1 · x = x) against
// dropout_noise(·, 1 − p), values and the generator's state after, over 3 001 elements (6 002
// words: at least 9 refills of the mt19937 state). Borrows the default generator and puts it back.
bool dropout_equals_aten(double p) {
  torch::NoGradGuard no_grad;
  const int64_t n = 3001;
  RestoreCpuGenerator borrow;
  const torch::Tensor ref = torch::dropout(torch::ones({n}, torch::kFloat), p, true).contiguous();
  const torch::Tensor ref_state = borrow.state();
  borrow.rewind();
  torch::Tensor mine = torch::empty({n}, torch::kFloat);
  dropout_noise(mine.data_ptr<float>(), n, 1 - p);
  return same_floats(ref, mine) && torch::equal(ref_state, borrow.state());
}

// dropout_noise(·, 1 − p) equals empty.bernoulli_(1 − p, g).div_(1 − p) on two private generators
// from one seed, one word in (a draw straddles each refill), over 3 001 elements, values and state
// after. Touches no shared state: safe to run while other threads draw.
bool noise_equals_aten(double p) {
  torch::NoGradGuard no_grad;
  const int64_t n = 3001;
  const double keep = 1 - p;
  auto g_ref = at::make_generator<at::CPUGeneratorImpl>(20261205);
  auto g_mpt = at::make_generator<at::CPUGeneratorImpl>(20261205);
  g_ref.get<at::CPUGeneratorImpl>()->random();
  g_mpt.get<at::CPUGeneratorImpl>()->random();
  const torch::Tensor ref = torch::empty({n}, torch::kFloat).bernoulli_(keep, g_ref).div_(keep);
  torch::Tensor mine = torch::empty({n}, torch::kFloat);
  dropout_noise(mine.data_ptr<float>(), n, keep, g_mpt);
  return same_floats(ref, mine) && torch::equal(g_ref.get_state(), g_mpt.get_state());
}

// Whether ATen's dropout is the composition mpt's replaces (checked once per process, at five p,
// on the default generator), and whether dropout_noise gives its noise at this p (once per p).
// Returns "" when both hold, else why not.
std::string fast_dropout_refused(double p) {
  static const std::string composition = [] {
    for (const double q : {0.1, 0.5, 0.75, 2.0 / 3.0, 0.05})
      if (!dropout_equals_aten(q))
        return fmt::format("mpt's mt19937 loop differs from this LibTorch's dropout at p = {:g}", q);
    return std::string();
  }();
  if (!composition.empty()) return composition;
  static std::mutex m;
  static std::map<double, bool> checked;
  std::lock_guard<std::mutex> lock(m);
  auto it = checked.find(p);
  if (it == checked.end()) it = checked.emplace(p, noise_equals_aten(p)).first;
  return it->second ? std::string() : fmt::format("mpt's mt19937 loop differs from this LibTorch's bernoulli_ at p = {:g}", p);
}

}  // namespace

void dropout_noise(float* out, int64_t n, double keep, std::optional<at::Generator> gen) {
  if (!(keep >= 0 && keep <= 1)) throw std::invalid_argument(fmt::format("dropout_noise: keep = {} is not in [0, 1]", keep));
  if (n < 0) throw std::invalid_argument("dropout_noise: negative element count");
  at::Generator g = gen ? *gen : at::detail::getDefaultCPUGenerator();
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(g);
  const float scale = 1.0f / static_cast<float>(keep);  // div_(keep) on fp32: the scalar as float
  // uniform_real: u = (v & (2^53 − 1)) · 2^-53, exact; u < keep  <=>  v' < keep · 2^53 (exact too)
  // <=>  v' < ceil(keep · 2^53) for the integer v' = v & (2^53 − 1).
  constexpr std::uint64_t kMask = (std::uint64_t{1} << 53) - 1;
  const auto threshold = static_cast<std::uint64_t>(std::ceil(std::ldexp(keep, 53)));
  const float dropped = 0.0f / static_cast<float>(keep);  // +0, or NaN at keep = 0 (as 0/0 in div_)
  std::uint32_t scale_bits = 0, dropped_bits = 0;
  std::memcpy(&scale_bits, &scale, sizeof scale);
  std::memcpy(&dropped_bits, &dropped, sizeof dropped);
  std::uint32_t words[2 * 512], noise[512];
  std::lock_guard<std::mutex> lock(g.mutex());
  at::mt19937 engine = impl->engine();
  at::mt19937_data_pod d = engine.data();
  // The engine reads state_[next_ .. next_ + left_ − 2] before it refills: a state set from
  // anything but get_state() may point past the 624 words (the engine would read out of bounds).
  if (d.left_ < 1 || d.left_ > at::MERSENNE_STATE_N ||
      static_cast<int64_t>(d.next_) + d.left_ - 1 > at::MERSENNE_STATE_N)
    throw std::invalid_argument(fmt::format("dropout_noise: the generator's mt19937 state is not one the engine can be "
                                            "in (left {}, next {})", d.left_, d.next_));
  for (int64_t done = 0; done < n;) {
    const int64_t k = std::min<int64_t>(n - done, 512);
    mt19937_words(d, words, 2 * k);
    for (int64_t i = 0; i < k; ++i) {
      // CPUGeneratorImpl::random64: the first word is the high half. Bernoulli, then div_(keep):
      // 1/keep or 0/keep, chosen without a branch (a draw in 1 − keep would mispredict).
      const std::uint64_t v = (static_cast<std::uint64_t>(words[2 * i]) << 32) | words[2 * i + 1];
      const std::uint32_t kept = 0u - static_cast<std::uint32_t>((v & kMask) < threshold);
      noise[i] = (kept & scale_bits) | (~kept & dropped_bits);
    }
    std::memcpy(out + done, noise, sizeof(float) * static_cast<std::size_t>(k));
    done += k;
  }
  engine.set_data(d);
  impl->set_engine(engine);
}

std::string dropout_kernel(double p) {
  if (!(p > 0 && p < 1)) return "aten (p = 0 or 1, or outside [0, 1]: ATen's own cases)";
  const std::string refused = fast_dropout_refused(p);
  return refused.empty() ? "mpt (its mt19937 loop, checked equal to ATen's dropout and bernoulli_ in this process)"
                         : "aten (" + refused + ")";
}

torch::Tensor dropout(const torch::Tensor& input, double p, bool train) {
  const bool fast = train && p > 0 && p < 1 && input.numel() > 0 && input.device().is_cpu() &&
                    input.scalar_type() == torch::kFloat && input.layout() == torch::kStrided && !input.is_nested() &&
                    input.is_contiguous() && !input.is_conj() && !input.is_neg();
  if (!fast || !fast_dropout_refused(p).empty()) return torch::dropout(input, p, train);
  torch::Tensor noise = torch::empty_like(input, torch::MemoryFormat::Contiguous);
  dropout_noise(noise.data_ptr<float>(), noise.numel(), 1 - p);
  return input * noise;  // as ATen's _dropout_impl: multiply(input, noise), MulBackward0 saving noise
}

std::vector<torch::nn::Linear> linear_layers(const torch::nn::Sequential& net) {
  std::vector<torch::nn::Linear> out;
  for (const auto& m : net->children())
    if (auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(m)) out.emplace_back(lin);
  return out;
}

void zero_grads(const std::vector<torch::Tensor>& params) {
  for (auto p : params) {
    if (p.grad().defined()) p.mutable_grad().zero_();
    else p.mutable_grad() = torch::zeros_like(p);
  }
}

void clear_grads(const std::vector<torch::Tensor>& params) {
  for (auto p : params) p.mutable_grad() = torch::Tensor();
}

std::vector<torch::Tensor> clone_grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> g;
  g.reserve(params.size());
  for (const auto& p : params) g.push_back(p.grad().detach().clone());
  return g;
}

std::vector<torch::nn::Linear> mlp_layers(const std::vector<int64_t>& widths) {
  if (widths.size() < 2) throw std::invalid_argument("mlp_layers: need at least 2 widths (input and output)");
  for (auto w : widths)
    if (w < 1) throw std::invalid_argument("mlp_layers: widths must be >= 1");
  std::vector<torch::nn::Linear> layers;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) layers.emplace_back(widths[i], widths[i + 1]);
  return layers;
}

std::vector<std::pair<int, int>> stage_ranges(int layers, const std::vector<int64_t>& cuts) {
  std::vector<std::pair<int, int>> r;
  int begin = 0;
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    const auto c = cuts[i];
    if (c < 1 || c > layers - 1)
      throw std::invalid_argument(fmt::format("cut {} at layer {} is outside the model (a cut must lie between "
                                              "layers, 1 .. {} for {} layers)", i, c, layers - 1, layers));
    if (c <= begin)
      throw std::invalid_argument(fmt::format("cut {} at layer {} is not after the previous cut {} (cuts must be "
                                              "strictly increasing)", i, c, begin));
    r.emplace_back(begin, static_cast<int>(c));
    begin = static_cast<int>(c);
  }
  r.emplace_back(begin, layers);
  return r;
}

std::vector<int64_t> balanced_cuts(int layers, int stages) {
  if (stages < 1) throw std::invalid_argument("balanced_cuts: stages must be >= 1");
  if (stages > layers)
    throw std::invalid_argument(fmt::format("{} stages but only {} layers: every stage needs at least one layer",
                                            stages, layers));
  std::vector<int64_t> cuts;
  int at = 0;
  for (int s = 0; s + 1 < stages; ++s) {
    at += layers / stages + (s < layers % stages ? 1 : 0);
    cuts.push_back(at);
  }
  return cuts;
}

torch::Tensor stage_forward(const std::vector<torch::nn::Linear>& layers, int begin, int end, torch::Tensor x,
                            std::vector<torch::Tensor>* kept) {
  const int total = static_cast<int>(layers.size());
  for (int i = begin; i < end; ++i) {
    torch::nn::Linear lin = layers[static_cast<std::size_t>(i)];  // holders share the module
    x = lin->forward(x);
    if (kept) kept->push_back(x);
    if (i != total - 1) {
      x = torch::relu(x);
      if (kept) kept->push_back(x);
    }
  }
  return x;
}

std::vector<torch::Tensor> param_grads(const std::vector<torch::nn::Linear>& layers) {
  std::vector<torch::Tensor> g;
  for (auto& l : layers)
    for (auto& prm : l->parameters()) g.push_back(prm.grad().detach().clone());
  return g;
}

void reset_grads(const std::vector<torch::nn::Linear>& layers) {
  for (auto& l : layers)
    for (auto& prm : l->parameters()) prm.mutable_grad() = torch::Tensor();
}

// ----------------------------------------------------------------------------
// The MLP as a pipeline stage function
// ----------------------------------------------------------------------------

MlpStage::MlpStage(std::vector<torch::nn::Linear> layers, std::vector<std::pair<int, int>> ranges)
    : layers_(std::move(layers)), ranges_(std::move(ranges)) {
  int at = 0;
  for (const auto& [b, e] : ranges_) {
    if (b != at || e <= b)
      throw std::invalid_argument(fmt::format("MlpStage: chunk ranges must be non-empty and contiguous from layer 0, "
                                              "got [{}, {}) after layer {}", b, e, at));
    at = e;
  }
  if (ranges_.empty() || at != static_cast<int>(layers_.size()))
    throw std::invalid_argument(fmt::format("MlpStage: the chunks cover layers 0 .. {} of a model of {} layers", at,
                                            layers_.size()));
}

torch::Tensor MlpStage::forward(int chunk, const torch::Tensor& x, ChunkSaved* saved) const {
  const auto [begin, end] = ranges_.at(static_cast<std::size_t>(chunk));
  std::vector<torch::Tensor> kept;
  torch::Tensor y = stage_forward(layers_, begin, end, x, saved ? &kept : nullptr);
  if (saved) {
    // kept = z_begin, relu(z_begin), z_begin+1, ...: a Linear's output, then its ReLU but
    // after the model's last layer. Each z is a weight-gradient root of its Linear.
    std::size_t at = 0;
    for (int i = begin; i < end; ++i) {
      torch::nn::Linear lin = layers_[static_cast<std::size_t>(i)];
      saved->weight_roots.emplace_back();
      WeightRoot& r = saved->weight_roots.back();
      r.output = kept[at];
      r.params.push_back(lin->weight);
      if (lin->bias.defined()) r.params.push_back(lin->bias);
      at += i == static_cast<int>(layers_.size()) - 1 ? 1 : 2;
    }
    saved->activations = std::move(kept);
  }
  return y;
}

std::vector<torch::Tensor> MlpStage::parameters(int chunk) const {
  const auto [begin, end] = ranges_.at(static_cast<std::size_t>(chunk));
  std::vector<torch::Tensor> ps;
  for (int i = begin; i < end; ++i)
    for (auto& prm : layers_[static_cast<std::size_t>(i)]->parameters()) ps.push_back(prm);
  return ps;
}

torch::Tensor MlpStage::loss(const torch::Tensor& y, const torch::Tensor& target) const {
  return torch::mse_loss(y, target);
}

std::vector<int64_t> MlpStage::output_shape(int chunk, const std::vector<int64_t>& microbatch_shape) const {
  const auto end = ranges_.at(static_cast<std::size_t>(chunk)).second;
  return {microbatch_shape.at(0), layers_[static_cast<std::size_t>(end - 1)]->weight.size(0)};
}

int MlpStage::cost_units(int chunk) const {
  const auto [begin, end] = ranges_.at(static_cast<std::size_t>(chunk));
  return end - begin;
}

}  // namespace mpt
