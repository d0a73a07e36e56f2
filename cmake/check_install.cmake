# Installs the build tree into a scratch prefix, then configures, builds and runs a small
# consumer project that uses find_package(kiln). Run by CTest (install.find_package).
# Inputs: BUILD_DIR, SRC (consumer sources), WORK (scratch folder), GENERATOR, DEP_PREFIXES
# ('|'-separated prefixes where kiln's dependencies live, e.g. unpacked packages on the GPU machine).
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
# The README's C++ example, cut out of README.md as it stands, becomes a second program.
get_filename_component(readme ${SRC}/../../README.md ABSOLUTE)
file(READ ${readme} text)
string(FIND "${text}" "## Using kiln from C++" at)
string(SUBSTRING "${text}" ${at} -1 text)
string(FIND "${text}" "```cpp\n" start)
if(at LESS 0 OR start LESS 0)
  message(FATAL_ERROR "README.md has no ```cpp block under '## Using kiln from C++'")
endif()
math(EXPR start "${start} + 7")
string(SUBSTRING "${text}" ${start} -1 text)
string(FIND "${text}" "```" stop)
string(SUBSTRING "${text}" 0 ${stop} snippet)
file(WRITE ${WORK}/readme_snippet.cpp "${snippet}")
string(REPLACE "|" ";" prefixes "${WORK}/prefix|${DEP_PREFIXES}")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${WORK}/build -G ${GENERATOR}
                        "-DCMAKE_PREFIX_PATH=${prefixes}" -DREADME_SNIPPET=${WORK}/readme_snippet.cpp
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc)
  message(FATAL_ERROR "configuring the find_package(kiln) consumer failed:\n${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/build RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc)
  message(FATAL_ERROR "building the consumer failed:\n${out}")
endif()
execute_process(COMMAND ${WORK}/build/app RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(rc OR NOT out MATCHES "^\\[4, 3\\]")
  message(FATAL_ERROR "the consumer ran wrong (${rc}): ${out}")
endif()
execute_process(COMMAND ${WORK}/build/readme RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc OR NOT out MATCHES "^loss [-0-9.e+]+ on (cpu|cuda:0), grad \\[256, 512\\]")
  message(FATAL_ERROR "README.md's C++ example ran wrong (${rc}): ${out}")
endif()
