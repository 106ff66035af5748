#pragma once
/// \file
/// `residency`: where an engine's parameters live between uses — nothing before `finalize`, then
/// `replicated_params` (stages 0-2) or stage 3's `param_coordinator`. Both have one interface
/// (`store`, `gather`, `release`, `full`, `after_update`, `updates_joined`, `begin_micro_step`, `end_step`, `refresh`,
/// `finish`, `gather_everything`, `release_everything`, `begin_eval`, `end_eval`); the engine calls
/// it through `residency(f)` without asking which it holds.
///
/// The coordinator is a possible alternative only where the communicator can all-gather, so an
/// engine over an all-reduce-only communicator compiles (and runs stage 0). Its shard lives in host
/// memory (`offload_allocator_t<Backend>`, the memory of ZeRO-Offload) with
/// `zero_optimization.offload_param.device: cpu`, and in a file of the engine's storage with `nvme`.

#include "zero/comm/communicator.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/detail/node_groups.hpp"
#include "zero/engine/detail/visit_made.hpp"
#include "zero/engine/param_registry.hpp"
#include "zero/engine/residency/param_coordinator.hpp"
#include "zero/engine/residency/replicated_params.hpp"
#include "zero/engine/step/offload_options.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/storage/posix_storage.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace zero {

/// Stage 3's coordinator in an engine: its shard offloads to the backend's host memory, or to a file
/// of the storage `S`.
template <class B, class C, class A, class S = posix_storage>
using engine_coordinator = param_coordinator<B, C, A, offload_allocator_t<B>, S>;

namespace detail {
template <class B, class C, class A, class S> struct residency_of {
  using type = std::variant<std::monostate, replicated_params<B, C, A>>;
};
template <class B, can_all_gather C, class A, class S> struct residency_of<B, C, A, S> {
  using type = std::variant<std::monostate, replicated_params<B, C, A>, engine_coordinator<B, C, A, S>>;
};
} // namespace detail

