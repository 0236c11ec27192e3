# SPDX-License-Identifier: Apache-2.0
# tpu_add_library(NAME ALIAS SOURCES ... PUBLIC ... PRIVATE ...): one library per layer with a
# namespaced alias; a layer without sources yet is an INTERFACE library.
function(tpu_add_library name alias)
    cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC;PRIVATE" ${ARGN})
    if(ARG_SOURCES)
        add_library(${name} STATIC ${ARG_SOURCES})
        target_link_libraries(${name} PUBLIC tpu_options ${ARG_PUBLIC} PRIVATE ${ARG_PRIVATE})
    else()
        add_library(${name} INTERFACE)
        target_link_libraries(${name} INTERFACE tpu_options ${ARG_PUBLIC})
    endif()
    add_library(${alias} ALIAS ${name})
endfunction()

# tpu_add_test(NAME SOURCES ... LIBS ... [TIMEOUT s]): a GoogleTest binary with our own sc_main
# runner (tests/common/test_main.cpp). gtest_discover_tests makes each test a ctest entry of its
# own (parallel runs, per-test timeouts, a crash confined to one test). Boards do not need the
# separate processes: each owns its SystemC context, and a test binary also passes run whole.
function(tpu_add_test name)
    cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS" ${ARGN})
    if(NOT ARG_SOURCES)
        return()
    endif()
    if(NOT ARG_TIMEOUT)
        set(ARG_TIMEOUT 300)
    endif()
    add_executable(${name} ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/tests/common/test_main.cpp)
    target_link_libraries(${name} PRIVATE ${ARG_LIBS} tpu::systemc GTest::gtest tpu_options)
    # Compiled in rather than passed as ENVIRONMENT: gtest_discover_tests splits list values.
    target_compile_definitions(${name} PRIVATE TPU_SOURCE_DIR_DEFAULT="${PROJECT_SOURCE_DIR}"
                                               TPU_BINARY_DIR_DEFAULT="${PROJECT_BINARY_DIR}")
    gtest_discover_tests(${name}
        DISCOVERY_TIMEOUT 120
        PROPERTIES TIMEOUT ${ARG_TIMEOUT}
                   ENVIRONMENT "SYSTEMC_DISABLE_COPYRIGHT_MESSAGE=1")
endfunction()
