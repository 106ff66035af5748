# ctest driver of zero-gpt against zero-estimate: the memory per rank the engine measures beside the one the estimate
# predicts for the same model and config. zero-gpt ARGS --describe writes the model description; then, per stage of
# STAGES, zero-gpt ARGS [--config CONFIG] --stage S --json --write-config trains a few steps and writes the config it
# ran, and zero-estimate --model --config --gpus-per-node RANKS --json estimates it. The row of that stage and of the
# config's offload devices must give the measured model state (model_state_peak_bytes) within 2% as
# gpu_model_state_bytes and, with the optimizer offloaded, the measured host peak (peak_bytes.host) within 2% as
# host_bytes_per_node / RANKS; the run fails otherwise, printing both numbers. Run as cmake -DEXE=zero-gpt
# -DESTIMATE=zero-estimate -DDIR=work-dir -DRANKS=4 -DSTAGES=1;2;3 -DARGS=... [-DCONFIG=file] -P check_estimate.cmake
# (ARGS must hold --ranks RANKS).

# |measured - estimated| <= 2% of estimated, in integers (CMake's math has no floats); 0 estimated needs 0 measured.
function(check_within_2_percent what measured estimated)
  math(EXPR diff "${measured} - ${estimated}")
  if(diff LESS 0)
    math(EXPR diff "-(${diff})")
  endif()
  math(EXPR diff_x100 "${diff} * 100")
  math(EXPR allowed "${estimated} * 2")
  if(diff_x100 GREATER allowed)
    message(FATAL_ERROR "${what}: zero-gpt measured ${measured} B, zero-estimate's row says ${estimated} B: more than "
                        "2% apart")
  endif()
endfunction()

file(MAKE_DIRECTORY ${DIR})
set(model ${DIR}/model.json)
execute_process(COMMAND ${EXE} ${ARGS} --describe ${model} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "zero-gpt --describe exited with ${rc}:\n${err}${out}")
endif()
set(config_args)
if(CONFIG)
  set(config_args --config ${CONFIG})
endif()
include(${CMAKE_CURRENT_LIST_DIR}/json_line.cmake)
foreach(stage IN LISTS STAGES)
  set(config ${DIR}/config-stage${stage}.json)
  zero_gpt_json_line("zero-gpt --stage ${stage}" line ${EXE} ${ARGS} ${config_args} --stage ${stage} --json
                     --write-config ${config})
  string(JSON measured GET "${line}" model_state_peak_bytes)
  string(JSON measured_host ERROR_VARIABLE no_host GET "${line}" peak_bytes host)

  # The written config names its offload devices (none when it has no such block).
  file(READ ${config} written)
  string(JSON opt ERROR_VARIABLE none_given GET "${written}" zero_optimization offload_optimizer device)
  if(none_given)
    set(opt none)
  endif()
  string(JSON par ERROR_VARIABLE none_given GET "${written}" zero_optimization offload_param device)
  if(none_given)
    set(par none)
  endif()

  execute_process(COMMAND ${ESTIMATE} --model ${model} --config ${config} --gpus-per-node ${RANKS} --json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "zero-estimate --config ${config} exited with ${rc}:\n${err}${out}")
  endif()
  string(REGEX MATCH "\n({[^\n]*})\n?$" line "${out}")
  set(line "${CMAKE_MATCH_1}")
  string(JSON rows LENGTH "${line}" rows)
  unset(estimated)
  math(EXPR last "${rows} - 1")
  foreach(i RANGE ${last})
    string(JSON row GET "${line}" rows ${i})
    string(JSON row_stage GET "${row}" stage)
    string(JSON row_opt GET "${row}" offload_optimizer)
    string(JSON row_par GET "${row}" offload_param)
    if(row_stage EQUAL stage AND row_opt STREQUAL opt AND row_par STREQUAL par)
      string(JSON estimated GET "${row}" gpu_model_state_bytes)
      string(JSON host_per_node GET "${row}" host_bytes_per_node)
    endif()
  endforeach()
  if(NOT DEFINED estimated)
    message(FATAL_ERROR "zero-estimate printed no row for stage ${stage}, offload_optimizer ${opt}, offload_param "
                        "${par}:\n${out}")
  endif()
  math(EXPR estimated_host "${host_per_node} / ${RANKS}")
  message(STATUS "stage ${stage}, offload_optimizer ${opt}: model state ${measured} B measured, ${estimated} B "
                 "estimated; host ${measured_host} B measured, ${estimated_host} B estimated")
  check_within_2_percent("stage ${stage} model state" ${measured} ${estimated})
  if(NOT opt STREQUAL "none")
    if(no_host)
      message(FATAL_ERROR "zero-gpt --json printed no peak_bytes.host: ${no_host}")
    endif()
    check_within_2_percent("stage ${stage} host memory (offload_optimizer ${opt})" ${measured_host} ${estimated_host})
  endif()
endforeach()
