#pragma once
/// \file
/// `detail::param_file`: stage 3's parameter shard on NVMe (`zero_optimization.offload_param.device:
/// nvme`, ZeRO-Infinity's parameter offload), for `detail::param_shard` (docs/offload.md).
///
/// The shard is cut into ranges, one per unit (a module's slice on this rank, in shard order). The
/// ranges that end within the first `max_in_cpu` elements of the shard stay in host memory (the
/// resident part); the others live in one file of the `Storage` policy under `nvme_path`, in two
/// slots, and pass through `buffer_count` bounce buffers of the largest such range (at most
/// `buffer_size` elements). A gather reads its range into a bounce buffer (or finds it read ahead)
/// and uploads it from there; the optimizer writes a range's new values into a bounce buffer, which
/// is written behind to the slot the range does not read from, while later ranges update.
///
/// A step's writes become current only at `commit`, so a step some rank could not finish leaves the
/// file as it was (`rollback`). A write that failed in a step that is applied anyway (the optimizer
/// state lives in memory and has moved on) keeps that range's new values in host memory, where
/// gathers read them, until a later write of the range succeeds. A read that fails during a gather
/// uploads zeros and is remembered (`take_read_error`): the engine makes every rank agree on it at
/// the next `step()` and drops that accumulation, so no rank leaves a collective early. An evaluation
/// pass has no step after it: while `report_reads_at_gather` is on, the outcome of each range's last
/// read is kept for that range's gather instead (`take_read_error(k)`), which fails with it.
///
/// Operations that address the whole shard (initialisation, checkpoints, `gather_all` with a
/// modifier) use an image: the shard read into host memory, which is the truth while it exists and
/// is written back at `flush` (or dropped unchanged at the next step).

#include "zero/backend/backend.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/step/adamw_placement.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/detail/host_budget.hpp"
#include "zero/storage/detail/swap_file.hpp"
#include "zero/storage/storage.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <unistd.h>
#include <utility>
#include <vector>

