/// \file
/// doctest's main for zero's CUDA tests. Suites: "kernels", "allocators", "check"; each is one CTest test.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
