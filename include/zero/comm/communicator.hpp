#pragma once
/// \file
/// The communicator policy: a base concept (`communicator`: rank, size, group name, timeout)
/// plus one capability concept per operation, so a stage asks only for what it uses and a
/// framework may bring a communicator that can, say, only all-reduce and still get stage 0.
///
/// Every operation is asynchronous: it starts the operation and returns a handle whose `wait()`
/// blocks until the local part is complete, or throws `timeout_error` naming the operation, the
/// group, the rank and the bytes when the communicator's timeout passes first. A synchronous call
/// is `comm.all_reduce(...).wait()`. Buffers are typed pointers with element counts; send and
/// receive buffers follow `nccl.h`'s rules, in-place forms included:
///
/// | operation | send | receive | in place when |
/// |---|---|---|---|
/// | all_reduce | count | count | recv == send |
/// | reduce_scatter | size*count | count | recv == send + rank*count |
/// | all_gather | count | size*count | send == recv + rank*count |
/// | broadcast | count (root) | count | recv == send |
/// | all_to_all | size*count | size*count | never |
///
/// Until `wait()` returns, the caller must not touch either buffer.

#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace zero {

/// Reduction applied by all_reduce and reduce_scatter. `avg` divides the sum by the group size.
enum class reduce_op : std::uint8_t { sum, avg, max };

/// Name of a reduction for messages.
[[nodiscard]] constexpr std::string_view name_of(reduce_op op) noexcept {
  switch (op) {
  case reduce_op::sum:
    return "sum";
  case reduce_op::avg:
    return "avg";
  case reduce_op::max:
    return "max";
  }
  return "?";
}

/// The timeout a communicator uses when none is configured: 300 s, DeepSpeed's and NCCL's habit.
inline constexpr std::chrono::milliseconds default_comm_timeout{300'000};

/// A handle to an operation in flight. `wait()` completes it or throws.
template <class H>
concept wait_handle = std::movable<H> && requires(H& h) {
  { h.wait() } -> std::same_as<void>;
};

/// Base communicator concept: who am I, how many are we, and how long do we wait.
template <class C>
concept communicator = std::movable<C> && requires(const C& c, C& m, std::chrono::milliseconds t) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.name() } -> std::convertible_to<std::string_view>;
  { c.timeout() } -> std::same_as<std::chrono::milliseconds>;
  m.set_timeout(t);
};

/// The element type every capability concept is checked with; implementations are templates
/// over all of `zero::element_type`.
using probe_t = float;

template <class C>
concept can_all_reduce = communicator<C> && requires(C& c, const probe_t* s, probe_t* r, std::size_t n) {
  { c.all_reduce(s, r, n, reduce_op::sum) } -> wait_handle;
};

template <class C>
concept can_reduce_scatter = communicator<C> && requires(C& c, const probe_t* s, probe_t* r, std::size_t n) {
  { c.reduce_scatter(s, r, n, reduce_op::sum) } -> wait_handle;
};

template <class C>
concept can_all_gather = communicator<C> && requires(C& c, const probe_t* s, probe_t* r, std::size_t n) {
  { c.all_gather(s, r, n) } -> wait_handle;
};

template <class C>
concept can_broadcast = communicator<C> && requires(C& c, const probe_t* s, probe_t* r, std::size_t n, int root) {
  { c.broadcast(s, r, n, root) } -> wait_handle;
};

template <class C>
concept can_barrier = communicator<C> && requires(C& c) {
  { c.barrier() } -> wait_handle;
};

template <class C>
concept can_send_recv = communicator<C> && requires(C& c, const probe_t* s, probe_t* r, std::size_t n, int peer) {
  { c.send(s, n, peer) } -> wait_handle;
  { c.recv(r, n, peer) } -> wait_handle;
};

template <class C>
concept can_all_to_all = communicator<C> && requires(C& c, const probe_t* s, probe_t* r, std::size_t n) {
  { c.all_to_all(s, r, n) } -> wait_handle;
};

/// `split(color, key)` is collective over the group and returns the communicator of the ranks
/// that passed the same color, ordered by (key, old rank).
template <class C>
concept can_split = communicator<C> && requires(C& c, int color, int key) {
  { c.split(color, key) } -> std::same_as<C>;
};

