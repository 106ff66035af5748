#pragma once
/// \file
/// `failing_storage<S>`: a failure-injecting storage for tests. It passes requests to an inner
/// storage until a chosen read or write request (by count), which it does not pass on: that
/// request's `wait` throws the `io_error` a real failure would (ENOSPC, EIO, ...), so tests can show
/// that an engine whose drive fills up or fails half-way says so and loses nothing it had saved.

#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/storage/detail/files.hpp"
#include "zero/storage/posix_storage.hpp"
#include "zero/storage/storage.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace zero {

/// Injects read and write failures into the storage `S` it holds. Not thread-safe: one thread
/// submits and waits (the inner storage's own rules apply below that).
template <storage S> class failing_storage {
public:
  using file_type = typename S::file_type;

  /// Holds an `S` made from `args`: `failing_storage<posix_storage> s(storage_options{...})`.
  template <class... Args>
  explicit failing_storage(Args&&... args) requires std::constructible_from<S, Args&&...>
      : inner_(std::forward<Args>(args)...) {}

  /// Makes the `nth` write request from now (0-based, counted over every file) fail with errno
  /// `err` at its `wait`, without writing anything. Several may be planned.
  void fail_write(std::size_t nth, int err) { plan_[detail::io_op::write].insert_or_assign(writes_ + nth, err); }
  /// Makes the `nth` read request from now fail with `err` at its `wait`, without reading.
  void fail_read(std::size_t nth, int err) { plan_[detail::io_op::read].insert_or_assign(reads_ + nth, err); }
  /// Write requests seen so far (failed ones included).
  [[nodiscard]] std::size_t writes() const noexcept { return writes_; }
  /// Read requests seen so far (failed ones included).
  [[nodiscard]] std::size_t reads() const noexcept { return reads_; }
  /// The storage underneath.
  [[nodiscard]] S& inner() noexcept { return inner_; }
  [[nodiscard]] const S& inner() const noexcept { return inner_; }

  /// The inner storage's name, alignment, create and open.
  [[nodiscard]] std::string_view name() const { return inner_.name(); }
  [[nodiscard]] std::size_t alignment() const { return inner_.alignment(); }
  [[nodiscard]] file_type create(const std::filesystem::path& path, std::uint64_t bytes) {
    return inner_.create(path, bytes);
  }
  [[nodiscard]] file_type open(const std::filesystem::path& path) { return inner_.open(path); }

  /// The inner storage's `submit_read`, or, for a planned failure, a request that fails at `wait`.
  /// \throws usage_error for a misaligned request (planned to fail or not), as the inner storage.
  [[nodiscard]] storage_ticket submit_read(const file_type& file, std::uint64_t offset, std::span<std::byte> dst) {
    return submit(detail::io_op::read, file, offset, dst.data(), dst.size(),
                  [&] { return inner_.submit_read(file, offset, dst); });
  }
  /// The inner storage's `submit_write`, or, for a planned failure, a request that fails at `wait`.
  [[nodiscard]] storage_ticket submit_write(const file_type& file, std::uint64_t offset,
                                            std::span<const std::byte> src) {
    return submit(detail::io_op::write, file, offset, src.data(), src.size(),
                  [&] { return inner_.submit_write(file, offset, src); });
  }

  /// Completes one request: the inner storage's `wait`, or the planned failure's `io_error` ("...
  /// failed: No space left on device (ENOSPC) (injected by failing_storage)").
  /// \throws usage_error for a ticket it never gave; one already waited for returns at once.
  void wait(storage_ticket ticket) {
    if (ticket == 0 || ticket >= next_) {
      throw usage_error(
          detail::cat("failing_storage: wait for ticket ", std::to_string(ticket), ", which this storage never gave"));
    }
    const auto it = requests_.find(ticket);
    if (it == requests_.end()) {
      return;
    }
    const request r = std::move(it->second);
    requests_.erase(it);
    if (r.injected) {
      throw detail::request_error(r.op, r.path, r.offset, r.bytes, {.err = r.injected->err},
                                  " (injected by failing_storage)");
    }
    inner_.wait(r.inner);
  }

  /// Completes every request, then throws the first (smallest ticket) failure, saying how many more
  /// failed.
  void wait_all() {
    std::optional<io_error> first;
    std::size_t more = 0;
    while (!requests_.empty()) {
      try {
        wait(requests_.begin()->first);
      } catch (const io_error& e) {
        if (first) {
          ++more;
        } else {
          first.emplace(e);
        }
      }
    }
    if (first) {
      throw detail::with_more_failures(*first, more);
    }
  }

private:
  struct injected_failure {
    int err;
  };
  struct request {
    detail::io_op op = detail::io_op::read;
    storage_ticket inner = 0;
    std::optional<injected_failure> injected{};
    std::filesystem::path path{};
    std::uint64_t offset = 0;
    std::size_t bytes = 0;
  };

  template <class Submit>
  storage_ticket submit(detail::io_op op, const file_type& file, std::uint64_t offset, const std::byte* data,
                        std::size_t bytes, Submit&& pass_on) {
    std::size_t& count = op == detail::io_op::read ? reads_ : writes_;
    auto& plan = plan_[op];
    request r{.op = op};
    if (const auto planned = plan.find(count); planned != plan.end()) {
      // Refused as the inner storage would refuse it, though nothing reaches it.
      const std::size_t align = inner_.alignment();
      if (reinterpret_cast<std::uintptr_t>(data) % align != 0 || offset % align != 0 || bytes % align != 0) {
        throw usage_error(detail::cat("failing_storage: the buffer address, offset or length of the ",
                                      detail::describe_request(op, file.path(), offset, bytes),
                                      " is not a multiple of ", std::to_string(align), ", the ", inner_.name(),
                                      " storage's alignment"));
      }
      r.injected = injected_failure{planned->second};
      r.path = file.path();
      r.offset = offset;
      r.bytes = bytes;
      plan.erase(planned);
    } else {
      r.inner = pass_on();
    }
    ++count;
    const storage_ticket ticket = next_++;
    requests_.emplace(ticket, std::move(r));
    return ticket;
  }

  S inner_;
  std::map<detail::io_op, std::map<std::size_t, int>> plan_; // request index -> errno
  std::map<storage_ticket, request> requests_;               // ordered: wait_all reports the smallest
  std::size_t reads_ = 0;
  std::size_t writes_ = 0;
  storage_ticket next_ = 1;
};

static_assert(storage<failing_storage<posix_storage>>);

} // namespace zero
