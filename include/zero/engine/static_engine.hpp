#pragma once
/// \file
/// `static_engine<Stage, Backend, Comm>`: the engine with its ZeRO stage fixed at compile time.

#include "zero/comm/communicator.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/engine.hpp"

#include <concepts>
#include <string>

namespace zero {

/// An engine whose ZeRO stage is a template argument: a communicator that lacks what `Stage` needs
/// stops compilation with the sentence naming the operation (`require_stage`), and a config of
/// another stage is refused at construction.
template <int Stage, class Backend, class Comm, class Allocator = typename Backend::allocator_type>
class static_engine : public basic_engine<Backend, Comm, Allocator> {
  static_assert((require_stage<Comm, Stage>(), true)); // the sentence naming a missing operation

public:
  /// \throws config_error when `cfg` is not of stage `Stage`; see `basic_engine`.
  static_engine(const config& cfg, Comm& comm, Backend& backend, Allocator alloc)
      : basic_engine<Backend, Comm, Allocator>(checked_stage(cfg), comm, backend, alloc) {}
  static_engine(const config& cfg, Comm& comm,
                Backend& backend) requires std::same_as<Allocator, typename Backend::allocator_type>
      : static_engine(cfg, comm, backend, backend.get_allocator()) {}

private:
  static const config& checked_stage(const config& cfg) {
    if (cfg.stage() != Stage) {
      throw config_error("zero_optimization.stage: this static_engine runs stage " + std::to_string(Stage) +
                         ", the config asks for stage " + std::to_string(cfg.stage()));
    }
    return cfg;
  }
};

} // namespace zero
