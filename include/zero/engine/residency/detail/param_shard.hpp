#pragma once
/// \file
/// `detail::param_shard`: the rank's shard of stage 3's parameters, for `param_coordinator` — in the
/// engine's model-state memory, or with `zero_optimization.offload_param.device: cpu` in host memory
/// of its own (ZeRO-Offload's parameter offload, docs/offload.md) — and how a slice of it reaches a
/// gathered unit's device memory and comes back.
///
/// In model-state memory a slice is copied into its unit by the backend's `cast` on the engine's
/// stream, as before any all-gather. In host memory it is uploaded with the backend's `copy` on an
/// upload stream of the shard's own: the upload first waits for the work enqueued on the engine's
/// stream so far (the unit's memory may have been read there before it was freed and handed out
/// again) and for the slice's optimizer update; the engine's stream does not wait for the upload, so
/// a prefetched unit's upload runs beside the forward, as its all-gather does. A collective reads
/// the unit's device memory only, after the upload: NCCL cannot read host memory.
///
/// Derived from the master (`from_master`, 16-bit training with the optimizer's fp32 master on the
/// device): no shard is kept. A slice reaches its unit by a `cast` of the master's elements on the
/// engine's stream, after the slice's update, and a write-back casts into the master. The values are
/// those a kept shard would hold: the optimizer writes its parameters as the master rounded, and every
/// write of the parameters (initialisation, a checkpoint, a write-back) reloads the master from them.
///
/// With `offload_param.device: nvme` the shard is in a file (`detail::param_file`): a slice is
/// uploaded the same way from the host buffer its values were read into, and `data()` is an image of
/// the whole shard in host memory, read when asked for and written back at the next `flush` or step.

#include "zero/backend/backend.hpp"
#include "zero/backend/transfer.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/residency/detail/param_file.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/storage/posix_storage.hpp"

#include <cstddef>
#include <cstring>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

