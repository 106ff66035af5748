# ctest driver: compiles SOURCE with CXX (-std=c++20 -I INCLUDE), as a framework's build that includes a header
# from its old path would. The compile must succeed and its output must match EXPECT (the deprecation message
# naming the new path); with -DZERO_NO_DEPRECATION_MESSAGES it must succeed and say nothing of it.
#   cmake -DCXX=... -DINCLUDE=... -DSOURCE=... -DEXPECT=<regex> -DOUT=<dir> -P check.cmake
file(MAKE_DIRECTORY ${OUT})
execute_process(COMMAND ${CXX} -std=c++20 -Wall -Wextra -I${INCLUDE} ${SOURCE} -o ${OUT}/compat
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} no longer compiles through the old path (exit ${rc}):\n${out}${err}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "${SOURCE} compiled without the message \"${EXPECT}\":\n${out}${err}")
endif()
string(REGEX MATCH "[^\n]*${EXPECT}[^\n]*" said "${out}${err}")
execute_process(COMMAND ${OUT}/compat RESULT_VARIABLE run_rc)
if(NOT run_rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE}: the program built through the old path exited with ${run_rc}")
endif()
execute_process(COMMAND ${CXX} -std=c++20 -Wall -Wextra -Werror -DZERO_NO_DEPRECATION_MESSAGES -I${INCLUDE}
                        ${SOURCE} -o ${OUT}/compat_quiet
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR "${out}${err}" MATCHES "deprecated")
  message(FATAL_ERROR "with ZERO_NO_DEPRECATION_MESSAGES, ${SOURCE} must compile with -Werror and no message (exit "
                      "${rc}):\n${out}${err}")
endif()
message(STATUS "the old path compiles; the compiler says:\n${said}")