namespace zero::detail {

/// Where and how a `param_file` keeps the shard (the config's `offload_param` block).
struct param_file_options {
  /// The folder of the file (`offload_param.nvme_path`).
  std::filesystem::path dir;
  /// Bounce buffers (`buffer_count`, at least 1) and the most elements each holds (`buffer_size`).
  std::size_t buffer_count = 5;
  std::size_t buffer_size = 100'000'000;
  /// Elements of the shard kept in host memory: the ranges that end within them (`max_in_cpu`).
  std::size_t max_in_cpu = 1'000'000'000;
  /// The rank, for the file name.
  int rank = 0;
};

/// One range of the shard: where it starts (elements) and its elements.
struct shard_range {
  std::size_t offset = 0;
  std::size_t size = 0;
};

/// The ranges of a rank's shard of `layout` (finalized by module): one per segment, in shard order.
inline std::vector<shard_range> shard_ranges(const flat_layout& layout) {
  std::vector<shard_range> out;
  for (const auto& s : layout.segments()) {
    out.push_back({s.shard_offset, s.slice});
  }
  return out;
}

/// The shard on NVMe; see the file comment. `Counting` is the host memory (counted by tag: resident
/// part and kept ranges under params, bounce buffers under buffers).
template <backend_base Backend, class Counting, storage Storage> class param_file {
  using event_type = typename Backend::event_type;
  using stream_type = typename Backend::stream_type;

public:
  /// Creates the file (0600) and the buffers. \throws config_error for a bounce buffer smaller than a
  /// range in the file, or no buffer; io_error naming the file when it cannot be created.
  param_file(Backend& backend, Storage& storage, Counting host, std::vector<shard_range> ranges, std::size_t esize,
             const param_file_options& opt)
      : backend_(backend), storage_(storage), host_(std::move(host)), ranges_(std::move(ranges)), esize_(esize),
        cur_(ranges_.size(), 0), kept_(ranges_.size()), failed_copy_(ranges_.size()), written_(ranges_.size(), false) {
    if (opt.buffer_count < 1) {
      throw config_error("zero_optimization.offload_param.buffer_count: NVMe offload of parameters needs at least 1 "
                         "buffer, got 0");
    }
    std::size_t largest = 0;
    for (const auto& r : ranges_) {
      if (r.offset + r.size <= opt.max_in_cpu) {
        ++resident_ranges_;
        resident_elements_ = r.offset + r.size;
      } else {
        largest = std::max(largest, r.size);
      }
    }
    if (largest > opt.buffer_size) {
      throw config_error(cat("zero_optimization.offload_param.buffer_size: ", std::to_string(opt.buffer_size),
                             " elements cannot hold a module's slice of ", std::to_string(largest),
                             " elements on rank ", std::to_string(opt.rank),
                             "; raise it to at least the largest module's elements divided by the ranks"));
    }
    resident_ = buffer<std::byte, Counting>(host_, resident_elements_ * esize_, memory_tag::params);
    std::fill_n(resident_.data(), resident_.size(), std::byte{0});
    const std::size_t align = std::max<std::size_t>(1, storage_.alignment());
    base_.assign(ranges_.size(), 0);
    for (std::size_t k = resident_ranges_; k < ranges_.size(); ++k) {
      base_[k] = slot_bytes_;
      slot_bytes_ += round_up(ranges_[k].size * esize_, align);
    }
    // A file of nothing (every range in host memory) is not created.
    if (slot_bytes_ > 0) {
      // Before the file: a count no host can hold is refused with nothing made.
      check_host_buffers("zero_optimization.offload_param.buffer_count", opt.buffer_count,
                         round_up(largest * esize_, align));
      swap_ = swap_file<Storage>(storage_, opt.dir, "params", opt.rank, 2 * slot_bytes_);
      if (file().alignment() > align) {
        throw io_error(cat(path().string(), ": the file system asks for ", std::to_string(file().alignment()),
                           "-byte alignment, more than the storage's ", std::to_string(align)));
      }
      for (std::size_t b = 0; b < opt.buffer_count; ++b) {
        bounces_.push_back({storage_buffer(storage_, largest * esize_, host_, memory_tag::buffers)});
        std::fill_n(bounces_.back().bytes.data(), bounces_.back().bytes.size(), std::byte{0});
      }
    }
  }
  param_file(const param_file&) = delete;
  param_file& operator=(const param_file&) = delete;
  /// Waits for the I/O in flight and removes the file; never throws.
  ~param_file() {
    try {
      storage_.wait_all();
    } catch (...) { // NOLINT(bugprone-empty-catch): a destructor reports nothing
    }
  }

  /// The file (empty when every range is in host memory) and its bytes (two slots).
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return swap_.path(); }
  [[nodiscard]] std::size_t file_bytes() const noexcept { return 2 * slot_bytes_; }
  /// Elements of the shard kept in host memory.
  [[nodiscard]] std::size_t resident_elements() const noexcept { return resident_elements_; }
  [[nodiscard]] const Counting& host_memory() const noexcept { return host_; }