namespace zero::detail {

/// The all-gather of `n` elements per rank from `slot` into `dst` on stream-ordered `comm`, ordered
/// after stream `on` (a shard's upload stream, or the engine's stream `engine`, which `comm` follows
/// again afterwards, also on a throw).
template <class Comm, class Stream, class P>
auto all_gather_after(Comm& comm, const Stream& on, const Stream& engine, P* slot, P* dst, std::size_t n) {
  if (&on == &engine) {
    return comm.all_gather(slot, dst, n);
  }
  struct restore_order {
    Comm& comm;
    const Stream& engine;
    ~restore_order() { comm.set_compute_stream(engine.get()); }
  } restore{comm, engine};
  comm.set_compute_stream(on.get());
  return comm.all_gather(slot, dst, n);
}

/// The shard of a `param_coordinator`; see the file comment. `A` is the engine's model-state
/// memory, `HostAlloc` the host memory of an offloaded shard, `Storage` the file's policy.
template <backend_base Backend, allocator A, allocator HostAlloc, storage Storage = posix_storage> class param_shard {
  using counting = counting_allocator<A>;
  using host_counting = counting_allocator<HostAlloc>;
  using stream_type = typename Backend::stream_type;
  using event_type = typename Backend::event_type;

public:
  using file_type = param_file<Backend, host_counting, Storage>;
  /// A shard in a file (offload_param nvme): the storage (kept by reference), where and how, the
  /// ranges of the shard and bytes per element.
  struct on_file {
    Storage* storage = nullptr;
    param_file_options options;
    std::vector<shard_range> ranges;
    std::size_t esize = 0;
  };

  /// True when a slice can move between host memory and `A`'s: the backend copies, or the host
  /// can touch `A`'s memory.
  static constexpr bool can_offload = can_copy<Backend> || A::host_accessible;

  /// `bytes` of shard in `state` (memory_tag::params), or in `host` when given (offloaded), or with
  /// `file` in a file whose buffers come from `host`; copies run on `stream` (the engine's, kept by
  /// reference) or, offloaded, on an upload stream. With `from_master` (and no `host`) nothing is
  /// allocated: the slices are cast from the master `derive_from` gives (see the file comment).
  /// \throws config_error when offloaded and `can_offload` is false, or for `file`'s options;
  /// usage_error for `from_master` with `host`; io_error when the file cannot be created; memory_error.
  param_shard(Backend& backend, stream_type& stream, counting state, std::optional<host_counting> host,
              std::size_t bytes, std::optional<on_file> file = std::nullopt, bool from_master = false)
      : backend_(backend), stream_(stream), derived_(from_master), host_alloc_(std::move(host)) {
    if (derived_) {
      if (host_alloc_) {
        throw usage_error("param_coordinator: a parameter shard in host memory cannot be derived from the master");
      }
      return;
    }
    if (!host_alloc_) {
      device_ = buffer<std::byte, counting>(std::move(state), bytes, memory_tag::params);
      data_ = device_.data();
      // Zeroed: the padding between and after the rank's pieces is never written, but qwZ quantizes whole
      // blocks of the shard, padding included (a block's scale read from stale memory changed the weights).
      backend_.fill(reinterpret_cast<bf16*>(data_), bytes / sizeof(bf16), bf16{}, stream_);
      return;
    }
    if (!can_offload) {
      throw config_error("zero_optimization.offload_param.device: \"cpu\" needs a backend with copy(const void* "
                         "src, void* dst, size_t bytes, stream) (see zero::can_copy) or model-state memory the "
                         "host can touch; set \"device\": \"none\"");
    }
    if (file) {
      file_.emplace(backend_, *file->storage, *host_alloc_, std::move(file->ranges), file->esize, file->options);
    } else {
      host_ = buffer<std::byte, host_counting>(*host_alloc_, bytes, memory_tag::params);
      data_ = host_.data();
      std::memset(data_, 0, bytes); // the padding too, as in backend memory
    }
    upload_.emplace(backend_.make_stream());
    called_.emplace(backend_.make_event());
  }
  param_shard(const param_shard&) = delete;
  param_shard& operator=(const param_shard&) = delete;
  /// Waits for uploads still in flight out of the shard; never throws.
  ~param_shard() {
    if (upload_) {
      try {
        backend_.synchronize(*upload_);
      } catch (...) { // NOLINT(bugprone-empty-catch): a destructor reports nothing
      }
    }
  }

  /// The shard's first byte (in a file: of its image in host memory, read now if there is none);
  /// null when derived from the master.
  [[nodiscard]] std::byte* data() { return file_ ? file_->image() : data_; }
  /// True when the shard is derived from the master rather than kept.
  [[nodiscard]] bool derived() const noexcept { return derived_; }
  /// The master the slices are cast from (fp32, indexed like the shard), derived only.
  void derive_from(float* master) noexcept { master_ = master; }
  /// The shard's file, after the uploads out of its buffers landed; null when it has none.
  [[nodiscard]] file_type* file() {
    if (file_) {
      backend_.synchronize(*upload_);
    }
    return file_ ? &*file_ : nullptr;
  }
  [[nodiscard]] const file_type* file() const noexcept { return file_ ? &*file_ : nullptr; }
  /// True when the shard lives in host memory.
  [[nodiscard]] bool offloaded() const noexcept { return host_alloc_.has_value(); }
  /// The counting allocator of the offloaded shard's host memory, or null.
  [[nodiscard]] const host_counting* host_memory() const noexcept { return host_alloc_ ? &*host_alloc_ : nullptr; }

  /// Copies `n` elements of the shard at `from` into unit memory `to`, after the work enqueued on the
  /// engine's stream so far and after `update` (the slice's optimizer update; null: none pending).
  /// \returns the stream the copy runs on, which whatever reads `to` next must follow.
  template <class P> const stream_type& stage(const P* from, P* to, std::size_t n, const event_type* update) {
    if (!upload_) {
      if (update != nullptr) {
        backend_.wait(stream_, *update);
      }
      backend_.cast(from, to, n, stream_);
      return stream_;
    }
    backend_.record(*called_, stream_);
    backend_.wait(*upload_, *called_);
    if (update != nullptr) {
      backend_.wait(*upload_, *update);
    }
    if constexpr (can_offload) {
      copy_async<A::host_accessible>(backend_, *upload_, from, to, n);
    }
    return *upload_;
  }

  /// `stage` for the slice of unit `u` at shard element `offset`, wherever the shard lives.
  template <class P>
  const stream_type& stage_unit(std::size_t u, std::size_t offset, P* to, std::size_t n, const event_type* update) {
    if (derived_) {
      require_master();
      if (update != nullptr) {
        backend_.wait(stream_, *update);
      }
      backend_.cast(static_cast<const float*>(master_) + offset, to, n, stream_);
      return stream_;
    }
    if (!file_) {
      return stage(reinterpret_cast<const P*>(data_) + offset, to, n, update);
    }
    const auto& on = stage(reinterpret_cast<const P*>(file_->source(u)), to, n, update);
    file_->uploaded(on);
    return on;
  }
  /// After unit `u`'s new values were enqueued on `s` (a shard in a file writes them behind).
  void updated(std::size_t u, const stream_type& s) {
    if (file_) {
      file_->updated(u, s);
    }
  }
  /// A shard in a file: while `on` (an evaluation pass) a failed read of unit `u`'s slice is kept for
  /// `take_read_error(u)` instead of the step's `take_read_error()` (see `param_file`).
  void report_reads_at_gather(bool on) {
    if (file_) {
      file_->report_reads_at_gather(on);
    }
  }
  /// The failed read of unit `u`'s last upload while reads are reported at the gather, or null.
  std::exception_ptr take_read_error(std::size_t u) noexcept { return file_ ? file_->take_read_error(u) : nullptr; }
  /// Starts reading unit `u`'s slice ahead of its gather (a shard in a file). \returns false when
  /// no buffer is free for it.
  bool read_ahead(std::size_t u) { return !file_ || file_->read_ahead(u); }
  /// Writes an image of the shard back (a shard in a file). \returns the write's error, or null.
  std::exception_ptr flush() {
    auto* f = file();
    return f != nullptr ? f->flush() : nullptr;
  }

  /// Copies `n` elements of unit memory `from` into the shard at element `offset`, on the engine's
  /// stream (derived: into the master, as the optimizer's `load_master` would from a kept shard).
  template <class P> void put_unit(const P* from, std::size_t offset, std::size_t n) {
    if (derived_) {
      require_master();
      backend_.cast(from, master_ + offset, n, stream_);
      return;
    }
    P* to = reinterpret_cast<P*>(data()) + offset;
    if (!upload_) {
      backend_.cast(from, to, n, stream_);
    } else if constexpr (can_offload) {
      copy_async<A::host_accessible>(backend_, stream_, from, to, n);
    }
  }

private:
  void require_master() const {
    if (master_ == nullptr) {
      throw usage_error("param_coordinator: the parameter shard is derived from the optimizer's master copy, and "
                        "none was given (derive_from) before the first gather");
    }
  }

  Backend& backend_;
  stream_type& stream_;
  bool derived_ = false;
  float* master_ = nullptr;
  std::optional<host_counting> host_alloc_;
  buffer<std::byte, counting> device_;
  buffer<std::byte, host_counting> host_;
  std::byte* data_ = nullptr;
  std::optional<stream_type> upload_;
  std::optional<event_type> called_; // the engine's stream at an upload's call
  std::optional<file_type> file_;
};

} // namespace zero::detail
