#pragma once
/// \file
/// `step_log`: the engine's wall-clock phases (`wall_clock_breakdown`) and where its log lines go.

#include "zero/engine/engine_types.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

namespace zero {

/// Phase timings and the log sink of one engine.
class step_log {
public:
  /// Measures a phase until the returned timer goes out of scope: `{ auto t = log.time("step"); ... }`.
  [[nodiscard]] auto time(std::string name) {
    struct timer {
      step_timings* t;
      std::string name;
      std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
      timer(step_timings* timings, std::string n) : t(timings), name(std::move(n)) {}
      timer(const timer&) = delete;
      timer& operator=(const timer&) = delete;
      ~timer() {
        const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start;
        t->seconds[name] += d.count();
        t->calls[name] += 1;
      }
    };
    return timer(&timings_, std::move(name));
  }
  /// The phases timed since the last print.
  [[nodiscard]] const step_timings& timings() const noexcept { return timings_; }
  /// Where log lines go; default: stdout on rank 0.
  void set_sink(std::function<void(const std::string&)> sink) { sink_ = std::move(sink); }
  /// The sink for a rank: the one set, else stdout on rank 0, else nothing (an empty function).
  [[nodiscard]] std::function<void(const std::string&)> sink_for(int rank) const {
    if (sink_ || rank != 0) {
      return sink_;
    }
    return [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  }
  /// Writes a line.
  void write(int rank, const std::string& line) const {
    if (auto s = sink_for(rank)) {
      s(line);
    }
  }

  /// Every `every` boundaries (steps_per_print with wall_clock_breakdown; 0 never): one line of the
  /// mean milliseconds per phase since the last line, then the timings start again.
  void print_if_due(std::int64_t every, std::int64_t boundaries, int rank, std::int64_t step) {
    if (every <= 0 || boundaries % every != 0) {
      return;
    }
    std::string line = "[zero] rank " + std::to_string(rank) + " step " + std::to_string(step) + " time (ms):";
    for (const auto& [name, s] : timings_.seconds) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s %.2f", name.c_str(), 1e3 * s / static_cast<double>(timings_.calls[name]));
      line += buf;
    }
    timings_ = {};
    write(rank, line);
  }

private:
  step_timings timings_;
  std::function<void(const std::string&)> sink_;
};

} // namespace zero