  /// Host memory holding range `k`'s current values for an upload: the image, the resident part, a
  /// kept copy, or a bounce buffer read from the file (or read ahead). A failed read yields zeros
  /// and is remembered. Call `uploaded` after posting the upload.
  const std::byte* source(std::size_t k) {
    if (std::byte* h = in_host(k)) {
      return h;
    }
    bounce* b = find_read(k);
    if (b == nullptr) {
      b = &acquire();
      submit_read(*b, k);
    }
    const std::exception_ptr e = finish(*b);
    if (e) {
      std::fill_n(b->bytes.data(), ranges_[k].size * esize_, std::byte{0});
    }
    if (at_gather_) {
      gather_errors_[k] = e; // the last read is what the upload holds: a success clears an earlier failure
    } else if (e && !read_error_) {
      read_error_ = e;
    }
    last_ = b;
    return b->bytes.data();
  }
  /// The upload from the last `source` was posted on `s`: its buffer is reused only after it.
  void uploaded(const stream_type& s) {
    if (last_ != nullptr) {
      record(*last_, s);
      last_ = nullptr;
    }
  }
  /// Starts reading range `k` into a free bounce buffer, ahead of its gather. \returns false when no
  /// buffer is free (the caller stops reading ahead).
  bool read_ahead(std::size_t k) {
    if (in_host(k) != nullptr || find_read(k) != nullptr) {
      return true;
    }
    bounce& b = bounces_[next_];
    if (b.what == op::read) {
      return false; // holds a read ahead not yet used
    }
    finish(b);
    next_ = (next_ + 1) % bounces_.size();
    submit_read(b, k);
    return true;
  }
  /// The first read that failed since the last call, or null.
  std::exception_ptr take_read_error() noexcept { return std::exchange(read_error_, nullptr); }
  /// While `on`, each range's last read outcome is kept for `take_read_error(k)` rather than for
  /// `take_read_error()`; turning it off drops the failures no gather took.
  void report_reads_at_gather(bool on) {
    gather_errors_.resize(ranges_.size()); // allocates once: later calls cannot throw
    std::fill(gather_errors_.begin(), gather_errors_.end(), nullptr);
    at_gather_ = on;
  }
  /// The failure of range `k`'s last read while reads are reported at the gather, or null.
  std::exception_ptr take_read_error(std::size_t k) noexcept {
    return k < gather_errors_.size() ? std::exchange(gather_errors_[k], nullptr) : nullptr;
  }

  /// Where the step of range `k` writes its new values: into the image or the resident part, or a
  /// bounce buffer written behind after `updated`.
  std::byte* update_window(std::size_t k) {
    begin_step();
    if (image_.data() != nullptr || k < resident_ranges_) {
      return in_host(k); // written in place
    }
    bounce& b = acquire();
    b.what = op::update;
    b.range = k;
    return b.bytes.data();
  }
  /// Range `k`'s new values were enqueued on `s`: its write is submitted once `s` passed that point
  /// (the earlier ranges' writes are submitted now).
  void updated(std::size_t k, const stream_type& s) {
    for (auto& b : bounces_) {
      if (b.what == op::update) {
        if (b.range == k) {
          record(b, s);
        } else {
          submit_write(b);
        }
      }
    }
  }
  /// Where the previous values of range `k` go back after a step no rank may keep: the image or the
  /// resident part; null for a range in the file, whose current slot was not written.
  std::byte* restore_window(std::size_t k) {
    if (image_.data() != nullptr) {
      return image_.data() + ranges_[k].offset * esize_;
    }
    return k < resident_ranges_ ? resident_.data() + ranges_[k].offset * esize_ : nullptr;
  }

  /// What an optimizer's `adamw_placement::params_in_file` gives for `use` of range `k`.
  std::byte* params_for(param_use use, std::size_t k) {
    switch (use) {
    case param_use::update:
      return update_window(k);
    case param_use::restore:
      return restore_window(k);
    default:
      return image();
    }
  }

  /// Waits for the step's writes. \returns the first that failed (or the image's write), or null.
  std::exception_ptr finish_step() {
    for (auto& b : bounces_) {
      finish(b);
    }
    return step_error_;
  }
  /// The step's writes become current; a range whose write failed keeps its new values in host memory.
  void commit() {
    for (std::size_t k = 0; k < ranges_.size(); ++k) {
      if (written_[k]) {
        cur_[k] = 1 - cur_[k];
        kept_[k] = {};
      } else if (failed_copy_[k].data() != nullptr) {
        kept_[k] = std::move(failed_copy_[k]);
      }
    }
    end_step();
  }
  /// The step's writes are forgotten: the current slots and kept copies stay.
  void rollback() {
    for (auto& c : failed_copy_) {
      c = {};
    }
    end_step();
  }

