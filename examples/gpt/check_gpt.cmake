# ctest driver of zero-gpt: runs EXE with ARGS (a ;-list) once per stage of STAGES with --json, and fails unless
# every run's validation loss ends below the validation text's byte unigram entropy by MARGIN nats and its model
# state per rank is within 2% of the ZeRO formula; with SAME_BITS, the final parameters' checksum must be the same
# at every stage. Run as cmake -DEXE=... -DARGS=... -DSTAGES=0;1;2;3 -DMARGIN=0.3
# -P check_gpt.cmake.
foreach(stage IN LISTS STAGES)
  execute_process(COMMAND ${EXE} ${ARGS} --stage ${stage} --json RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "zero-gpt --stage ${stage} exited with ${rc}:\n${err}${out}")
  endif()
  string(REGEX MATCH "{[^\n]*}" line "${out}")
  string(JSON val GET "${line}" val_loss)
  string(JSON entropy GET "${line}" unigram_entropy)
  string(JSON peak GET "${line}" model_state_peak_bytes)
  string(JSON formula GET "${line}" formula_bytes)
  string(JSON checksum GET "${line}" params_checksum)
  math(EXPR peak_x100 "${peak} * 100")
  # CMake's math has integers only: compare val + margin < entropy in thousandths.
  string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" val_milli "${val}")
  string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" entropy_milli "${entropy}")
  string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" margin_milli "${MARGIN}000")
  math(EXPR bar "${entropy_milli} - ${margin_milli}")
  message(STATUS "stage ${stage}: val loss ${val}, unigram entropy ${entropy}, model state ${peak} B against the "
                 "formula's ${formula} B, params checksum ${checksum}")
  if(NOT val_milli LESS bar)
    message(FATAL_ERROR "stage ${stage}: val loss ${val} is not below the byte unigram entropy ${entropy} by ${MARGIN}")
  endif()
  if(SAME_BITS)
    if(DEFINED first_checksum AND NOT checksum STREQUAL first_checksum)
      message(FATAL_ERROR "stage ${stage}: params checksum ${checksum}, not the ${first_checksum} of stage "
                          "${first_stage}: fp32 runs must give the same bits at every stage")
    endif()
    set(first_checksum ${checksum})
    set(first_stage ${stage})
  endif()
  string(REGEX REPLACE "\\..*" "" formula_int "${formula}")
  math(EXPR allowed "${formula_int} * 102")
  if(peak_x100 GREATER allowed)
    message(FATAL_ERROR "stage ${stage}: model state ${peak} B is more than 2% over the ZeRO formula's ${formula} B")
  endif()
endforeach()
