#pragma once
// file_size_limit: lowers the process's file size limit for a test, so that a write past it fails
// with EFBIG as a full disk fails a write, even for root (the checkpoint and storage tests).

#include <csignal>
#include <doctest/doctest.h>
#include <sys/resource.h>

namespace zero_test {

/// Lowers this process's file size limit (RLIMIT_FSIZE) to `bytes` while it lives, with SIGXFSZ
/// ignored, so that a write past it fails with EFBIG (a write across it is short).
class file_size_limit {
public:
  explicit file_size_limit(rlim_t bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_) == 0);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lower = old_;
    lower.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lower) == 0);
  }
  file_size_limit(const file_size_limit&) = delete;
  file_size_limit& operator=(const file_size_limit&) = delete;
  ~file_size_limit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }

private:
  rlimit old_{};
  void (*old_handler_)(int) = nullptr;
};

} // namespace zero_test
