// A communicator that can only barrier, handed to code that needs all_reduce: the user gets the
// sentence from zero::require_all_reduce, not a page of template noise.
#include "zero/comm/communicator.hpp"

#include <chrono>
#include <string_view>

struct barrier_only {
  struct handle {
    void wait() {}
  };
  int rank() const { return 0; }
  int size() const { return 1; }
  std::string_view name() const { return "barrier_only"; }
  std::chrono::milliseconds timeout() const { return zero::default_comm_timeout; }
  void set_timeout(std::chrono::milliseconds) {}
  handle barrier() { return {}; }
};
static_assert(zero::can_barrier<barrier_only>);

int main() {
  zero::require_all_reduce<barrier_only>();
  return 0;
}
