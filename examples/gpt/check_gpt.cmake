# ctest driver of zero-gpt: runs EXE with ARGS (a ;-list) once per stage of STAGES with --json, and fails unless
# every run's validation loss ends below the validation text's byte unigram entropy by MARGIN nats and its model
# state per rank is within 2% of the ZeRO formula; with SAME_BITS, the final parameters' checksum must be the same
# at every stage; with REFERENCE (a ;-list: another command line, e.g. the same run on in-process ranks), its
# checksum must be the last run's. Run as cmake -DEXE=... -DARGS=... -DSTAGES=0;1;2;3 -DMARGIN=0.3
# -P check_gpt.cmake.
include(${CMAKE_CURRENT_LIST_DIR}/json_line.cmake)
foreach(stage IN LISTS STAGES)
  zero_gpt_json_line("zero-gpt --stage ${stage}" line ${EXE} ${ARGS} --stage ${stage} --json)
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
if(REFERENCE)
  zero_gpt_json_line("the reference run" line ${REFERENCE} --json)
  string(JSON reference GET "${line}" params_checksum)
  message(STATUS "reference run: params checksum ${reference}")
  if(NOT reference STREQUAL checksum)
    message(FATAL_ERROR "params checksum ${checksum}, but the reference run's is ${reference}")
  endif()
endif()
