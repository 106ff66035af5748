# Starts two ranks of zero_nccl_env_probe and fails unless both report success: by default the way
# torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), with -DTORCHRUN=<torchrun>
# under torchrun itself, with -DMPIEXEC=<mpiexec> under mpirun. Exit 77 (skipped) with fewer than 2 GPUs.
execute_process(COMMAND nvidia-smi -L OUTPUT_VARIABLE gpus RESULT_VARIABLE smi)
string(REGEX MATCHALL "GPU [0-9]+:" found "${gpus}")
list(LENGTH found count)
if(NOT smi EQUAL 0 OR count LESS 2)
  message("fewer than 2 GPUs (${count}): the 2-process rendezvous is not run")
  cmake_language(EXIT 77)
endif()
if(TORCHRUN OR MPIEXEC)
  if(TORCHRUN)
    set(launch ${TORCHRUN} --standalone --nproc_per_node=2 --no-python ${PROBE})
  else()
    set(launch ${MPIEXEC} --oversubscribe -np 2 ${PROBE} mpi)
  endif()
  execute_process(COMMAND ${launch} RESULT_VARIABLE result TIMEOUT 100)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${launch}: exited with ${result}")
  endif()
  return()
endif()
string(RANDOM LENGTH 4 ALPHABET 0123456789 suffix)
math(EXPR port "20000 + ${suffix} % 9000")
# execute_process runs the commands of one call concurrently (as a pipeline); the probes write nothing to
# stdin, so the pipe only starts them together.
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=${port} ${PROBE}
  COMMAND ${CMAKE_COMMAND} -E env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=${port} ${PROBE}
  RESULTS_VARIABLE results OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message("${out}${err}")
if(NOT results STREQUAL "0;0")
  message(FATAL_ERROR "the two ranks exited with ${results}")
endif()
