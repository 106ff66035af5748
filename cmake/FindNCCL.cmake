# FindNCCL: NCCL_INCLUDE_DIR, NCCL_LIBRARY and the imported target NCCL::NCCL.
# Looks beside the CUDA toolkit, in the system paths and under $NCCL_HOME / $NCCL_ROOT.
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS $ENV{NCCL_HOME} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl
  HINTS $ENV{NCCL_HOME} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu targets/x86_64-linux/lib)
include(${CMAKE_CURRENT_LIST_DIR}/ZeroImportedLibrary.cmake)
zero_imported_library(NCCL)
