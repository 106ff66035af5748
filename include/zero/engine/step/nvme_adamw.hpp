#pragma once
/// \file
/// `nvme_adamw`: ZeRO-Infinity's optimizer step. A rank's fp32 optimizer state (master, m, v; m and v
/// for fp32 training, whose master is the host copy of the parameters) lives in one file of a
/// `Storage` policy under `nvme_path`; the host holds the rank's gradient shard, two copies of its
/// parameter shard and `buffer_count` chunk buffers. Per owned range, in the order the engine steps
/// them (docs/offload.md):
///
///     device -> host   the range's reduced gradients         (stage 1: posted at range 0; 2-3: in backward)
///     storage -> host  chunk i+1..i+buffer_count-1's state   (read ahead while chunk i updates)
///     host             AdamW over chunk i                    (cpu_backend's kernels and threads)
///     host -> storage  chunk i's new state                   (written while later chunks update)
///     host -> device   the range's new parameters
///
/// A step never overwrites the state it reads: the file holds two slots and a step reads one and
/// writes the other, and the parameters come from one of two host copies. `finish_step` waits for the
/// writes; the engine then `commit`s (the written slot becomes current) or, when any rank's I/O failed,
/// `rollback`s (the device parameters are uploaded again from the current copy): after a failed step
/// the state, the parameters and the file are the previous step's.

#include "zero/backend/backend.hpp"
#include "zero/backend/transfer.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/step/detail/host_gradients.hpp"
#include "zero/engine/step/offload_options.hpp"
#include "zero/engine/step/offloaded_adamw.hpp"
#include "zero/engine/step/partitioned_adamw.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/memory/detail/host_budget.hpp"
#include "zero/storage/detail/swap_file.hpp"
#include "zero/storage/storage.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <system_error>
#include <unistd.h>
#include <utility>
#include <vector>

