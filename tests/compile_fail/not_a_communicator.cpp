// Something that is not a communicator at all (no rank/size) where one is required.
#include "zero/comm/communicator.hpp"

template <zero::communicator C> int world_of(const C& c) { return c.size(); }

struct not_a_comm {};

int main() { return world_of(not_a_comm{}); }
