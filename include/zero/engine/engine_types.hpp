#pragma once
/// \file
/// The engine's public value types: parameter handles and options, what a step did, timings, the
/// init callback, and the read-only view of the engine's state that checkpoints use.

#include "zero/core/flat_layout.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// Handle of a registered parameter.
struct param_handle {
  std::size_t index = std::numeric_limits<std::size_t>::max();
  friend bool operator==(const param_handle&, const param_handle&) = default;
};

/// Per-parameter options at registration.
struct param_options {
  /// The parameter group's own lr; default: the optimizer's lr.
  std::optional<double> lr{};
  /// The group's weight decay; default: the optimizer's (0 is the usual choice for biases and norms).
  std::optional<double> weight_decay{};
  /// False freezes the parameter: it is kept whole on every rank, gets no gradient and no
  /// optimizer state.
  bool trainable = true;
  /// Tensor parallelism: the parameter is the same on every rank of the tensor group, gradients too
  /// (a layer norm's weight, the bias of a row-parallel layer), so the gradient norm for clipping
  /// counts it on tensor rank 0 only (`set_model_group`'s `model_coords::tensor`). A slice of a split
  /// parameter is registered as any parameter: its own shape, summed over the group like a stage's.
  bool tensor_replicated = false;
  /// Tensor parallelism: the registered tensor is this rank's slice of a parameter split evenly along
  /// dimension `tensor_split` over the tensor group (`model_coords`), -1 for a whole one. Only
  /// checkpoints use it: they record it, join the slices into whole tensors on export, and split
  /// them again when loading at another tensor size.
  int tensor_split = -1;
};

/// Where a rank's engine sits in a model-parallel job (`set_model_group`): its pipeline stage, and
/// its slice `tensor` of `tensor_size` on the tensor axis. Checkpoints record it.
struct model_coords {
  int pipe = 0;
  int tensor = 0;
  int tensor_size = 1;
};

/// What one call of `step()` did.
struct step_result {
  /// True when this micro-step ended an accumulation and the optimizer ran (or skipped).
  bool boundary = false;
  /// True when the optimizer updated the parameters; false for a skipped step (fp16 overflow) and
  /// for micro-steps inside an accumulation.
  bool applied = false;
  /// True when the step was skipped because a gradient was inf or NaN on some rank.
  bool overflow = false;
  /// Global L2 norm of the averaged, unscaled gradients (before clipping); inf on overflow.
  double grad_norm = 0;
  /// The loss scale the step's gradients were computed with, and the one for the next step.
  double loss_scale = 1;
  double next_loss_scale = 1;
  /// The lr the optimizer used (of the default group).
  double lr = 0;
  /// Optimizer steps applied so far (DeepSpeed's global_steps counts boundaries; this counts updates).
  std::int64_t step = 0;
};

/// Wall-clock seconds per phase, summed since the last `reset`.
struct step_timings {
  std::map<std::string, double> seconds;
  std::map<std::string, std::int64_t> calls;
};

/// Fills a rank's part of one parameter at initialisation: `out[k]` is element
/// `first + k` (row-major) of parameter `p`. Called only for elements the rank owns (stages 1-3)
/// or for whole parameters (stage 0), so the model is identical whatever the world size.
using init_fn = std::function<void(const param_info& p, std::size_t first, std::span<float> out)>;

/// How `basic_engine::evaluation` gathers stage 3's parameters inside the scope.
enum class eval_gather : std::uint8_t {
  /// Module by module, as in training: every rank must run the same evaluation forwards.
  per_module,
  /// The whole model once, when the scope opens: ranks may run different numbers of forwards.
  whole_model
};

/// A registered parameter, in registration order (`basic_engine::registered`).
struct registered_param {
  /// Name, shape, dtype and place in its layout (the trainable one, or the frozen one).
  const param_info* info = nullptr;
  bool trainable = true;
  /// Index of its parameter group (`basic_engine::optimizer().groups()`).
  std::size_t group = 0;
  /// Name of its module.
  std::string module;
  /// `param_options::tensor_split`.
  int tensor_split = -1;
};

/// Elements `[param_offset, param_offset + count)` of trainable parameter `id` (an id of
/// `basic_engine::layout()`) that a rank owns (`basic_engine::owned_by`): where their optimizer state
/// starts in the rank's state buffers (`state`), and where their low-precision values start in the
/// parameter store (`store`: the shard at stage 3, the whole flat buffer otherwise).
struct owned_piece {
  std::size_t id = 0;
  std::size_t param_offset = 0;
  std::size_t count = 0;
  std::size_t state = 0;
  std::size_t store = 0;
};

/// The engine's step counters (what a checkpoint saves and restores).
struct step_counters {
  /// Optimizer steps applied (skipped fp16 steps not counted).
  std::int64_t applied_steps = 0;
  /// Micro-steps ended so far.
  std::int64_t micro_step = 0;
  /// Accumulation boundaries reached (DeepSpeed's global_steps).
  std::int64_t boundaries = 0;
};

/// Where the engine keeps parameter values, for checkpoints (`basic_engine::stores`): the store the
/// optimizer updates and the frozen parameters' buffer, both in backend memory.
struct param_stores {
  std::byte* params = nullptr;
  /// Elements of `params`: the rank's shard at stage 3, the whole flat buffer otherwise.
  std::size_t param_elements = 0;
  std::byte* frozen = nullptr;
  std::size_t frozen_bytes = 0;
};

/// Ends a scope of an engine (`gather`, `gather_all`, `evaluation`) when it goes out of scope;
/// `close()` ends it early and throws what ending it throws. The destructor does not throw: an error
/// of ending the scope there (a timeout of a gather's collective, a refused write-back) is thrown by
/// the engine's next call instead.
template <class Engine> class [[nodiscard]] engine_scope {
public:
  engine_scope(Engine* e, int kind, int arg) noexcept : e_(e), kind_(kind), arg_(arg) {}
  engine_scope(engine_scope&& o) noexcept : e_(std::exchange(o.e_, nullptr)), kind_(o.kind_), arg_(o.arg_) {}
  engine_scope(const engine_scope&) = delete;
  engine_scope& operator=(const engine_scope&) = delete;
  engine_scope& operator=(engine_scope&&) = delete;
  ~engine_scope() {
    if (e_ != nullptr) {
      try {
        e_->end_scope(kind_, arg_);
      } catch (...) {
        e_->defer(std::current_exception());
      }
    }
  }
  /// Ends the scope now. \throws what ending it throws (then the scope is ended regardless).
  void close() {
    if (e_ != nullptr) {
      std::exchange(e_, nullptr)->end_scope(kind_, arg_);
    }
  }

private:
  Engine* e_;
  int kind_;
  int arg_;
};

} // namespace zero
