#pragma once
/// \file
/// The traces of stage 3's gathers (`param_coordinator`): `detail::gather_pass`, the order of one pass's gathers
/// against its recorded trace, and `detail::gather_traces`, the passes the coordinator keeps.
///
/// The first step records the order in which modules are gathered; later steps replay it (the prefetch policy,
/// `residency/detail/prefetch_policy.hpp`, reads what comes next from it). When the order of a step differs from the
/// trace, prefetching stops for the rest of that step, a log line says where, and the trace is recorded again. A trace
/// is kept per schedule position, the micro-step's place in its accumulation (`begin_micro_step`): under a pipeline's
/// 1F1B schedule the micro-steps of an accumulation gather in different orders (the warm-up's forwards, the steady
/// state's forward-backward pairs, the cool-down's backwards), and each repeats at its position every step. A
/// position without a trace yet replays the last one recorded, as a guess that leaves no log line when it does not
/// match. Evaluation passes (forward only) keep a trace of their own and leave the training traces intact.

#include "zero/engine/gather_stats.hpp"

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace zero::detail {

/// One kind of pass's gather order (training, or evaluation): the recorded trace and this pass's order.
struct gather_pass {
  std::vector<int> trace;   // the recorded order
  std::vector<int> current; // this pass's order so far
  bool diverged = false;    // this pass left the trace
  bool borrowed = false;    // the trace is another schedule position's, a guess until this pass ends

  /// Records module `m`'s gather; on the first one that leaves the trace, counts a trace change and
  /// says where on `log` (with `names` of the modules; `kind` names the pass), unless the trace was
  /// `borrowed` (then prefetch just stops for the pass).
  void note(int m, gather_stats& stats, const std::vector<std::string>& names,
            const std::function<void(const std::string&)>& log, const std::string& kind) {
    const std::size_t pos = current.size();
    current.push_back(m);
    if (diverged || trace.empty() || (pos < trace.size() && trace[pos] == m)) {
      return;
    }
    diverged = true;
    if (borrowed) {
      return;
    }
    ++stats.trace_changes;
    if (log) {
      const std::string expected =
          pos < trace.size() ? "\"" + names[static_cast<std::size_t>(trace[pos])] + "\"" : "the end of the trace";
      log("[zero] stage 3: module order changed at gather #" + std::to_string(pos) + " (" + kind + "): expected " +
          expected + ", got \"" + names[static_cast<std::size_t>(m)] +
          "\"; prefetch is off for this pass and the trace will be recorded again");
    }
  }
  /// Ends the pass: its order becomes the trace when it differed, or there was none of its own.
  void finish(gather_stats& stats) {
    if (trace.empty() || diverged || borrowed || current.size() != trace.size()) {
      if (!trace.empty() && !diverged && !borrowed) {
        ++stats.trace_changes; // the pass ended early: fewer gathers than the trace
      }
      trace = current;
    }
    current.clear();
    diverged = false;
    borrowed = false;
  }
};

/// The passes of stage 3's gathers: one per training schedule position and one for evaluation, and which of
/// them is open (see the file comment). Counts go to the `gather_stats` each call is given.
class gather_traces {
public:
  /// The pass the gathers follow now: the evaluation pass while one is open, else the current position's.
  [[nodiscard]] gather_pass& current() noexcept { return in_eval_ ? eval_ : train_[position_]; }

  /// Records module `m`'s gather in the open pass (`gather_pass::note`; `names` and `log` for its log line).
  void note(int m, gather_stats& stats, const std::vector<std::string>& names,
            const std::function<void(const std::string&)>& log) {
    current().note(m, stats, names, log,
                   in_eval_ ? std::string("evaluation")
                            : "training, micro-step " + std::to_string(position_) + " of the accumulation");
  }

  /// The next training gathers belong to micro-step `position` of the accumulation: they follow, and
  /// record, that position's trace; one without a trace yet borrows the last one recorded.
  void begin_micro_step(std::size_t position) {
    if (position >= train_.size()) {
      train_.resize(position + 1);
    }
    position_ = position;
    auto& p = train_[position_];
    if (p.trace.empty() && !train_[last_recorded_].trace.empty()) {
      p.trace = train_[last_recorded_].trace;
      p.borrowed = true;
    }
  }
  /// Ends the training pass of the current position (`gather_pass::finish`, counting into `stats`).
  void end_micro_step(gather_stats& stats) {
    auto& p = train_[position_];
    p.finish(stats);
    if (!p.trace.empty()) {
      last_recorded_ = position_;
    }
  }

  /// Opens the evaluation pass: gathers follow, and record, the evaluation trace until `end_eval`.
  void begin_eval() noexcept { in_eval_ = true; }
  /// A gather of the open pass threw: an evaluation pass's order so far is not a trace to replay.
  void gather_failed() noexcept { eval_failed_ = in_eval_; }
  /// Closes the evaluation pass: its order becomes the evaluation trace (`gather_pass::finish`, counting
  /// into `stats`) when `record` and none of its gathers threw; otherwise the pass is dropped, the trace kept.
  void end_eval(gather_stats& stats, bool record) {
    if (!record || eval_failed_) {
      eval_.current.clear();
      eval_.diverged = false;
    } else {
      eval_.finish(stats);
    }
    eval_failed_ = false;
    in_eval_ = false;
  }
  /// True while an evaluation pass is open.
  [[nodiscard]] bool evaluating() const noexcept { return in_eval_; }

  /// The training trace of the current schedule position (module ids in gather order).
  [[nodiscard]] const std::vector<int>& trace() const noexcept { return train_[position_].trace; }
  /// The current schedule position, and the positions that have a pass so far.
  [[nodiscard]] std::size_t position() const noexcept { return position_; }
  [[nodiscard]] std::size_t positions() const noexcept { return train_.size(); }

private:
  std::vector<gather_pass> train_ = std::vector<gather_pass>(1); // one per schedule position
  gather_pass eval_;
  std::size_t position_ = 0;      // the schedule position of this micro-step
  std::size_t last_recorded_ = 0; // the position whose pass ended last with a trace
  bool in_eval_ = false;
  bool eval_failed_ = false; // a gather of this evaluation pass threw
};

} // namespace zero::detail
