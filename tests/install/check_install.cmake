# ctest case install_find_package: `cmake --install` the build into a temporary
# prefix, then configure, build and run tests/install/consumer (and README.md's
# example) against that prefix alone, as a user's project outside the tree would.
#   cmake -DBUILD_DIR=... -DCONSUMER_DIR=... -DWORK_DIR=... -DCXX_COMPILER=... -DGENERATOR=...
#         -DSOURCE_DIR=<the project's root> [-DCCACHE=path] -P check_install.cmake
# With CCACHE the consumer compiles through ccache as the build does, based at
# SOURCE_DIR: each installed header is a file of its own, a minute of compiles,
# the same ones in a fresh clone as in the build before it.
foreach(var BUILD_DIR CONSUMER_DIR WORK_DIR CXX_COMPILER GENERATOR SOURCE_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_install.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}): ${ARGN}")
  endif()
endfunction()

set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
run("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# What a user gets: the layout docs/library.md promises, and no private header.
foreach(file include/attograd/base/error.h include/attograd/tensor/tensor.h include/attograd/cpu/parallel.h
             include/attograd/autograd/ops.h include/attograd/nn/gpt.h include/attograd/train/options.h
             include/attograd/train/optim/optim.h
             include/attograd/train/optim/optimizer.h include/attograd/cuda/runtime.h
             lib/libattograd.a lib/libattograd_train.a bin/attograd
             lib/cmake/attograd/attogradConfig.cmake lib/cmake/attograd/attogradConfigVersion.cmake)
  if(NOT EXISTS ${prefix}/${file})
    message(FATAL_ERROR "install: ${prefix}/${file} is missing")
  endif()
endforeach()
foreach(private include/attograd/cuda/bridge include/attograd/autograd/ops
                include/attograd/tensor/device_kernels.h include/attograd/tensor/attention_call.h
                include/attograd/tensor/dispatch_checks.h include/attograd/train/cli/flags.h
                include/attograd/cuda/launchers.h)
  if(EXISTS ${prefix}/${private})
    message(FATAL_ERROR "install: a private file was installed: ${prefix}/${private}")
  endif()
endforeach()
file(GLOB installed_cpu RELATIVE ${prefix}/include/attograd/cpu ${prefix}/include/attograd/cpu/*)
if(NOT installed_cpu STREQUAL "parallel.h")
  message(FATAL_ERROR "install: of cpu/ only parallel.h (the thread pool) is public, not: ${installed_cpu}")
endif()
run("the installed program" ${prefix}/bin/attograd --version)

# The C++ examples of the docs a newcomer copies first: README.md's (the first
# block under "## The library") and docs/library.md's (under "## Using the
# library"), each made a program: its #include and using lines first, the rest
# the body of main. The consumer builds and runs them, so each compiles against
# the installed headers alone and runs.
function(write_doc_example markdown heading program)
  file(READ ${SOURCE_DIR}/${markdown} text)
  if(NOT text MATCHES "\n## ${heading}\n+```cpp\n([^`]*)```")
    message(FATAL_ERROR "${markdown}: no ```cpp block right after \"## ${heading}\"")
  endif()
  string(REPLACE ";" "<semicolon>" example "${CMAKE_MATCH_1}")  # a CMake list splits at ';'
  string(REPLACE "\n" ";" example_lines "${example}")
  set(head "// ${markdown}'s example under \"## ${heading}\", written by tests/install/check_install.cmake.\n")
  set(body "")
  foreach(line IN LISTS example_lines)
    if(line MATCHES "^(#include|using )")
      string(APPEND head "${line}\n")
    else()
      string(APPEND body "  ${line}\n")
    endif()
  endforeach()
  string(REPLACE "<semicolon>" ";" head "${head}")
  string(REPLACE "<semicolon>" ";" body "${body}")
  file(WRITE ${program} "${head}\nint main() {\n${body}}\n")
endfunction()
set(examples_dir ${WORK_DIR}/doc_examples)
write_doc_example(README.md "The library" ${examples_dir}/readme_example.cpp)
write_doc_example(docs/library.md "Using the library" ${examples_dir}/library_example.cpp)

set(launcher)
if(CCACHE)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
  set(ENV{CCACHE_BASEDIR} ${SOURCE_DIR})
  set(ENV{CCACHE_NOHASHDIR} 1)
endif()
run("configuring the consumer" ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix} -DDOC_EXAMPLES_DIR=${examples_dir} ${launcher})
run("building the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2)
run("running the consumer" ${WORK_DIR}/build/consumer)
file(GLOB doc_examples ${examples_dir}/*.cpp)  # the consumer builds each, named after its file
foreach(example IN LISTS doc_examples)
  cmake_path(GET example STEM program)
  run("running the docs' example ${program}" ${WORK_DIR}/build/${program})
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
