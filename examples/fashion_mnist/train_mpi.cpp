// fmnist::train over one process per rank (mpirun -np N zero-fashion-mnist), when zero::mpi is built.

#if ZERO_HAS_MPI
#include <zero/comm/mpi_communicator.hpp>

#include "train_impl.hpp"

template fmnist::outcome fmnist::train<zero::mpi_communicator>(zero::mpi_communicator&, const nlohmann::json&,
                                                               const options&, const dataset&, const dataset&);
#endif
