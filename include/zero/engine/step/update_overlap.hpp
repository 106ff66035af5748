#pragma once
/// \file
/// `update_overlap`: the optimizer step on a stream of its own, beside the framework's next forward.
///
/// At every stage the engine does not wait for the optimizer: it steps segment by segment on the
/// update stream, in the order the next forward reads the segments, and after each segment's update
/// lets the parameter residency act on it (stages 1-2 on several ranks: post the all-gather of the
/// segment's group; stage 0, one rank and stage 3: record the point the next gather of that segment
/// must wait for). The framework's forward, on the engine's stream, waits per module for exactly
/// the segments it reads. Same kernels, same arguments and the same per-element order as stepping
/// everything at once: the result is the same bits.
///
/// The gradients are zeroed on the update stream too, behind the update that reads them; `join`
/// orders the engine's stream after all of it, once, at the next use of gradients or state.

#include "zero/backend/backend.hpp"
#include "zero/comm/communicator.hpp"

#include <cstddef>

namespace zero {

/// The update stream, its two events and whether the engine's stream has joined it; see the file
/// comment.
template <class Backend, class Comm> class update_overlap {
  using stream_type = typename Backend::stream_type;

public:
  /// \param main the engine's stream (kept by reference): the update starts after its work so far.
  update_overlap(Backend& backend, Comm& comm, stream_type& main)
      : backend_(backend), comm_(comm), main_(main), stream_(backend.make_stream()), ready_(backend.make_event()),
        done_(backend.make_event()) {}

  update_overlap(const update_overlap&) = delete;
  update_overlap& operator=(const update_overlap&) = delete;

  /// Waits for the update stream when it still has work (its kernels use the engine's buffers);
  /// never throws.
  ~update_overlap() {
    if (pending_) {
      try {
        backend_.synchronize(stream_);
      } catch (...) { // NOLINT(bugprone-empty-catch): a destructor reports nothing
      }
    }
  }

  /// Runs `step(k, s)` then `after(k, s)` for each segment `k` in [0, segments) on the update stream
  /// `s`, which first waits for the engine's stream (the gradients are final there). Meanwhile a
  /// stream-ordered communicator is ordered after the update stream, so what `after` posts follows the
  /// segment's update; it is ordered after the engine's stream again on return, also on a throw.
  template <class Step, class After> void run(std::size_t segments, Step&& step, After&& after) {
    backend_.record(ready_, main_);
    backend_.wait(stream_, ready_);
    struct restore_order {
      update_overlap* u;
      ~restore_order() {
        if constexpr (stream_ordered<Comm, stream_type>) {
          u->comm_.set_compute_stream(u->main_.get());
        }
      }
    } restore{this};
    if constexpr (stream_ordered<Comm, stream_type>) {
      comm_.set_compute_stream(stream_.get());
    }
    for (std::size_t k = 0; k < segments; ++k) {
      step(k, static_cast<const stream_type&>(stream_));
      after(k, static_cast<const stream_type&>(stream_));
    }
  }

  /// Marks the end of the step's work on the update stream (after the gradients were zeroed there).
  void close() {
    backend_.record(done_, stream_);
    pending_ = true;
  }

  /// Orders the engine's stream after the update stream's last step, without blocking the host,
  /// once. \returns true when it did (the update had work the engine's stream had not joined).
  bool join() const {
    if (!pending_) {
      return false;
    }
    backend_.wait(main_, done_);
    pending_ = false;
    return true;
  }

  /// The update stream.
  [[nodiscard]] const stream_type& stream() const noexcept { return stream_; }

private:
  Backend& backend_;
  Comm& comm_;
  stream_type& main_;
  stream_type stream_;
  typename Backend::event_type ready_; // main_: the gradients are final
  typename Backend::event_type done_;  // stream_: the step and the gradient zeroing are done
  mutable bool pending_ = false;
};

} // namespace zero