namespace zero {

/// Where and how an `nvme_adamw` keeps its state.
struct nvme_options {
  /// The folder of the state file (`offload_optimizer.nvme_path`).
  std::filesystem::path dir;
  /// State elements per chunk and tensor (rounded up to the file's alignment).
  std::size_t chunk_elements = std::size_t{1} << 21;
  /// Chunk buffers in host memory (`offload_optimizer.buffer_count`), at least 2.
  std::size_t buffer_count = 4;
  /// Host AdamW threads.
  unsigned threads = 0;
};

/// AdamW over a rank's part of the flat buffer with its state in a file; see the file comment. The
/// interface is `offloaded_adamw`'s, plus `finish_step`, `commit` and `rollback`.
template <backend Backend, allocator DeviceAlloc, storage Storage, allocator HostAlloc = offload_allocator_t<Backend>>
class nvme_adamw {
  using host_backend = host_backend_t<HostAlloc>;
  using host_counting = counting_allocator<HostAlloc>;
  using stream_type = typename Backend::stream_type;
  using file_type = typename Storage::file_type;
  static constexpr bool device_host_accessible = DeviceAlloc::host_accessible;

public:
  nvme_adamw(const flat_layout& layout, adamw_placement place, std::vector<std::size_t> group_of,
             std::vector<param_group> groups, Backend& backend, HostAlloc host, stream_type& stream, Storage& storage,
             int rank, const nvme_options& opt)
      : backend_(backend), stream_(stream), storage_(storage), counted_(host),
        host_(make_host_backend(opt.threads, host)), device_params_(place.params),
        device_sharded_(place.params_sharded), in_file_(place.params_in_file), param_size_(size_of(layout.type())),
        param_type_(layout.type()), inner_(layout,
                                           adamw_placement{.rank = place.rank,
                                                           .partitioned = place.partitioned,
                                                           .grad_type = place.grad_type,
                                                           .params = reinterpret_cast<std::byte*>(&never_read_),
                                                           .params_sharded = true,
                                                           .state_elsewhere = true,
                                                           .state_begin = place.state_begin,
                                                           .state_end = place.state_end},
                                           std::move(group_of), std::move(groups), host_, counted_, host_stream_),
        grads_(backend, host_, inner_.ranges(), counted_, inner_.state_size(), place.grad_type) {
    if (place.params == nullptr && !in_file_) {
      throw usage_error("nvme_adamw: no parameters to update (adamw_placement::params is null)");
    }
    if (opt.buffer_count < 2) {
      throw config_error(detail::cat("zero_optimization.offload_optimizer.buffer_count: NVMe offload needs at least 2 "
                                     "chunk buffers (one updating, one reading ahead), got ",
                                     std::to_string(opt.buffer_count)));
    }
    const std::size_t n = inner_.state_size();
    tensors_ = inner_.has_master() ? 3 : 2;
    // Every range starts at an aligned element of the file, so every request is aligned.
    const std::size_t unit = std::max<std::size_t>(1, storage_.alignment() / sizeof(float));
    const auto& ranges = inner_.ranges();
    std::size_t at = 0;
    for (const auto& [range, off] : ranges) {
      file_base_.push_back(at);
      at += round_up(range.size(), unit);
    }
    slot_elements_ = at;
    std::size_t largest = 1;
    for (const auto& [range, off] : ranges) {
      largest = std::max(largest, range.size());
    }
    chunk_ = round_up(std::min(std::max<std::size_t>(opt.chunk_elements, 1), largest), unit);
    // Before the file: a count no host can hold is refused with nothing made.
    detail::check_host_buffers("zero_optimization.offload_optimizer.buffer_count", opt.buffer_count,
                               round_up(tensors_ * chunk_ * sizeof(float), storage_.alignment()));
    swap_ =
        detail::swap_file<Storage>(storage_, opt.dir, "optimizer", rank, 2 * tensors_ * slot_elements_ * sizeof(float));
    unit_ = std::max(unit, std::max<std::size_t>(1, file().alignment() / sizeof(float)));
    if (unit_ != unit) {
      throw io_error(detail::cat(path().string(), ": the file system asks for ", std::to_string(file().alignment()),
                                 "-byte alignment, more than the storage's ", std::to_string(storage_.alignment())));
    }
    for (std::size_t b = 0; b < opt.buffer_count; ++b) {
      chunks_.push_back(
          chunk_buffer{storage_buffer(storage_, tensors_ * chunk_ * sizeof(float), counted_, memory_tag::buffers), {}});
    }
    // Zeroed: padding elements are never written by the device.
    for (auto& p : params_) {
      p = buffer<std::byte, host_counting>(counted_, n * param_size_, memory_tag::params);
      std::fill_n(p.data(), n * param_size_, std::byte{0});
    }
    for (auto& c : chunks_) {
      std::fill_n(c.bytes.data(), c.bytes.size(), std::byte{0});
    }
  }

  nvme_adamw(const nvme_adamw&) = delete;
  nvme_adamw& operator=(const nvme_adamw&) = delete;
  /// Waits for I/O and copies in flight; the state file is removed with `swap_`. Never throws.
  ~nvme_adamw() {
    try {
      storage_.wait_all();
    } catch (...) { // NOLINT(bugprone-empty-catch): a destructor reports nothing
    }
    try {
      backend_.synchronize(stream_);
    } catch (...) { // NOLINT(bugprone-empty-catch)
    }
  }

  [[nodiscard]] const std::vector<std::pair<flat_range, std::size_t>>& ranges() const noexcept {
    return inner_.ranges();
  }
  [[nodiscard]] const std::vector<owned_run>& runs() const noexcept { return inner_.runs(); }
  [[nodiscard]] std::size_t state_size() const noexcept { return inner_.state_size(); }
  [[nodiscard]] std::vector<param_group>& groups() noexcept { return inner_.groups(); }
  [[nodiscard]] bool has_master() const noexcept { return inner_.has_master(); }
  /// Host bytes by tag (gradient and parameter shards, chunk buffers).
  [[nodiscard]] const host_counting& host_memory() const noexcept { return counted_; }
  /// The host gradient shard (streamed by the engine at stages 2-3).
  [[nodiscard]] auto& grads() noexcept { return grads_; }
  /// Bytes of the state file.
  [[nodiscard]] std::size_t nvme_bytes() const noexcept { return 2 * tensors_ * slot_elements_ * sizeof(float); }
  /// The state file.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return swap_.path(); }
  /// The state file, for the storage's requests.
  [[nodiscard]] const file_type& file() const noexcept { return swap_.file(); }

