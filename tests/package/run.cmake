# Installs this build, and a CPU-only configuration of zero's source that was never built (installing must
# not need the tools built first), then configures, builds and runs separate consumer projects
# (consumer/) against them:
#   core:       find_package(zero) with no components while CUDA, NCCL, MPI, liburing and libxxhash are
#               hidden from CMake: zero::zero needs none of them, whatever this build was built with; also
#               a framework's own policies (consumer/policies.cpp), with GCC 12 and Clang 14;
#   components: every component this build has (COMPONENTS=mpi^^checkpoint...), zero::checkpoint hashing;
#   missing:    the CPU-only installation asked for checkpoint: configuration fails and says why;
#   optional:   the same as an optional component: zero_checkpoint_FOUND false, zero::zero fine.
set(zero_source ${SOURCE_DIR}/../..)
string(REPLACE "^^" ";" COMPONENTS "${COMPONENTS}")
file(REMOVE_RECURSE ${WORK_DIR})

# run(<what> <command>...): runs a command, fails the test naming <what> when it fails; its output is kept
# in run_output.
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed:\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

# consumer(<name> <prefix> [FAIL <regex>] [BUILD] [ARGS <cmake -D args>...]): configures consumer/ against
# <prefix>; FAIL expects configuration to fail with a message matching <regex>; BUILD builds and runs it.
function(consumer name prefix)
  cmake_parse_arguments(C "BUILD" "FAIL" "ARGS" ${ARGN})
  set(dir ${WORK_DIR}/${name})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/consumer -B ${dir} -G ${GENERATOR}
                          -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix} ${C_ARGS}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(C_FAIL)
    string(REGEX REPLACE "[ \n]+" " " flat "${out}") # CMake wraps the reason's lines
    if(rc EQUAL 0 OR NOT flat MATCHES "${C_FAIL}")
      message(FATAL_ERROR "consumer ${name}: expected configuration to fail with \"${C_FAIL}\", got:\n${out}")
    endif()
    message(STATUS "consumer ${name}: configuration failed as expected")
    return()
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer ${name}: configuring against the installed zero failed:\n${out}")
  endif()
  set(consumer_output "${out}" PARENT_SCOPE)
  if(C_BUILD)
    run("consumer ${name}: building against the installed zero" ${CMAKE_COMMAND} --build ${dir} --parallel 1)
    execute_process(COMMAND ${dir}/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT rc EQUAL 0 OR NOT out MATCHES "consumer ok")
      message(FATAL_ERROR "consumer ${name}: the program built against the installed zero failed:\n${out}")
    endif()
    if(EXISTS ${dir}/policies)
      execute_process(COMMAND ${dir}/policies RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
      if(NOT rc EQUAL 0 OR NOT out MATCHES "policies ok")
        message(FATAL_ERROR "consumer ${name}: the framework's own policies failed against the installed zero:\n${out}")
      endif()
    endif()
  endif()
  message(STATUS "consumer ${name}: ok")
endfunction()

run("installing ${BUILD_DIR}" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/full)
set(hidden)
foreach(package CUDAToolkit NCCL MPI Uring Xxhash)
  list(APPEND hidden -DCMAKE_DISABLE_FIND_PACKAGE_${package}=ON)
endforeach()
consumer(core ${WORK_DIR}/full BUILD ARGS ${hidden})
# The same consumer with Debian 12's other compiler (GCC 12 or Clang 14), where installed.
get_filename_component(this_cxx ${CXX} REALPATH)
foreach(compiler g++-12 clang++-14)
  find_program(other_cxx_${compiler} ${compiler})
  get_filename_component(other_real ${other_cxx_${compiler}} REALPATH)
  if(other_cxx_${compiler} AND NOT other_real STREQUAL this_cxx)
    consumer(core-${compiler} ${WORK_DIR}/full BUILD ARGS ${hidden} -DCMAKE_CXX_COMPILER=${other_cxx_${compiler}})
  endif()
endforeach()
if(COMPONENTS)
  string(REPLACE ";" "\\;" list "${COMPONENTS}")
  consumer(components ${WORK_DIR}/full BUILD ARGS "-DZERO_COMPONENTS=${list}")
endif()

run("configuring a CPU-only zero" ${CMAKE_COMMAND} -S ${zero_source} -B ${WORK_DIR}/cpu-build -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} -DZERO_BUILD_TESTS=OFF -DZERO_BUILD_BENCH=OFF -DZERO_BUILD_EXAMPLES=OFF
    -DZERO_BUILD_TOOLS=ON -DZERO_WITH_CUDA=OFF -DZERO_WITH_MPI=OFF -DZERO_WITH_URING=OFF -DZERO_WITH_CHECKPOINT=OFF)
run("installing the CPU-only zero, its tools not built" ${CMAKE_COMMAND} --install ${WORK_DIR}/cpu-build
    --prefix ${WORK_DIR}/cpu)
consumer(missing ${WORK_DIR}/cpu ARGS -DZERO_COMPONENTS=checkpoint
         FAIL "component checkpoint: this installation of zero was built without it \\(ZERO_WITH_CHECKPOINT")
consumer(unknown ${WORK_DIR}/cpu ARGS -DZERO_COMPONENTS=ckpt
         FAIL "component ckpt: no such component; zero's components are mpi, uring, checkpoint, cuda, nccl")
consumer(optional ${WORK_DIR}/cpu ARGS -DZERO_OPTIONAL_COMPONENTS=checkpoint)
if(NOT consumer_output MATCHES "consumer: zero_checkpoint_FOUND=FALSE this installation of zero was built without it")
  message(FATAL_ERROR "consumer optional: zero_checkpoint_FOUND and its reason not as expected:\n${consumer_output}")
endif()
