#pragma once
/// \file
/// How checkpoint code (save and load, checkpoint.hpp; the exports, safetensors.hpp) reaches an engine: only
/// through its public state view (`checkpoint_access`), and how the ranks of a checkpoint's phase agree on its
/// outcome before any of them goes on (`checkpoint::detail::agree`).

#include "zero/checkpoint/reader.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/engine/engine.hpp"

#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace zero {

/// How checkpoint code reads and writes an engine: only through its public state view
/// (`registered`, `owned_by`, `stores`, `counters`, `restore`) and the backend's `upload`/`download`,
/// with staging in backend memory where the communicator needs it (NCCL).
template <class Engine> struct checkpoint_access {
  using registered = registered_param;
  using owned = owned_piece;
  using counting = typename Engine::counting_allocator_type;
  static constexpr bool host_accessible = Engine::allocator_type::host_accessible;

  static auto& comm(Engine& e) { return e.communicator(); }
  /// HSDP: the ranks of this rank's shard in the other shard groups (`replica_group`), or null.
  static auto* replicas(Engine& e) {
    if constexpr (requires { e.replica_group(); }) {
      return e.replica_group();
    } else {
      return static_cast<std::remove_reference_t<decltype(e.communicator())>*>(nullptr);
    }
  }
  /// True on the ranks whose shard group writes files: the first shard group's with HSDP (the others
  /// hold the same state), every rank without.
  static bool writes(Engine& e) {
    const auto* r = replicas(e);
    return r == nullptr || r->rank() == 0;
  }
  static const flat_layout& frozen_layout(const Engine& e) { return e.frozen_layout(); }
  static bool finalized(const Engine& e) { return e.finalized(); }
  static std::vector<registered> params(const Engine& e) { return e.registered(); }
  static std::vector<owned> owned_by(const Engine& e, int rank) { return e.owned_by(rank); }

  /// A host copy of `n` elements of engine memory, after the engine's stream.
  template <class T> static std::vector<T> read(Engine& e, const T* src, std::size_t n) {
    std::vector<T> host(n);
    if (n > 0) {
      download<host_accessible>(e.backend(), e.stream(), src, host.data(), n);
    }
    return host;
  }
  /// Writes `n` host elements into engine memory at `dst`.
  template <class T> static void write(Engine& e, const T* host, T* dst, std::size_t n) {
    if (n > 0) {
      upload<host_accessible>(e.backend(), e.stream(), host, dst, n);
    }
  }

  /// `op` over ranks of `n` host elements, in place; collective. Host memory as it is when the
  /// engine's memory is host accessible, otherwise through a staging buffer of the engine's buffer
  /// allocator (NCCL needs device memory).
  /// Over the engine's communicator, or over `group` (its model group) when given.
  template <class T>
  static void all_reduce(Engine& e, T* host, std::size_t n, reduce_op op,
                         typename Engine::communicator_type* group = nullptr) {
    auto& c = group != nullptr ? *group : e.communicator();
    if constexpr (host_accessible) {
      c.all_reduce(host, host, n, op).wait();
    } else {
      buffer<T, counting> dev(e.buffer_allocator(), n, memory_tag::buffers);
      write(e, host, dev.data(), n);
      c.all_reduce(dev.data(), dev.data(), n, op).wait();
      download<host_accessible>(e.backend(), e.stream(), dev.data(), host, n);
    }
  }
  /// Sends `n` host elements to `peer`.
  template <class T> static void send(Engine& e, const T* host, std::size_t n, int peer) {
    if constexpr (host_accessible) {
      e.communicator().send(host, n, peer).wait();
    } else {
      buffer<T, counting> dev(e.buffer_allocator(), n, memory_tag::buffers);
      write(e, host, dev.data(), n);
      e.communicator().send(dev.data(), n, peer).wait();
    }
  }
  /// Receives `n` host elements from `peer`.
  template <class T> static void recv(Engine& e, T* host, std::size_t n, int peer) {
    if constexpr (host_accessible) {
      e.communicator().recv(host, n, peer).wait();
    } else {
      buffer<T, counting> dev(e.buffer_allocator(), n, memory_tag::buffers);
      e.communicator().recv(dev.data(), n, peer).wait();
      download<host_accessible>(e.backend(), e.stream(), dev.data(), host, n);
    }
  }
};

namespace checkpoint {

namespace detail {

/// After a phase that may have failed on some ranks: one all-reduce so that every rank knows.
/// The rank that failed rethrows its own exception; the others throw an error naming it.
/// In a model-parallel job the engines of the other stages and tensor slices learn it too (one more
/// all-reduce over the model group), so that the job's coordinates load or save together.
template <class Engine> void agree(Engine& eng, const std::exception_ptr& mine, std::string_view phase) {
  auto& comm = checkpoint_access<Engine>::comm(eng);
  std::int32_t failed = mine ? comm.rank() + 1 : 0;
  if (comm.size() > 1) {
    checkpoint_access<Engine>::all_reduce(eng, &failed, 1, reduce_op::max);
  }
  std::int32_t elsewhere = failed != 0 ? 1 : 0;
  if (auto* model = eng.model_group(); model != nullptr && model->size() > 1) {
    checkpoint_access<Engine>::all_reduce(eng, &elsewhere, 1, reduce_op::max, model);
  }
  // HSDP: the shard groups learn it from each other (one of them writes, all of them load).
  std::int32_t other_group = failed != 0 || elsewhere != 0 ? 1 : 0;
  if (auto* replicas = checkpoint_access<Engine>::replicas(eng); replicas != nullptr && replicas->size() > 1) {
    checkpoint_access<Engine>::all_reduce(eng, &other_group, 1, reduce_op::max, replicas);
  }
  if (mine) {
    std::rethrow_exception(mine);
  }
  if (failed != 0) {
    throw as_echo(checkpoint_error(cat(phase, " failed on rank ", std::to_string(failed - 1),
                                       " (its exception names the cause); nothing was changed on this rank")));
  }
  if (elsewhere != 0) {
    throw as_echo(checkpoint_error(cat(phase, " failed on another pipeline stage or tensor slice of the job (its "
                                              "exception names the cause); nothing was changed on this rank")));
  }
  if (other_group != 0) {
    throw as_echo(checkpoint_error(cat(phase, " failed in another shard group of the job (mics_shard_size; its "
                                              "exception names the cause); nothing was changed on this rank")));
  }
}

} // namespace detail

} // namespace checkpoint
} // namespace zero
