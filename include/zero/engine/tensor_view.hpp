#pragma once
/// \file
/// `tensor_view`: what the engine hands a framework for a parameter or its gradient — a pointer,
/// a dtype and a shape. The engine owns the memory; the view is valid until the engine says
/// otherwise (for stage 3 parameters: while their module is gathered).

#include "zero/core/dispatch.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace zero {

/// A non-owning view of a tensor in engine memory (host or device, as the backend's allocator says).
struct tensor_view {
  void* data = nullptr;
  dtype type = dtype::f32;
  std::span<const std::int64_t> shape;
  std::size_t numel = 0;

  /// The data as `T*`. \throws usage_error when T is not the view's dtype.
  template <class T> [[nodiscard]] T* as() const {
    if (dtype_v<T> != type) {
      throw usage_error("tensor_view::as<" + std::string(name_of(dtype_v<T>)) + ">() on a tensor of dtype " +
                        std::string(name_of(type)));
    }
    return static_cast<T*>(data);
  }
  /// Bytes of the tensor.
  [[nodiscard]] std::size_t bytes() const noexcept { return numel * size_of(type); }
};

/// For a framework that computes in fp32 over 16-bit model state held in host memory: the view's
/// values converted into `out` (`numel` floats). \throws usage_error when `out` is too small.
inline void copy_to_floats(const tensor_view& v, std::span<float> out) {
  if (out.size() < v.numel) {
    throw usage_error("copy_to_floats: " + std::to_string(out.size()) + " floats for a tensor of " +
                      std::to_string(v.numel));
  }
  visit_float(v.type, [&]<class T>(type_tag<T>) {
    const T* src = static_cast<const T*>(v.data);
    for (std::size_t i = 0; i < v.numel; ++i) {
      out[i] = to_float(src[i]);
    }
  });
}

/// Adds `in` (`numel` fp32 values) into the view's tensor in its own dtype, each sum rounded once:
/// how an fp32 gradient reaches a 16-bit gradient buffer. \throws usage_error when `in` is too small.
inline void add_floats(const tensor_view& v, std::span<const float> in) {
  if (in.size() < v.numel) {
    throw usage_error("add_floats: " + std::to_string(in.size()) + " floats for a tensor of " +
                      std::to_string(v.numel));
  }
  visit_float(v.type, [&]<class T>(type_tag<T>) {
    T* dst = static_cast<T*>(v.data);
    for (std::size_t i = 0; i < v.numel; ++i) {
      dst[i] = from_float<T>(to_float(dst[i]) + in[i]);
    }
  });
}

} // namespace zero