  /// The whole shard in host memory (read now if it is not), the truth until `flush` or the next step.
  /// \throws io_error when a read fails (the image is not kept then).
  std::byte* image() {
    if (image_.data() == nullptr) {
      buffer<std::byte, Counting> img(host_, shard_elements() * esize_, memory_tag::params);
      std::fill_n(img.data(), img.size(), std::byte{0});
      for (std::size_t k = 0; k < ranges_.size(); ++k) {
        const std::byte* from = source(k);
        last_ = nullptr;
        if (const auto e = at_gather_ ? take_read_error(k) : take_read_error()) {
          std::rethrow_exception(e);
        }
        std::memcpy(img.data() + ranges_[k].offset * esize_, from, ranges_[k].size * esize_);
      }
      image_ = std::move(img);
    }
    return image_.data();
  }
  /// Writes the image back and drops it. \returns the first write that failed (the image stays), or null.
  std::exception_ptr flush() {
    if (image_.data() == nullptr) {
      return nullptr;
    }
    flush_error_ = nullptr;
    for (std::size_t k = resident_ranges_; k < ranges_.size(); ++k) {
      bounce& b = acquire();
      std::memcpy(b.bytes.data(), image_.data() + ranges_[k].offset * esize_, ranges_[k].size * esize_);
      b.what = op::flush;
      b.range = k;
      b.ticket = storage_.submit_write(file(), offset(1 - cur_[k], k), std::as_bytes(io_span(b, k)));
    }
    for (auto& b : bounces_) {
      finish(b);
    }
    if (flush_error_) {
      return std::exchange(flush_error_, nullptr);
    }
    for (std::size_t k = resident_ranges_; k < ranges_.size(); ++k) {
      cur_[k] = 1 - cur_[k];
      kept_[k] = {};
    }
    if (resident_.size() > 0) {
      std::memcpy(resident_.data(), image_.data(), resident_.size());
    }
    image_ = {};
    return nullptr;
  }

private:
  /// What a bounce buffer holds or is doing.
  enum class op : std::uint8_t {
    idle,   ///< nothing pending (its bytes may still feed an upload until `used`)
    read,   ///< a range read from the file, not yet taken by a gather
    update, ///< a step's window, its write not yet submitted
    write,  ///< a step's write in flight
    flush,  ///< an image write in flight
  };
  struct bounce {
    buffer<std::byte, Counting> bytes;
    op what = op::idle;
    std::size_t range = 0;
    storage_ticket ticket = 0;        // the request in flight, 0: none
    std::optional<event_type> used{}; // a stream reads (upload) or writes (update) it up to here
    bool pending = false;             // `used` was recorded and not yet waited for
  };