  /// Copies the owned part of the device parameters to the host and writes the master copy from it.
  void load_master() {
    for (const auto& [range, off] : inner_.ranges()) {
      copy_and_wait<device_host_accessible>(backend_, stream_, device_params(range, off), param_at(cur_, off),
                                            range.size() * param_size_);
    }
    if (!has_master()) {
      return;
    }
    std::vector<float> values(inner_.state_size());
    visit_float(param_type_, [&]<class P>(type_tag<P>) {
      const P* p = reinterpret_cast<const P*>(params_[cur_].data());
      for (std::size_t i = 0; i < values.size(); ++i) {
        values[i] = to_float(p[i]);
      }
    });
    write_state(state_tensor::master, 0, values);
  }

  /// Host copies of the current state.
  void read_state(state_tensor t, std::size_t state_offset, std::span<float> out) {
    transfer_state(t, state_offset, out.size(), [&](float* file_values, std::size_t done, std::size_t n) {
      std::copy(file_values, file_values + n, out.data() + done);
    });
  }
  /// Writes host values into the current state (the device parameters are the caller's to write).
  void write_state(state_tensor t, std::size_t state_offset, std::span<const float> in) {
    transfer_state(
        t, state_offset, in.size(),
        [&](float* file_values, std::size_t done, std::size_t n) {
          std::copy(in.data() + done, in.data() + done + n, file_values);
        },
        true);
  }

  /// One optimizer step over every owned range, with its copies on the engine's stream.
  template <class GradOf, class GroupLr> void step(const adamw_step_args& base, GroupLr&& group_lr, GradOf&& grad_of) {
    for (std::size_t k = 0; k < inner_.ranges().size(); ++k) {
      step_range(k, stream_, base, group_lr, grad_of);
    }
  }

  /// The step of owned range `k`, its copies on `s` (see the file comment). An I/O error does not
  /// throw here: the range's parameters are uploaded unchanged, later ranges do no I/O, and
  /// `finish_step` reports it, so every rank makes the same collectives.
  template <class GradOf, class GroupLr>
  void step_range(std::size_t k, const stream_type& s, const adamw_step_args& base, GroupLr&& group_lr,
                  GradOf&& grad_of) {
    grads_.wait(k, s, grad_of, "nvme_adamw");
    const auto& ranges = inner_.ranges();
    stepping_ = true;
    if (!failed_) {
      try {
        update(k, base, group_lr);
      } catch (const io_error&) {
        failed_ = std::current_exception();
      }
    }
    const auto& [range, off] = ranges[k];
    // After a failure the parameters stay the previous step's.
    copy_async<device_host_accessible>(backend_, s, param_at(failed_ ? cur_ : 1 - cur_, off),
                                       in_file_ ? in_file_(param_use::update, k) : device_params(range, off),
                                       range.size() * param_size_);
  }

