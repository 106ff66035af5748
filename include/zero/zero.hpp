#pragma once
/// \file
/// The umbrella header of zero: everything that needs no optional dependency. The MPI, NCCL and
/// CUDA parts have headers of their own (`zero/comm/mpi_communicator.hpp`, ...) and targets of
/// their own (`zero::mpi`, `zero::nccl`, `zero::cuda`); `uring_storage` comes along only where the
/// target links `zero::uring` (which defines ZERO_HAS_URING).

#include "zero/backend/adamw_args.hpp"
#include "zero/backend/backend.hpp"
#include "zero/backend/cpu_backend.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/comm/pipeline_schedule.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/comm/topology.hpp"
#include "zero/config/config.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/engine.hpp"
#include "zero/engine/parallel_config.hpp"
#include "zero/engine/static_engine.hpp"
#include "zero/memory/allocator.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/memory/failing_allocator.hpp"
#include "zero/memory/host_allocator.hpp"
#include "zero/optim/loss_scaler.hpp"
#include "zero/optim/lr_schedule.hpp"
#include "zero/storage/failing_storage.hpp"
#include "zero/storage/posix_storage.hpp"
#include "zero/storage/storage.hpp"

#if defined(ZERO_HAS_URING)
#include "zero/storage/uring_storage.hpp"
#endif