/// A communicator that orders each operation after the work enqueued so far on a compute stream
/// (`set_compute_stream(s.get())`, as `nccl_communicator` does with CUDA events): code that hands it that
/// stream need not block the host on the stream before a collective.
template <class C, class Stream>
concept stream_ordered = requires(C& c, const Stream& s) {
  c.set_compute_stream(s.get());
};

/// Everything: what stage 3, checkpoints and the examples use.
template <class C>
concept full_communicator = can_all_reduce<C> && can_reduce_scatter<C> && can_all_gather<C> && can_broadcast<C> &&
    can_barrier<C> && can_send_recv<C> && can_all_to_all<C> && can_split<C>;

// The sentences of the capability checks, one per operation, shared by the compile-time checks
// (`require_*`, whose static_assert needs a literal) and the run-time ones (`missing_for_stage`).
#define ZERO_DETAIL_NEEDS_ALL_REDUCE                                                                                   \
  "zero: this needs a communicator with all_reduce(const T* send, T* recv, size_t count, reduce_op) returning a "      \
  "handle with wait() (see zero/comm/communicator.hpp)"
#define ZERO_DETAIL_NEEDS_REDUCE_SCATTER                                                                               \
  "zero: this needs a communicator with reduce_scatter(const T* send, T* recv, size_t recv_count, reduce_op) "         \
  "returning a handle with wait() (ZeRO stage 2 and 3 reduce gradients this way)"
#define ZERO_DETAIL_NEEDS_ALL_GATHER                                                                                   \
  "zero: this needs a communicator with all_gather(const T* send, T* recv, size_t send_count) returning a handle "     \
  "with wait() (ZeRO stages 1-3 gather parameters)"

namespace detail {
inline constexpr std::string_view needs_all_reduce = ZERO_DETAIL_NEEDS_ALL_REDUCE;
inline constexpr std::string_view needs_reduce_scatter = ZERO_DETAIL_NEEDS_REDUCE_SCATTER;
inline constexpr std::string_view needs_all_gather = ZERO_DETAIL_NEEDS_ALL_GATHER;
} // namespace detail

/// Compile-time checks with a sentence a user understands, for code that needs one capability.
/// Call as `zero::require_all_reduce<C>();` at the top of a function template.
template <class C> constexpr void require_all_reduce() {
  static_assert(can_all_reduce<C>, ZERO_DETAIL_NEEDS_ALL_REDUCE);
}
template <class C> constexpr void require_reduce_scatter() {
  static_assert(can_reduce_scatter<C>, ZERO_DETAIL_NEEDS_REDUCE_SCATTER);
}
template <class C> constexpr void require_all_gather() {
  static_assert(can_all_gather<C>, ZERO_DETAIL_NEEDS_ALL_GATHER);
}

/// What ZeRO stage `Stage` asks of a communicator: all_reduce (stage 0: gradients; every stage: the
/// gradient norm), all_gather from stage 1 (updated parameters), reduce_scatter from stage 2
/// (gradients). Stops compilation with the sentence of the first missing operation.
template <class C, int Stage> constexpr void require_stage() {
  static_assert(Stage >= 0 && Stage <= 3, "zero: ZeRO stages are 0, 1, 2 and 3");
  require_all_reduce<C>();
  if constexpr (Stage >= 1) {
    require_all_gather<C>();
  }
  if constexpr (Stage >= 2) {
    require_reduce_scatter<C>();
  }
}

/// The run-time form of `require_stage`, for a stage read from a config: the sentence naming the
/// first operation stage `stage` needs and `C` lacks, or empty when `C` can run it.
template <class C> [[nodiscard]] constexpr std::string_view missing_for_stage(int stage) noexcept {
  if (!can_all_reduce<C>) {
    return detail::needs_all_reduce;
  }
  if (stage >= 1 && !can_all_gather<C>) {
    return detail::needs_all_gather;
  }
  if (stage >= 2 && !can_reduce_scatter<C>) {
    return detail::needs_reduce_scatter;
  }
  return {};
}

