#pragma once
// What the GPT model tests share (test_gpt_model.cpp, test_gpt_cuda.cpp): the parameters they compute with (zeroed
// tensors shaped as the model's, values drawn far from GPT-2's init so that every gradient stands out of the
// rounding), a block's view of them, and the message a call throws.

#include "gpt_model.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace gpt_test {

using tensors = std::vector<std::vector<float>>;

/// Zeroed tensors shaped as the model's parameters.
inline tensors zeros_like(const gpt::model_config& cfg) {
  tensors out;
  for (const auto& s : gpt::parameters(cfg)) {
    out.emplace_back(static_cast<std::size_t>(s.numel()), 0.0f);
  }
  return out;
}

/// Matrices and embeddings N(0, matrix_std), biases N(0, 0.1), LayerNorm weights 1 + N(0, 0.1); tensor i from the
/// random stream `stream + i`, each value passed through `round` (the identity, or a rounding to the dtype both
/// models read).
template <class Round>
tensors spread_params(const gpt::model_config& cfg, std::uint64_t stream, double matrix_std, Round&& round) {
  tensors out = zeros_like(cfg);
  const auto specs = gpt::parameters(cfg);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const bool matrix = specs[i].shape.size() == 2;
    const bool ln_weight = specs[i].name.find("ln_") != std::string::npos && specs[i].name.ends_with(".weight");
    for (std::size_t j = 0; j < out[i].size(); ++j) {
      const double z = gpt::detail::normal_at(stream + i, j);
      out[i][j] = round(static_cast<float>(matrix ? matrix_std * z : (ln_weight ? 1.0 + 0.1 * z : 0.1 * z)));
    }
  }
  return out;
}

/// Block `l`'s tensors of `w` (laid out as `gpt::parameters`: wte, wpe, then each block's), and of gradients `g`.
inline gpt::block_params block_of(const tensors& w, int l) {
  std::array<const float*, gpt::block_tensor_count> p{};
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] = w[2 + static_cast<std::size_t>(l) * p.size() + i].data();
  }
  return gpt::block_params::from(p);
}
inline gpt::block_grads grads_of(tensors& g, int l) {
  std::array<float*, gpt::block_tensor_count> p{};
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] = g[2 + static_cast<std::size_t>(l) * p.size() + i].data();
  }
  return gpt::block_grads::from(p);
}

/// What `f()` throws (its message), or "(nothing thrown)".
inline std::string thrown_message(auto&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

} // namespace gpt_test
