# ctest driver of zero-gpt's Hugging Face interop, run as cmake -DEXE=... -DDIR=... -DCORPUS=... -DPYTHON=...
# -DSCRIPT=check_export.py -P check_interop.cmake:
# 1. train at 4 ranks (stage 0) and --export DIR;
# 2. check_export.py: DIR holds GPT2LMHeadModel's names, shapes and config (no transformers needed);
# 3. --eval-only --init DIR at 4 ranks and stage 3 prints the same val_loss, bit for bit, as the run that exported;
# 4. --init DIR continues training: its first loss is the trained model's (below the bytes' unigram entropy), not a
#    fresh one's.
set(model --layers 2 --heads 2 --d-model 64 --seq 64)
file(REMOVE_RECURSE ${DIR})
include(${CMAKE_CURRENT_LIST_DIR}/json_line.cmake)
zero_gpt_json_line("training with --export" line ${EXE} --text ${CORPUS} --ranks 4 --stage 0 --steps 200 ${model}
                   --export ${DIR} --json)
string(JSON trained GET "${line}" val_loss)
string(JSON entropy GET "${line}" unigram_entropy)

execute_process(COMMAND ${PYTHON} ${SCRIPT} ${DIR} ${model} --vocab 256 RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_export.py:\n${out}${err}")
endif()
message(STATUS "${out}")

execute_process(COMMAND ${EXE} --eval-only --init ${DIR} --text ${CORPUS} --ranks 4 --stage 3
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "--eval-only --init failed (${rc}):\n${err}${out}")
endif()
string(REGEX MATCHALL "{[^\n]*}" lines "${out}")
list(GET lines -1 last)
string(JSON evaluated GET "${last}" val_loss)
message(STATUS "val loss ${trained} after training, ${evaluated} from the export (unigram entropy ${entropy})")
if(NOT evaluated STREQUAL trained)
  message(FATAL_ERROR "--eval-only --init ${DIR} gave val_loss ${evaluated}; the run that exported had ${trained}")
endif()

execute_process(COMMAND ${EXE} --init ${DIR} --text ${CORPUS} --ranks 2 --stage 2 --steps 10 --print-every 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "--init ${DIR} with training failed (${rc}):\n${err}${out}")
endif()
string(REGEX MATCH "step +1  train loss ([0-9.]+)" first "${out}")
set(first_loss ${CMAKE_MATCH_1})
message(STATUS "first train loss from the export ${first_loss}")
if(first_loss STREQUAL "" OR NOT first_loss LESS entropy)
  message(FATAL_ERROR "--init ${DIR}: the first train loss '${first_loss}' is not below the unigram entropy ${entropy}; "
                      "the export was not loaded:\n${out}")
endif()
