/// \file
/// One rank of a 2-process NCCL group started the way torchrun starts it (`env`: RANK, WORLD_SIZE,
/// LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or by mpirun (`mpi`). Each rank all-reduces rank+1 and checks the
/// sum; exit 0 when right, 1 with a message otherwise.
#include "zero/comm/nccl_communicator.hpp"
#ifdef ZERO_PROBE_MPI
#include "zero/comm/nccl_mpi.hpp"
#endif

#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

int main(int argc, char** argv) {
  const bool use_mpi = argc > 1 && std::strcmp(argv[1], "mpi") == 0;
  try {
    auto run = [](zero::nccl_communicator comm) {
      float* d = nullptr;
      cudaMalloc(reinterpret_cast<void**>(&d), 1024 * sizeof(float));
      std::vector<float> h(1024, static_cast<float>(comm.rank() + 1));
      cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
      comm.all_reduce(d, d, h.size(), zero::reduce_op::sum).wait();
      cudaMemcpy(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost);
      cudaFree(d);
      const float want = static_cast<float>(comm.size() * (comm.size() + 1) / 2);
      if (h.front() != want || h.back() != want) {
        std::fprintf(stderr, "rank %d: all_reduce gave %g, expected %g\n", comm.rank(), h.front(), want);
        return 1;
      }
      std::printf("rank %d of %d on device %d: all_reduce %g ok\n", comm.rank(), comm.size(), comm.device(), want);
      return 0;
    };
    if (use_mpi) {
#ifdef ZERO_PROBE_MPI
      MPI_Init(&argc, &argv);
      int rc = run(zero::nccl_from_mpi(MPI_COMM_WORLD, zero::mpi_local_rank(MPI_COMM_WORLD)));
      MPI_Finalize();
      return rc;
#else
      std::fprintf(stderr, "built without MPI\n");
      return 1;
#endif
    }
    return run(zero::nccl_communicator::from_env());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
