// fmnist::train over in-process ranks (zero-fashion-mnist --ranks N).

#include <zero/comm/thread_communicator.hpp>

#include "train_impl.hpp"

template fmnist::outcome fmnist::train<zero::thread_communicator>(zero::thread_communicator&, const nlohmann::json&,
                                                                  const options&, const dataset&, const dataset&);
