// A user's program built against an installed zero: two ranks all-reduce through the umbrella header.
#include <cstdio>
#include <zero/zero.hpp>
#if ZERO_HAS_CHECKPOINT
#include <zero/checkpoint/checkpoint.hpp>
#endif

int main() {
  float result = 0;
  zero::run_ranks(2, [&](zero::thread_communicator& c) {
    float v = static_cast<float>(c.rank() + 1);
    c.all_reduce(&v, &v, 1, zero::reduce_op::sum).wait();
    if (c.rank() == 0) {
      result = v;
    }
  });
  if (result != 3.0f) {
    std::printf("consumer wrong: %g\n", static_cast<double>(result));
    return 1;
  }
#if ZERO_HAS_CHECKPOINT
  // zero::checkpoint links libxxhash: hash a string through it.
  if (zero::checkpoint::detail::xxh64_of("") != 0xef46db3751d8e999ull) {
    std::printf("consumer wrong: xxh64 of the empty string\n");
    return 1;
  }
#endif
  std::printf("consumer ok\n");
  return 0;
}
