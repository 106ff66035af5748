// A framework's backend that replaces cpu_backend's adamw_step for fp32 gradients and parameters the
// wrong way: its one adamw_step hides all of the library's (the kernels are member templates, and a
// name declared in a derived class hides the base's), so it has none for bf16 or f16 gradients. The
// user must read check_backend's sentence, "zero::backend: this type has no usable adamw_step". The
// supported way adds `using zero::cpu_backend::adamw_step;` (cpu_backend.hpp, "Replacing one kernel").
#include "zero/backend/cpu_backend.hpp"

#include <cstddef>

struct my_backend : zero::cpu_backend {
  using zero::cpu_backend::cpu_backend;
  void adamw_step(float*, float*, float*, const float*, float*, std::size_t, const zero::adamw_step_args&,
                  const stream_type&) {}
};

static_assert(zero::check_backend<my_backend>());

int main() { return 0; }
