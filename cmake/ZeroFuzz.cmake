# zero_add_fuzzer(<name> SOURCE <file> SECONDS <s> [DICT <file>] [SEEDS <dir>...] [DEPENDS <file>...])
# Builds a libFuzzer target from one source with clang (Debian's clang and libclang-rt-14-dev),
# whatever compiler builds the rest, with AddressSanitizer and UndefinedBehaviorSanitizer, and
# registers the ctest <name> that runs it for SECONDS (labels cpu and fuzz). Its corpus directory,
# written to by libFuzzer, lives in the build tree; the SEEDS directories are read only. Without a
# clang that links libFuzzer it says why and adds nothing. DEPENDS lists the headers the source
# includes, so the fuzzer is rebuilt when they change.
function(zero_add_fuzzer name)
  set(root ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/..)
  cmake_parse_arguments(F "" "SOURCE;SECONDS;DICT" "SEEDS;DEPENDS" ${ARGN})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set(zero_fuzz_cxx ${CMAKE_CXX_COMPILER})
  else()
    find_program(zero_fuzz_cxx NAMES clang++ clang++-14 clang++-15 clang++-16 clang++-17 clang++-18)
  endif()
  if(NOT zero_fuzz_cxx)
    message(STATUS "zero: no clang++ found; ${name} skipped")
    return()
  endif()
  # Check once per build tree that this clang links libFuzzer; Debian's clang needs libclang-rt-dev.
  if(NOT DEFINED CACHE{ZERO_FUZZ_LINKS})
    set(probe ${CMAKE_BINARY_DIR}/zero_fuzz_probe.cpp)
    file(WRITE ${probe} "#include <cstddef>\n#include <cstdint>\nextern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
    execute_process(COMMAND ${zero_fuzz_cxx} -fsanitize=fuzzer ${probe} -o ${CMAKE_BINARY_DIR}/zero_fuzz_probe
                    RESULT_VARIABLE probe_rc OUTPUT_QUIET ERROR_QUIET)
    if(probe_rc EQUAL 0)
      set(ZERO_FUZZ_LINKS ON CACHE INTERNAL "clang links libFuzzer")
    else()
      set(ZERO_FUZZ_LINKS OFF CACHE INTERNAL "clang links libFuzzer")
    endif()
  endif()
  if(NOT ZERO_FUZZ_LINKS)
    message(STATUS "zero: ${zero_fuzz_cxx} cannot link libFuzzer (install libclang-rt-dev); ${name} skipped")
    return()
  endif()

  get_target_property(json_includes nlohmann_json::nlohmann_json INTERFACE_INCLUDE_DIRECTORIES)
  set(includes -I${root}/include)
  foreach(dir IN LISTS json_includes)
    if(NOT dir MATCHES "^\\$<")
      list(APPEND includes -I${dir})
    endif()
  endforeach()
  # The binary sits in a folder of its own: a custom target may not share its output's path (Ninja).
  set(bin ${CMAKE_CURRENT_BINARY_DIR}/fuzz/${name})
  add_custom_command(
    OUTPUT ${bin}
    COMMAND ${zero_fuzz_cxx} -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
            ${includes} ${F_SOURCE} -o ${bin}
    DEPENDS ${F_SOURCE} ${F_DEPENDS}
    COMMENT "Building ${name} with ${zero_fuzz_cxx}")
  add_custom_target(${name} ALL DEPENDS ${bin})

  set(dict)
  if(F_DICT)
    set(dict -dict=${F_DICT})
  endif()
  set(corpus ${CMAKE_CURRENT_BINARY_DIR}/${name}_corpus)
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=1
                   ${bin} -max_total_time=${F_SECONDS} -timeout=10 -rss_limit_mb=2048 ${dict} ${corpus} ${F_SEEDS})
  set_tests_properties(${name} PROPERTIES LABELS "cpu;fuzz" TIMEOUT 600 FIXTURES_REQUIRED ${name}_corpus)
  add_test(NAME ${name}_corpus COMMAND ${CMAKE_COMMAND} -E make_directory ${corpus})
  set_tests_properties(${name}_corpus PROPERTIES LABELS "cpu;fuzz" FIXTURES_SETUP ${name}_corpus)
endfunction()