/// One of the two parameter residencies; see the file comment.
template <class Backend, class Comm, class A, class Storage = posix_storage> class residency {
  using replicated = replicated_params<Backend, Comm, A>;
  using counting = counting_allocator<A>;
  using host_alloc = offload_allocator_t<Backend>;
  using coordinator_type = engine_coordinator<Backend, Comm, A, Storage>;

public:
  /// Makes the residency `cfg`'s stage asks for over the finalized layouts of `reg`: stage 3's
  /// coordinator (its trace-change lines to `log`), or replicated parameters. Model state comes from
  /// `state`, staging from `buffers`, stage 3's gathered units from `work`; kernels run on `stream`.
  /// With offload_param cpu the shard comes from host memory, `offload_allocator_t<Backend>`; with
  /// nvme it lives in a file of `storage` (made by the caller) and passes through that host memory.
  /// \throws config_error for offload_param cpu or nvme where the backend's kernels cannot reach that
  /// host memory (they initialise the shard and, without offload_optimizer, step it); io_error when
  /// the file cannot be created.
  void make(const config& cfg, const param_registry& reg, Backend& backend, Comm& comm, counting state,
            counting buffers, counting work, typename Backend::stream_type& stream,
            std::function<void(const std::string&)> log, Storage* storage = nullptr) {
    const auto& z = cfg.zero_optimization;
    if constexpr (can_all_gather<Comm>) {
      if (cfg.stage() == 3) {
        auto units = reg.module_units(); // (units of each module, units of persistent parameters)
        // overlap_comm false (a debugging aid): nothing is fetched ahead; each gather waits for its own.
        const auto prefetch = z.overlap_comm ? static_cast<std::size_t>(z.stage3_prefetch_bucket_size) : 0;
        bool to_host = false;
        std::optional<typename coordinator_type::shard_type::on_file> file;
        if (const auto dev = z.offload_param.device; dev == offload_device::cpu || dev == offload_device::nvme) {
          if constexpr (!host_alloc::device_accessible && !Backend::allocator_type::host_accessible) {
            throw config_error("zero_optimization.offload_param.device: \"" + std::string(name_of(dev)) +
                               "\" needs host memory the backend's kernels can reach (Backend::host_allocator_type "
                               "device_accessible, as CUDA's mapped pinned memory, or a host backend); set "
                               "\"device\": \"none\"");
          }
          to_host = true;
          if (dev == offload_device::nvme) {
            const auto& p = z.offload_param;
            file = typename coordinator_type::shard_type::on_file{
                .storage = storage,
                .options = {.dir = p.nvme_path,
                            .buffer_count = static_cast<std::size_t>(p.buffer_count),
                            .buffer_size = static_cast<std::size_t>(p.buffer_size),
                            .max_in_cpu = static_cast<std::size_t>(p.max_in_cpu),
                            .rank = comm.rank()},
                .ranges = detail::shard_ranges(reg.layout()),
                .esize = size_of(reg.layout().type())};
          }
        }
        // The host allocator is made in each branch, not kept in one std::optional that may or may not hold
        // it: GCC 13 takes the destruction of such a moved-from optional for a use of uninitialized memory.
        const counting state_for_hpz = state;
        auto make = [&](std::optional<counting_allocator<host_alloc>> host) {
          v_.template emplace<coordinator_type>(
                reg.layout(), std::move(units.first), std::move(units.second), reg.module_names(), backend, comm,
                std::move(state), std::move(work),
                coordinator_options{.prefetch_elements = prefetch,
                                    .max_live_elements = static_cast<std::size_t>(z.stage3_max_live_parameters),
                                    .max_reuse_distance = static_cast<std::size_t>(z.stage3_max_reuse_distance),
                                    .params_from_master = params_from_master(cfg)},
                stream, std::move(host), std::move(file))
              .set_log(std::move(log));
        };
        if (to_host) {
          make(counting_allocator<host_alloc>(host_alloc{}));
        } else {
          make(std::nullopt);
        }
        if (z.zero_hpz_partition_size > 1) {
          use_secondary(z.zero_hpz_partition_size, comm, state_for_hpz);
        }
        if (z.zero_quantized_weights) {
          std::get<coordinator_type>(v_).use_quantized(
              quant_format{.bits = 8, .block = static_cast<std::size_t>(z.zero_quantization_block_size)});
        }
        return;
      }
    }
    const auto bucket = z.allgather_bucket_size;
    v_.template emplace<replicated>(
        reg.layout(), reg.module_segments(), reg.module_names(), backend, comm, std::move(state), std::move(buffers),
        replicated_options{.sharded = cfg.stage() >= 1,
                           .allgather_elements = bucket ? std::optional<std::size_t>(*bucket) : std::nullopt},
        stream);
  }

  /// True when stage 3 keeps no 16-bit shard and casts its gathers from the fp32 master: 16-bit
  /// parameters, nothing offloaded (the optimizer's master on the device), and not
  /// `stage3_keep_param_shard`.
  [[nodiscard]] static bool params_from_master(const config& cfg) noexcept {
    const auto& z = cfg.zero_optimization;
    return cfg.stage() == 3 && cfg.param_dtype() != dtype::f32 && !z.stage3_keep_param_shard &&
           z.offload_param.device == offload_device::none && z.offload_optimizer.device == offload_device::none;
  }

  /// Calls `f` with the residency held. \throws usage_error before one was made (before finalize).
  template <class F> decltype(auto) operator()(F&& f) { return visit(v_, f); }
  template <class F> decltype(auto) operator()(F&& f) const { return visit(v_, f); }

  /// ZeRO++'s node and cross groups of the data group (hpZ's node group once `make` made it), for the
  /// gradient reducer's two-level qgZ too; they live as long as the residency.
  [[nodiscard]] detail::node_groups<Comm>& nodes() noexcept { return nodes_; }

  /// Stage 3's coordinator, or null.
  [[nodiscard]] const coordinator_type* coordinator() const noexcept requires can_all_gather<Comm> {
    return std::get_if<coordinator_type>(&v_);
  }
  [[nodiscard]] coordinator_type* coordinator() noexcept requires can_all_gather<Comm> {
    return std::get_if<coordinator_type>(&v_);
  }

  /// Stage 3's parameter shard in a file (offload_param nvme), after the uploads out of it; or null.
  [[nodiscard]] auto* param_file() noexcept {
    if constexpr (can_all_gather<Comm>) {
      auto* c = coordinator();
      return c != nullptr ? c->file() : nullptr;
    } else {
      return static_cast<detail::param_file<Backend, counting_allocator<host_alloc>, Storage>*>(nullptr);
    }
  }

private:
  /// hpZ: this rank's node group (`size` consecutive ranks of `comm`, `nodes_`) and the coordinator's
  /// secondary partition over it (in `state`).
  void use_secondary(std::int64_t size, Comm& comm, counting state) {
    Comm& node = nodes_.node(comm, size, "zero_optimization.zero_hpz_partition_size " + std::to_string(size));
    std::get<coordinator_type>(v_).use_secondary(node, std::move(state));
  }

  template <class V, class F> static decltype(auto) visit(V& v, F& f) {
    return detail::visit_made<replicated>(v, f, "the engine has no parameters before finalize()");
  }

  detail::node_groups<Comm> nodes_; // ZeRO++'s node and cross groups; outlive the coordinator that keeps one
  typename detail::residency_of<Backend, Comm, A, Storage>::type v_;
};

} // namespace zero
