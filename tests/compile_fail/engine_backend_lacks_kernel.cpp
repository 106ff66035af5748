// An engine over a backend without one kernel (scale): the user reads check_backend's sentence
// naming the kernel and its signature, not a template constraint failure.
#include "zero/backend/cpu_backend.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/engine/engine.hpp"

// Everything of cpu_backend but `scale`: the wrapper forwards the rest.
struct no_scale {
  using stream_type = zero::cpu_backend::stream_type;
  using event_type = zero::cpu_backend::event_type;
  using allocator_type = zero::cpu_backend::allocator_type;
  zero::cpu_backend inner;
  [[nodiscard]] std::string_view name() const { return "no_scale"; }
  [[nodiscard]] allocator_type get_allocator() const { return inner.get_allocator(); }
  [[nodiscard]] stream_type make_stream() { return inner.make_stream(); }
  [[nodiscard]] event_type make_event() { return inner.make_event(); }
  template <class... A> auto record(A&&... a) { return inner.record(a...); }
  template <class... A> auto wait(A&&... a) { return inner.wait(a...); }
  template <class... A> auto synchronize(A&&... a) { return inner.synchronize(a...); }
  template <class... A> auto read_scalar(A&&... a) { return inner.read_scalar(a...); }
  template <class... A> auto adamw_step(A&&... a) { return inner.adamw_step(a...); }
  template <class... A> auto cast(A&&... a) { return inner.cast(a...); }
  template <class... A> auto unscale_and_check(A&&... a) { return inner.unscale_and_check(a...); }
  template <class T> [[nodiscard]] std::size_t squared_norm_workspace_bytes(std::size_t n) const {
    return inner.template squared_norm_workspace_bytes<T>(n);
  }
  template <class... A> auto squared_norm(A&&... a) { return inner.squared_norm(a...); }
  template <class... A> auto fill(A&&... a) { return inner.fill(a...); }
  template <class... A> auto accumulate(A&&... a) { return inner.accumulate(a...); }
};

int main() {
  using engine = zero::basic_engine<no_scale, zero::thread_communicator>;
  return sizeof(engine) > 0 ? 0 : 1;
}
