// zero-parallel-3d's runs over one process per rank (mpirun -np 8 zero-parallel-3d), compiled beside
// main.cpp.

#if ZERO_HAS_MPI
#include "parallel_rank.hpp"
#include "reference.hpp"

#include <zero/comm/mpi_communicator.hpp>

template p3d::reference p3d::train_reference<zero::mpi_communicator>(zero::mpi_communicator&, int, int);
template p3d::rank_outcome p3d::train_parallel<zero::mpi_communicator>(zero::mpi_communicator&,
                                                                       const p3d::factorization&, int, int,
                                                                       const p3d::reference&);
#endif