  /// Waits for the step's writes. \returns the first I/O error of the step, or null.
  std::exception_ptr finish_step() {
    if (!stepping_) {
      return nullptr;
    }
    try {
      storage_.wait_all();
    } catch (const io_error&) {
      if (!failed_) {
        failed_ = std::current_exception();
      }
    }
    for (auto& c : chunks_) {
      c.pending.clear();
    }
    return failed_;
  }
  /// The written slot and parameter copy become current.
  void commit() {
    if (stepping_) {
      cur_ = 1 - cur_;
    }
    stepping_ = false;
    failed_ = nullptr;
  }
  /// Uploads the current (previous step's) parameters of every range again, on `s`, and waits (for
  /// parameters in a file: into the ranges it keeps in host memory; its other ranges kept their slot).
  void rollback(const stream_type& s) {
    for (std::size_t k = 0; k < inner_.ranges().size(); ++k) {
      const auto& [range, off] = inner_.ranges()[k];
      if (std::byte* to = in_file_ ? in_file_(param_use::restore, k) : device_params(range, off)) {
        copy_async<device_host_accessible>(backend_, s, param_at(cur_, off), to, range.size() * param_size_);
      }
    }
    backend_.synchronize(s);
    stepping_ = false;
    failed_ = nullptr;
  }

private:
  struct chunk_buffer {
    buffer<std::byte, host_counting> bytes;
    std::vector<storage_ticket> pending; // writes still reading it
  };

  static std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }
  std::byte* param_at(std::size_t copy, std::size_t state_offset) {
    return params_[copy].data() + state_offset * param_size_;
  }
  std::byte* device_params(const flat_range& range, std::size_t state_offset) {
    const auto base = in_file_ ? in_file_(param_use::whole, 0) : device_params_;
    return base + (device_sharded_ ? state_offset : range.begin) * param_size_;
  }
  /// The file offset of element `i` of tensor `t` (0: master or m, ...) of range `k` in `slot`.
  [[nodiscard]] std::uint64_t file_offset(std::size_t slot, std::size_t t, std::size_t k, std::size_t i) const {
    return ((slot * tensors_ + t) * slot_elements_ + file_base_[k] + i) * sizeof(float);
  }
  /// The tensor index in the file of `t`; fp32 training keeps no master there.
  [[nodiscard]] std::size_t tensor_index(state_tensor t) const {
    const auto i = static_cast<std::size_t>(t);
    return tensors_ == 3 ? i : i - 1;
  }
  float* chunk_tensor(chunk_buffer& c, std::size_t t) { return reinterpret_cast<float*>(c.bytes.data()) + t * chunk_; }
  void drain(chunk_buffer& c) {
    for (auto t : std::exchange(c.pending, {})) {
      storage_.wait(t);
    }
  }

  /// Reads, updates and writes back the chunks of range `k` (see the file comment).
  template <class GroupLr> void update(std::size_t k, const adamw_step_args& base, GroupLr& group_lr) {
    const auto& [range, off] = inner_.ranges()[k];
    const std::size_t n = range.size();
    const std::size_t chunks = (n + chunk_ - 1) / chunk_;
    const std::size_t ahead = chunks_.size() - 1;
    const std::size_t next = 1 - cur_;
    std::vector<std::vector<storage_ticket>> reads(chunks);
    auto post_read = [&](std::size_t j) {
      auto& c = chunks_[j % chunks_.size()];
      drain(c); // its last writes are done before it is read into again
      const std::size_t len = round_up(std::min(chunk_, n - j * chunk_), unit_);
      for (std::size_t t = 0; t < tensors_; ++t) {
        reads[j].push_back(storage_.submit_read(file(), file_offset(cur_, t, k, j * chunk_),
                                                std::as_writable_bytes(std::span(chunk_tensor(c, t), len))));
      }
    };
    for (std::size_t j = 0; j < std::min(chunks, ahead); ++j) {
      post_read(j);
    }
    for (std::size_t j = 0; j < chunks; ++j) {
      if (j + ahead < chunks) {
        post_read(j + ahead);
      }
      for (auto t : reads[j]) {
        storage_.wait(t);
      }
      auto& c = chunks_[j % chunks_.size()];
      const std::size_t first = off + j * chunk_;
      const std::size_t len = std::min(chunk_, n - j * chunk_);
      if (!has_master()) {
        // fp32 training: the master is the host parameter copy; the next copy starts as the current.
        std::copy_n(param_at(cur_, first), len * param_size_, param_at(next, first));
      }
      inner_.step_window({.range = k,
                          .first = first,
                          .count = len,
                          .master = has_master() ? chunk_tensor(c, 0) : nullptr,
                          .m = chunk_tensor(c, tensors_ - 2),
                          .v = chunk_tensor(c, tensors_ - 1),
                          .grads = grads_.at(first),
                          .params = param_at(next, first)},
                         host_stream_, base, group_lr);
      const std::size_t io = round_up(len, unit_);
      for (std::size_t t = 0; t < tensors_; ++t) {
        c.pending.push_back(storage_.submit_write(file(), file_offset(next, t, k, j * chunk_),
                                                  std::as_bytes(std::span(chunk_tensor(c, t), io))));
      }
    }
  }