  static std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }
  [[nodiscard]] const typename Storage::file_type& file() const noexcept { return swap_.file(); }
  [[nodiscard]] std::size_t shard_elements() const noexcept {
    return ranges_.empty() ? 0 : ranges_.back().offset + ranges_.back().size;
  }
  [[nodiscard]] std::uint64_t offset(std::size_t slot, std::size_t k) const { return slot * slot_bytes_ + base_[k]; }
  /// The bytes of a request for range `k`: its values, rounded up to the storage's alignment.
  std::span<std::byte> io_span(bounce& b, std::size_t k) {
    return {b.bytes.data(), round_up(ranges_[k].size * esize_, std::max<std::size_t>(1, storage_.alignment()))};
  }
  std::byte* in_host(std::size_t k) {
    const std::size_t at = ranges_[k].offset * esize_;
    if (image_.data() != nullptr) {
      return image_.data() + at;
    }
    if (k < resident_ranges_) {
      return resident_.data() + at;
    }
    return kept_[k].data();
  }
  bounce* find_read(std::size_t k) {
    for (auto& b : bounces_) {
      if (b.what == op::read && b.range == k) {
        return &b;
      }
    }
    return nullptr;
  }
  /// The next bounce buffer in turn, once whatever it held is done.
  bounce& acquire() {
    bounce& b = bounces_[next_];
    next_ = (next_ + 1) % bounces_.size();
    finish(b);
    return b;
  }
  void record(bounce& b, const stream_type& s) {
    if (!b.used) {
      b.used.emplace(backend_.make_event());
    }
    backend_.record(*b.used, s);
    b.pending = true;
  }
  void wait_used(bounce& b) {
    if (b.pending) {
      backend_.synchronize(std::as_const(*b.used));
      b.pending = false;
    }
  }
  void submit_read(bounce& b, std::size_t k) {
    b.what = op::read;
    b.range = k;
    b.ticket = storage_.submit_read(file(), offset(cur_[k], k), io_span(b, k));
  }
  /// Submits a step window's write to the slot its range does not read from, once its values are in.
  void submit_write(bounce& b) {
    if (b.what != op::update) {
      return;
    }
    wait_used(b);
    b.what = op::write;
    b.ticket = storage_.submit_write(file(), offset(1 - cur_[b.range], b.range), std::as_bytes(io_span(b, b.range)));
  }
  /// Completes what `b` holds. \returns its request's error, or null. A step write's outcome is noted:
  /// written, or failed with the range's new values copied aside (and the step's first error kept); an
  /// image write's failure is kept for `flush`.
  std::exception_ptr finish(bounce& b) {
    submit_write(b);
    wait_used(b);
    std::exception_ptr e;
    if (b.ticket != 0) {
      try {
        storage_.wait(std::exchange(b.ticket, 0));
      } catch (const io_error&) {
        e = std::current_exception();
      }
    }
    if (b.what == op::flush && e && !flush_error_) {
      flush_error_ = e;
    } else if (b.what == op::write) {
      if (e) {
        const std::size_t n = ranges_[b.range].size * esize_;
        failed_copy_[b.range] = buffer<std::byte, Counting>(host_, n, memory_tag::params);
        std::memcpy(failed_copy_[b.range].data(), b.bytes.data(), n);
        if (!step_error_) {
          step_error_ = e;
        }
      } else {
        written_[b.range] = true;
      }
    }
    b.what = op::idle;
    return e;
  }
  /// The first window of a step: an image left by an earlier whole-shard use is written back first;
  /// if that fails the image stays, the step's windows go into it, and the step reports the error.
  void begin_step() {
    if (stepping_) {
      return;
    }
    stepping_ = true;
    if (const auto e = flush(); e && !step_error_) {
      step_error_ = e;
    }
  }
  void end_step() {
    stepping_ = false;
    step_error_ = nullptr;
    std::fill(written_.begin(), written_.end(), false);
  }

  Backend& backend_;
  Storage& storage_;
  Counting host_;
  std::vector<shard_range> ranges_;
  std::size_t esize_;
  std::size_t resident_ranges_ = 0;
  std::size_t resident_elements_ = 0;
  buffer<std::byte, Counting> resident_;
  std::vector<std::uint64_t> base_; // byte offset of each file range within a slot
  std::size_t slot_bytes_ = 0;
  swap_file<Storage> swap_; // removed when the shard goes, also when its constructor throws after creating it
  std::vector<bounce> bounces_;
  std::size_t next_ = 0;
  bounce* last_ = nullptr;                               // the buffer of the last `source`
  std::vector<std::uint8_t> cur_;                        // each file range's current slot
  std::vector<buffer<std::byte, Counting>> kept_;        // new values of ranges whose write failed
  std::vector<buffer<std::byte, Counting>> failed_copy_; // this step's failed writes, until commit
  std::vector<bool> written_;                            // this step's writes that completed
  buffer<std::byte, Counting> image_;
  bool stepping_ = false;
  std::exception_ptr step_error_;
  std::exception_ptr flush_error_;
  std::exception_ptr read_error_;
  bool at_gather_ = false;                        // reads are reported at their range's gather
  std::vector<std::exception_ptr> gather_errors_; // each range's last failed read, while at_gather_
};

} // namespace zero::detail
