#pragma once
// Counts calls of the global operator new in this test program (alloc_counter.cpp replaces it),
// to prove that a kernel allocates nothing.
#include <cstddef>

namespace zero::testing {
/// Global operator new calls so far, from any thread.
std::size_t allocations() noexcept;
} // namespace zero::testing
