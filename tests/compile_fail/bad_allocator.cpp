// A type with allocate but no deallocate or accessibility, used as the allocator of a buffer.
#include "zero/memory/buffer.hpp"

#include <cstddef>

struct leaky {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
};

int main() {
  zero::buffer<float, leaky> b;
  return b.empty() ? 0 : 1;
}