  /// Calls `f(values, done, n)` for the pieces of `count` elements of `t` from state index
  /// `state_offset` on, read from the current slot through a chunk buffer, and with `write_back`
  /// writes the piece back after `f` changed it. The master of fp32 training is the host copy.
  template <class F>
  void transfer_state(state_tensor t, std::size_t state_offset, std::size_t count, F&& f, bool write_back = false) {
    if (state_offset + count > inner_.state_size()) {
      throw usage_error(detail::cat("nvme_adamw: state elements [", std::to_string(state_offset), ", ",
                                    std::to_string(state_offset + count), ") are outside this rank's ",
                                    std::to_string(inner_.state_size())));
    }
    if (t == state_tensor::master && !has_master()) {
      f(reinterpret_cast<float*>(param_at(cur_, state_offset)), 0, count);
      return;
    }
    storage_.wait_all();
    auto& c = chunks_.front();
    float* values = chunk_tensor(c, 0);
    const std::size_t ti = tensor_index(t);
    const auto& ranges = inner_.ranges();
    for (std::size_t k = 0; k < ranges.size(); ++k) {
      const auto& [range, off] = ranges[k];
      std::size_t lo = std::max(state_offset, off);
      const std::size_t hi = std::min(state_offset + count, off + range.size());
      while (lo < hi) {
        // The aligned window of the file around [lo, lo + piece).
        const std::size_t rel = lo - off;
        const std::size_t begin = rel / unit_ * unit_;
        const std::size_t piece = std::min(hi - lo, chunk_ - (rel - begin));
        const std::size_t io = round_up(rel - begin + piece, unit_);
        const auto bytes = std::as_writable_bytes(std::span(values, io));
        storage_.wait(storage_.submit_read(file(), file_offset(cur_, ti, k, begin), bytes));
        f(values + (rel - begin), lo - state_offset, piece);
        if (write_back) {
          storage_.wait(storage_.submit_write(file(), file_offset(cur_, ti, k, begin), std::as_bytes(bytes)));
        }
        lo += piece;
      }
    }
  }

  Backend& backend_;
  stream_type& stream_;
  Storage& storage_;
  host_counting counted_;
  host_backend host_;
  typename host_backend::stream_type host_stream_;
  std::byte* device_params_;
  bool device_sharded_;
  std::function<std::byte*(param_use, std::size_t)> in_file_; // parameters in a file (offload_param nvme)
  std::size_t param_size_;
  dtype param_type_;
  float never_read_ = 0;
  partitioned_adamw<host_backend, HostAlloc> inner_;
  std::size_t tensors_ = 3;
  std::vector<std::size_t> file_base_;
  std::size_t slot_elements_ = 0;
  std::size_t unit_ = 1;
  std::size_t chunk_ = 1;
  detail::swap_file<Storage> swap_; // removed with the optimizer, also when its constructor throws
  std::vector<chunk_buffer> chunks_;
  buffer<std::byte, host_counting> params_[2];
  detail::host_gradients<Backend, device_host_accessible, host_counting, host_backend> grads_;
  std::size_t cur_ = 0;
  bool stepping_ = false;
  std::exception_ptr failed_;
};

} // namespace zero
