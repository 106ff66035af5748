#pragma once
/// \file
/// Runtime dtype to compile-time type: `visit_float(dtype, f)` calls `f(type_tag<T>{})` with T the
/// C++ type of a floating dtype (float, f16, bf16), so code that holds buffers of a dtype chosen in
/// a config can call typed kernels.

#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <string>

namespace zero {

/// Carries a type as a value.
template <class T> struct type_tag { using type = T; };

/// Calls `f(type_tag<T>{})` for the floating dtype `t`.
/// \throws usage_error for a dtype that is not fp32, fp16 or bf16.
template <class F> decltype(auto) visit_float(dtype t, F&& f) {
  switch (t) {
  case dtype::f32:
    return f(type_tag<float>{});
  case dtype::f16:
    return f(type_tag<f16>{});
  case dtype::bf16:
    return f(type_tag<bf16>{});
  default:
    break;
  }
  throw usage_error("expected a floating dtype (fp32, fp16, bf16), got " + std::string(name_of(t)));
}

} // namespace zero
