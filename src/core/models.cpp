// Shared models. See models.hpp.
#include "core/models.hpp"

#include <stdexcept>

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

}  // namespace mpt
