// A framework's backend written against zero 0.1, which included adamw_args.hpp from optim/: it still compiles
// against 0.2 through the forwarding header, and the compiler says where the header went (tests/compat/check.cmake).
#include <zero/optim/adamw_args.hpp>

int main() {
  zero::adamw_step_args args;
  args.set_step(1);
  return args.bias_correction1 > 0.09f && args.bias_correction1 < 0.11f ? 0 : 1;
}
