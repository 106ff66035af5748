// The backend concept: cpu_backend satisfies it; types that miss a part are told apart by the
// capability concepts. (The compile-fail target in compile_fail/ shows what a user reads.)
#include "zero/backend/backend.hpp"
#include "zero/backend/cpu_backend.hpp"
#include "zero/memory/host_allocator.hpp"

#include <cstddef>
#include <doctest/doctest.h>
#include <string_view>

namespace {

// Everything but the kernels.
struct base_only {
  struct stream_type {};
  struct event_type {};
  using allocator_type = zero::host_allocator;
  std::string_view name() const { return "base_only"; }
  allocator_type get_allocator() const { return {}; }
  stream_type make_stream() { return {}; }
  event_type make_event() { return {}; }
  void record(event_type&, const stream_type&) {}
  void wait(const stream_type&, const event_type&) {}
  void synchronize(const stream_type&) {}
  void synchronize(const event_type&) {}
  template <class T> T read_scalar(const T* p, const stream_type&) { return *p; }
};

// A backend with every kernel except adamw_step.
struct no_adamw : base_only {
  template <zero::backend_float S, zero::backend_float D> void cast(const S*, D*, std::size_t, const stream_type&) {}
  template <zero::backend_float T> void unscale_and_check(T*, std::size_t, float, int*, const stream_type&) {}
  template <zero::backend_float T> std::size_t squared_norm_workspace_bytes(std::size_t) const { return 0; }
  template <zero::backend_float T>
  void squared_norm(const T*, std::size_t, float*, void*, std::size_t, const stream_type&) {}
  template <class T> void fill(T*, std::size_t, T, const stream_type&) {}
  template <zero::backend_float S, zero::backend_float D>
  void accumulate(const S*, D*, std::size_t, const stream_type&) {}
  template <zero::backend_float T> void scale(T*, std::size_t, float, const stream_type&) {}
};

// ... and one that has it, but only for fp32 gradients: not enough.
struct fp32_adamw_only : no_adamw {
  template <zero::backend_float P>
  void adamw_step(float*, float*, float*, const float*, P*, std::size_t, const zero::adamw_step_args&,
                  const stream_type&) {}
};

struct complete : no_adamw {
  template <zero::backend_float G, zero::backend_float P>
  void adamw_step(float*, float*, float*, const G*, P*, std::size_t, const zero::adamw_step_args&, const stream_type&) {
  }
};

// An allocator_type that is not an allocator.
struct bad_allocator : complete {
  using allocator_type = int;
};

} // namespace

TEST_CASE("cpu_backend satisfies zero::backend and every capability concept") {
  static_assert(zero::backend<zero::cpu_backend>);
  static_assert(zero::backend_base<zero::cpu_backend>);
  static_assert(zero::can_adamw_step<zero::cpu_backend>);
  static_assert(zero::can_cast<zero::cpu_backend>);
  static_assert(zero::can_unscale_and_check<zero::cpu_backend>);
  static_assert(zero::can_squared_norm<zero::cpu_backend>);
  static_assert(zero::can_fill<zero::cpu_backend>);
  static_assert(zero::can_accumulate<zero::cpu_backend>);
  static_assert(zero::can_scale<zero::cpu_backend>);
  static_assert(zero::check_backend<zero::cpu_backend>());
  static_assert(std::is_same_v<zero::cpu_backend::allocator_type, zero::host_allocator>);
  static_assert(zero::host_allocator_policy<zero::cpu_backend::allocator_type>);
  CHECK(zero::cpu_backend{{.threads = 1}}.name() == "cpu");
}

TEST_CASE("the capability concepts tell which part is missing") {
  static_assert(zero::backend_base<base_only>);
  static_assert(!zero::can_cast<base_only>);
  static_assert(!zero::backend<base_only>);

  static_assert(zero::backend_base<no_adamw>);
  static_assert(zero::can_cast<no_adamw> && zero::can_unscale_and_check<no_adamw> && zero::can_squared_norm<no_adamw> &&
                zero::can_fill<no_adamw> && zero::can_accumulate<no_adamw> && zero::can_scale<no_adamw>);
  static_assert(!zero::can_adamw_step<no_adamw>);
  static_assert(!zero::backend<no_adamw>);

  static_assert(!zero::can_adamw_step<fp32_adamw_only>, "bf16/f16 gradients are required too");
  static_assert(zero::backend<complete>);
  static_assert(zero::check_backend<complete>());

  static_assert(!zero::backend_base<bad_allocator>);
  static_assert(!zero::backend_base<int>);
  CHECK(true);
}

TEST_CASE("cpu streams and events keep the shape of an asynchronous backend") {
  zero::cpu_backend b({.threads = 1});
  auto s = b.make_stream();
  auto e = b.make_event();
  b.record(e, s);
  b.wait(s, e);
  b.synchronize(s);
  b.synchronize(e);
  int flag = 0;
  b.fill(&flag, 1, 1, s);
  CHECK(b.read_scalar(&flag, s) == 1);
  float value = 0.0f;
  b.fill(&value, 1, 2.5f, s);
  CHECK(b.read_scalar(&value, s) == 2.5f);
  CHECK_THROWS_AS((void)b.read_scalar(static_cast<const int*>(nullptr), s), zero::usage_error);
  auto alloc = b.get_allocator();
  void* p = alloc.allocate(64, 64);
  alloc.deallocate(p, 64, 64);
}