namespace detail {
/// Rethrows the root cause among the ranks' exceptions (null where a rank returned): the first that is not
/// a comm_error ("another rank failed", echoed), else the first comm_error; returns when there is none.
/// What `run_rank_threads` rethrows once every rank's thread has ended.
inline void rethrow_root_cause(const std::vector<std::exception_ptr>& errors) {
  std::exception_ptr first;
  for (const auto& e : errors) {
    if (!e) {
      continue;
    }
    try {
      std::rethrow_exception(e);
    } catch (const comm_error&) {
      if (!first) {
        first = e;
      }
    } catch (...) {
      throw;
    }
  }
  if (first) {
    std::rethrow_exception(first);
  }
}

/// Runs `rank_body(r)` on `n` threads, thread r for rank r, and returns when all are done; a rank's exception
/// is kept and `on_failure()` called (so the others stop waiting for it), then the root cause is rethrown
/// (`rethrow_root_cause`). The group runners of the device communicators (`run_gpus`, `run_device_group`).
template <class Body, class OnFailure> void run_rank_threads(int n, Body&& rank_body, OnFailure&& on_failure) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        rank_body(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        on_failure();
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  rethrow_root_cause(errors);
}
} // namespace detail

namespace detail {
/// The message of a timeout, shared by every communicator so users see one format.
inline std::string timeout_message(std::string_view op, std::string_view group, int rank, int size, std::size_t bytes,
                                   std::chrono::milliseconds timeout) {
  return std::string(op) + " on group \"" + std::string(group) + "\" (size " + std::to_string(size) + ") at rank " +
         std::to_string(rank) + " did not complete within " + std::to_string(timeout.count()) + " ms (" +
         std::to_string(bytes) + " bytes); a rank that never joined the operation, or joined a different one, " +
         "is the usual cause";
}

/// What a rank says about a collective it starts, for communicators that compare it across ranks
/// before starting it (`mpi_communicator` always, `nccl_communicator` when asked): four int64, so
/// one all-gather of `op_signature_fields` words per rank exchanges it.
struct op_signature {
  std::int64_t kind = 0;  // index into op_names
  std::int64_t count = 0; // elements (per rank, as the call takes them)
  std::int64_t type = 0;  // zero::dtype
  std::int64_t extra = 0; // root of a broadcast, reduce_op of a reduction, 0 otherwise
};
inline constexpr int op_signature_fields = 4;
static_assert(sizeof(op_signature) == op_signature_fields * sizeof(std::int64_t));
inline constexpr std::array<const char*, 7> op_names = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                                        "barrier",    "all_to_all",     "split"};

/// "all_gather(count=1000, fp32)", "broadcast(count=8, u8, root=1)", "barrier".
[[nodiscard]] inline std::string describe(const op_signature& s) {
  const auto kind = static_cast<std::size_t>(s.kind);
  std::string text = kind < op_names.size() ? op_names[kind] : "operation " + std::to_string(s.kind);
  if (text == "barrier" || text == "split") {
    return text;
  }
  text += "(count=" + std::to_string(s.count) + ", " + std::string(name_of(static_cast<dtype>(s.type)));
  if (text.starts_with("all_reduce") || text.starts_with("reduce_scatter")) {
    text += ", " + std::string(name_of(static_cast<reduce_op>(s.extra)));
  } else if (text.starts_with("broadcast")) {
    text += ", root=" + std::to_string(s.extra);
  }
  return text + ")";
}

/// Empty when every rank's signature (`sigs[r]` of rank r) is the same; else which ranks called what:
/// "ranks 0, 1 called all_gather(count=1000, fp32); rank 2 called all_gather(count=500, fp32)".
[[nodiscard]] inline std::string mismatched_calls(std::span<const op_signature> sigs) {
  std::map<std::string, std::string> ranks_of; // description -> "0, 1"
  for (std::size_t r = 0; r < sigs.size(); ++r) {
    auto& ranks = ranks_of[describe(sigs[r])];
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  std::string calls;
  if (ranks_of.size() > 1) {
    for (const auto& [what, ranks] : ranks_of) {
      calls += (calls.empty() ? "" : "; ") + std::string(ranks.find(',') == std::string::npos ? "rank " : "ranks ") +
               ranks + " called " + what;
    }
  }
  return calls;
}
} // namespace detail

} // namespace zero
