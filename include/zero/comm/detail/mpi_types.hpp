#pragma once
/// \file
/// What `mpi_communicator` maps zero's element types and reductions to: MPI datatypes (committed ones for
/// f16 and bf16), user-defined ops for half types, the division that completes `reduce_op::avg`, and the
/// overlap test of buffers. Internal to `mpi_communicator`.

#include "zero/comm/communicator.hpp"
#include "zero/comm/mpi_check.hpp"
#include "zero/core/dtype.hpp"

#include <cstddef>
#include <cstdint>
#include <mpi.h>
#include <type_traits>

namespace zero::detail {

template <class T> inline constexpr bool always_false_v = false;

/// Commits a 2-byte datatype named `name` for f16 or bf16 storage.
inline MPI_Datatype make_half_datatype(const char* name) {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  ZERO_CHECK_MPI(MPI_Type_contiguous(1, MPI_UINT16_T, &type));
  ZERO_CHECK_MPI(MPI_Type_set_name(type, name));
  ZERO_CHECK_MPI(MPI_Type_commit(&type));
  return type;
}

/// The MPI datatype of an element type. f16 and bf16 get their own committed datatypes, created
/// on first use and never freed: they must stay valid until `MPI_Finalize`, which reclaims them
/// (freeing them from a static destructor would run after `MPI_Finalize`, which is erroneous).
template <class T> [[nodiscard]] MPI_Datatype mpi_datatype() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    return MPI_FLOAT;
  } else if constexpr (std::is_same_v<U, double>) {
    return MPI_DOUBLE;
  } else if constexpr (std::is_same_v<U, std::int32_t>) {
    return MPI_INT32_T;
  } else if constexpr (std::is_same_v<U, std::int64_t>) {
    return MPI_INT64_T;
  } else if constexpr (std::is_same_v<U, std::uint8_t>) {
    return MPI_UINT8_T;
  } else if constexpr (std::is_same_v<U, f16>) {
    static const MPI_Datatype type = make_half_datatype("zero_f16");
    return type;
  } else if constexpr (std::is_same_v<U, bf16>) {
    static const MPI_Datatype type = make_half_datatype("zero_bf16");
    return type;
  } else {
    static_assert(always_false_v<U>, "mpi_communicator has no MPI datatype for this element type; use float, double, "
                                     "zero::f16, zero::bf16, int32_t, int64_t or uint8_t");
  }
}

/// `MPI_User_function` for f16/bf16: inout[i] = in[i] (+ or max) inout[i], computed in float and
/// rounded once per step to nearest even, as NCCL does for half types. Max propagates NaN.
template <class T, bool Max> void half_reduce(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *length; ++i) {
    const float x = to_float(a[i]);
    const float y = to_float(b[i]);
    if constexpr (Max) {
      b[i] = (x > y || x != x) ? a[i] : b[i];
    } else {
      b[i] = from_float<T>(x + y);
    }
  }
}

/// The commutative user-defined op for f16/bf16 sum or max, created once and never freed (as
/// the datatypes above).
template <class T, bool Max> [[nodiscard]] MPI_Op half_op() {
  static const MPI_Op op = [] {
    MPI_Op created = MPI_OP_NULL;
    ZERO_CHECK_MPI(MPI_Op_create(&half_reduce<T, Max>, 1, &created));
    return created;
  }();
  return op;
}

/// The MPI op that computes `op` on `T`; avg sums here and divides when the operation completes.
template <class T> [[nodiscard]] MPI_Op mpi_reduce_op(reduce_op op) {
  const bool max = op == reduce_op::max;
  if constexpr (is_half_v<std::remove_cv_t<T>>) {
    return max ? half_op<std::remove_cv_t<T>, true>() : half_op<std::remove_cv_t<T>, false>();
  } else {
    return max ? MPI_MAX : MPI_SUM;
  }
}

/// Divides `count` elements of `T` at `data` by `size`: the second half of avg. Halves divide in
/// float and round once; integers truncate toward zero.
template <class T> void divide_by_size(void* data, std::size_t count, int size) noexcept {
  T* p = static_cast<T*>(data);
  for (std::size_t i = 0; i < count; ++i) {
    if constexpr (is_half_v<T>) {
      p[i] = from_float<T>(to_float(p[i]) / static_cast<float>(size));
    } else {
      p[i] = static_cast<T>(p[i] / static_cast<T>(size));
    }
  }
}

/// True when the byte ranges [a, a+a_bytes) and [b, b+b_bytes) share a byte.
[[nodiscard]] inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes;
}

} // namespace zero::detail
