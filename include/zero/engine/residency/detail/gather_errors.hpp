#pragma once
/// \file
/// How stage 3's gathers (`param_coordinator`) name what they were gathering in the errors they throw.
///
/// Every rank must gather the same modules in the same order, as every rank must issue the same collectives. An error
/// of the communicator during a gather names the module (`naming`): a collective that differs across ranks (a
/// comm_error naming the operations) adds that ordering rule; a timeout (a rank that stopped, or never joined) does
/// not. A failed read of an offloaded shard's slice that fails its gather names the module too
/// (`rethrow_read_failure`). Each error keeps one id prefix, its native status and its echo mark.

#include "zero/core/error.hpp"

#include <exception>
#include <string>
#include <utility>

namespace zero::detail {

/// `e.what()` without its id prefix (`[zero.<id>] `), to be thrown again with more said after it.
template <class E> [[nodiscard]] std::string text_of(const E& e) {
  std::string text = e.what();
  const std::string prefix = "[zero." + e.id() + "] ";
  if (text.starts_with(prefix)) {
    text.erase(0, prefix.size());
  }
  return text;
}

/// Rethrows `e`, the communicator's error during the gather of `what` ("module \"fc1\""), naming
/// it: one id prefix (`e`'s), its status and echo mark kept. `ordering`: the collectives differed
/// across ranks, so the rule they broke is named; a timeout (a stopped or absent rank) gets no hint.
template <class E> [[noreturn]] void rethrow_naming(const E& e, const std::string& what, bool ordering) {
  E named(text_of(e) + "; while gathering " + what +
              (ordering ? ": every rank must gather the same modules in the same order" : ""),
          e.status());
  if (e.echo()) {
    named.mark_echo();
  }
  throw named;
}

/// Runs `f` (which starts or waits for a gather of `what`), naming `what` in the communicator's errors.
/// \throws timeout_error and comm_error as `rethrow_naming` makes them; whatever else `f` throws, as is.
template <class F> void naming(const std::string& what, F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const timeout_error& e) {
    rethrow_naming(e, what, false);
  } catch (const comm_error& e) {
    // Not an echo: this rank saw the collectives differ (an echo only says the group broke elsewhere).
    rethrow_naming(e, what, !e.echo());
  }
}

/// Rethrows `e`, the failed read of the slice a gather of `what` needed (its unit would hold zeros):
/// an io_error names `what` (its status kept) and says why no zeros are handed out; anything else as is.
[[noreturn]] inline void rethrow_read_failure(const std::exception_ptr& e, const std::string& what) {
  try {
    std::rethrow_exception(e);
  } catch (const io_error& failed) {
    throw io_error(text_of(failed) + "; while gathering " + what +
                       ": its parameters could not be read from NVMe, and zeros are not handed out in "
                       "their place (other ranks fail at their next collective, or time out)",
                   failed.status());
  }
}

} // namespace zero::detail
