// A framework's backend that has every kernel but adamw_step, handed to code constrained on
// zero::backend. The user must read "zero::backend: this type has no usable adamw_step; a backend
// needs void adamw_step(...)" (from zero::check_backend), not only a page of unsatisfied constraints.
#include "zero/backend/backend.hpp"
#include "zero/memory/host_allocator.hpp"

#include <cstddef>
#include <string_view>

struct my_backend {
  struct stream_type {};
  struct event_type {};
  using allocator_type = zero::host_allocator;
  std::string_view name() const { return "mine"; }
  allocator_type get_allocator() const { return {}; }
  stream_type make_stream() { return {}; }
  event_type make_event() { return {}; }
  void record(event_type&, const stream_type&) {}
  void wait(const stream_type&, const event_type&) {}
  void synchronize(const stream_type&) {}
  void synchronize(const event_type&) {}
  template <class T> T read_scalar(const T* p, const stream_type&) { return *p; }
  template <zero::backend_float S, zero::backend_float D> void cast(const S*, D*, std::size_t, const stream_type&) {}
  template <zero::backend_float T> void unscale_and_check(T*, std::size_t, float, int*, const stream_type&) {}
  template <zero::backend_float T> std::size_t squared_norm_workspace_bytes(std::size_t) const { return 0; }
  template <zero::backend_float T>
  void squared_norm(const T*, std::size_t, float*, void*, std::size_t, const stream_type&) {}
  template <class T> void fill(T*, std::size_t, T, const stream_type&) {}
  template <zero::backend_float S, zero::backend_float D>
  void accumulate(const S*, D*, std::size_t, const stream_type&) {}
  template <zero::backend_float T> void scale(T*, std::size_t, float, const stream_type&) {}
  // no adamw_step
};

// What an engine does with its Backend parameter.
template <class Backend> struct my_engine { static_assert(zero::check_backend<Backend>()); };

// And a function constrained on the concept.
template <zero::backend B> void train_step(B&) {}

int main() {
  my_engine<my_backend> engine;
  (void)engine;
  my_backend b;
  train_step(b);
  return 0;
}
