// A stage-2 engine fixed at compile time over a communicator that can only all-reduce: compilation
// stops with the sentence naming the first operation stage 2 needs (all_gather), not template noise.
#include "../support/all_reduce_only.hpp"
#include "zero/backend/cpu_backend.hpp"
#include "zero/engine/static_engine.hpp"

int main() {
  zero::thread_communicator* none = nullptr;
  (void)none;
  using engine = zero::static_engine<2, zero::cpu_backend, zero::testing::all_reduce_only>;
  return sizeof(engine) > 0 ? 0 : 1;
}
