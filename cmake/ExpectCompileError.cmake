# cmake -DBUILD_DIR=... -DTARGET=... -DEXPECT=<regex> -P ExpectCompileError.cmake
# Builds TARGET, which must not compile. Exits with an error ("failed as expected", which the
# test's WILL_FAIL turns into a pass) only when the build failed AND its output matches EXPECT;
# a target that compiles, or fails for another reason, exits 0 and so fails the test.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(rc EQUAL 0)
  message(STATUS "${TARGET} compiled, but it must not: the concept lets a wrong type through")
  return()
endif()
if(NOT all MATCHES "${EXPECT}")
  message(STATUS "${TARGET} failed to compile, but without the expected diagnostic \"${EXPECT}\":\n${all}")
  return()
endif()
string(REGEX MATCH "[^\n]*${EXPECT}[^\n]*" line "${all}")
message(FATAL_ERROR "${TARGET} failed to compile as expected; the user sees:\n  ${line}")
