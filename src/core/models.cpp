// Shared models. See models.hpp.
#include "core/models.hpp"

#include <stdexcept>

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
