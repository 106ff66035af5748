#pragma once
/// \file
/// `tensor_view`: what the engine hands a framework for a parameter or its gradient — a pointer,
/// a dtype and a shape. The engine owns the memory; the view is valid until the engine says
/// otherwise (for stage 3 parameters: while their module is gathered).

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

} // namespace zero
