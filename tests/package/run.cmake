# Installs this build into a fresh prefix, then configures, builds and runs a separate project
# that only does find_package(zero CONFIG REQUIRED).
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install of ${BUILD_DIR} failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/consumer -B ${WORK_DIR}/build -G ${GENERATOR}
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer against the installed zero failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer against the installed zero failed")
endif()
execute_process(COMMAND ${WORK_DIR}/build/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "consumer ok")
  message(FATAL_ERROR "the consumer built against the installed zero did not run correctly")
endif()

# A CPU-only configuration of zero's source installs without building anything: the core is headers
# only, and the tools are installed only when they were built.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/../.. -B ${WORK_DIR}/cpu-build -G ${GENERATOR}
                        -DZERO_BUILD_TESTS=OFF -DZERO_BUILD_BENCH=OFF -DZERO_BUILD_EXAMPLES=OFF -DZERO_BUILD_TOOLS=ON
                        -DZERO_WITH_CUDA=OFF
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring a CPU-only zero failed:\n${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --install ${WORK_DIR}/cpu-build --prefix ${WORK_DIR}/cpu
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "installing a CPU-only zero whose tools were not built failed:\n${out}")
endif()
