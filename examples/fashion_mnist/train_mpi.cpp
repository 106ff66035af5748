// fmnist::train over one process per rank (mpirun -np N zero-fashion-mnist), compiled beside main.cpp.

#if ZERO_HAS_MPI
#include "train.hpp"

#include <zero/comm/mpi_communicator.hpp>

template fmnist::outcome fmnist::train<zero::mpi_communicator>(zero::mpi_communicator&, const nlohmann::json&,
                                                               const options&, const dataset&, const dataset&);
#endif
