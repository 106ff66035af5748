# zero_gpt_json_line(<what> <out-var> <command>...), for the -P scripts that check zero-gpt's runs: runs <command>,
# fails with <what>, the exit status and the output unless it exits 0, and sets <out-var> to the first JSON line
# ({...}) of its standard output.
function(zero_gpt_json_line what out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} exited with ${rc}:\n${err}${out}")
  endif()
  string(REGEX MATCH "{[^\n]*}" line "${out}")
  set(${out_var} "${line}" PARENT_SCOPE)
endfunction()
