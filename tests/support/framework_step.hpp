#pragma once
// One training step as a framework runs it, for tests that need the engine to train but compute nothing: every
// module gathered for the forward, then, last module first, gathered again and its parameters' gradients marked
// ready (the last registered first), then step().

#include "zero/engine/engine_types.hpp"

#include <cstddef>
#include <vector>

namespace zero_test {

/// The step of the file comment over `modules`, `params[i]` being the parameters of `modules[i]` in registration
/// order; `on_grad(p)` runs in the gathered module before each `grad_ready(p)`. \returns `step()`'s result.
template <class Engine, class OnGrad>
zero::step_result framework_step(Engine& eng, const std::vector<int>& modules,
                                 const std::vector<std::vector<zero::param_handle>>& params, OnGrad&& on_grad) {
  for (int m : modules) {
    auto on = eng.gather(m);
  }
  for (std::size_t i = modules.size(); i-- > 0;) {
    auto on = eng.gather(modules[i]);
    for (std::size_t k = params[i].size(); k-- > 0;) {
      on_grad(params[i][k]);
      eng.grad_ready(params[i][k]);
    }
  }
  return eng.step();
}

} // namespace zero_test
