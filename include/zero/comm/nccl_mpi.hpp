#pragma once
/// \file
/// `nccl_from_mpi`: an `nccl_communicator` over the processes of an MPI communicator, one GPU each.
/// Rank 0 makes NCCL's unique id and broadcasts it with MPI; ranks keep their MPI order. The multi-node
/// path: mpirun starts the processes, NCCL moves the data.

#include "zero/comm/mpi_check.hpp"
#include "zero/comm/mpi_communicator.hpp"
#include "zero/comm/nccl_communicator.hpp"

#include <mpi.h>
#include <string>

namespace zero {

/// Joins every process of `comm` into one NCCL group on CUDA device `device` of this process (e.g. the
/// node-local rank). Collective over `comm`.
/// \throws mpi_error when the broadcast fails; what `nccl_communicator`'s constructor throws.
[[nodiscard]] inline nccl_communicator nccl_from_mpi(MPI_Comm comm, int device, nccl_options opt = {}) {
  int rank = 0;
  int size = 0;
  ZERO_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  ZERO_CHECK_MPI(MPI_Comm_size(comm, &size));
  ncclUniqueId id{};
  if (rank == 0) {
    id = nccl_communicator::make_unique_id();
  }
  ZERO_CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
  return nccl_communicator(rank, size, id, device, std::move(opt));
}

/// The node-local rank of this process in `comm` (its rank among the processes sharing its node), the
/// usual choice of CUDA device. Collective over `comm`.
[[nodiscard]] inline int mpi_local_rank(MPI_Comm comm) {
  MPI_Comm node = MPI_COMM_NULL;
  ZERO_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local = 0;
  ZERO_CHECK_MPI(MPI_Comm_rank(node, &local));
  ZERO_CHECK_MPI(MPI_Comm_free(&node));
  return local;
}

} // namespace zero
