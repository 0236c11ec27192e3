# SPDX-License-Identifier: Apache-2.0
# Decides whether the Python extension is built (TPU_PYTHON_ENABLED) and finds its interpreter and
# pybind11. `./tpusim` passes -DTPU_PYTHON=ON -DPython3_EXECUTABLE=<build>/venv/bin/python (the
# virtual environment it sets up from python/requirements.txt); pybind11 comes from that
# interpreter (`python -m pybind11 --cmakedir`), so its version is the pinned one.
set(TPU_PYTHON_ENABLED OFF)
# Under ASan the extension would need libasan preloaded into Python: AUTO leaves it out there.
if(TPU_PYTHON STREQUAL "AUTO" AND TPU_SANITIZE)
    message(STATUS "Python extension not built in a sanitizer build (TPU_PYTHON=ON forces it)")
elseif(TPU_PYTHON AND NOT TPU_FUZZ)
    if(TPU_PYTHON STREQUAL "AUTO")
        find_package(Python3 3.9 QUIET COMPONENTS Interpreter Development.Module)
    else()
        find_package(Python3 3.9 REQUIRED COMPONENTS Interpreter Development.Module)
    endif()
    if(Python3_FOUND)
        execute_process(COMMAND ${Python3_EXECUTABLE} -m pybind11 --cmakedir
                        OUTPUT_VARIABLE tpu_pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                        RESULT_VARIABLE tpu_pybind11_rc ERROR_QUIET)
        if(tpu_pybind11_rc EQUAL 0)
            set(pybind11_DIR ${tpu_pybind11_dir} CACHE PATH "pybind11's CMake package" FORCE)
        endif()
        find_package(pybind11 2.10 CONFIG QUIET)
    endif()
    if(Python3_FOUND AND pybind11_FOUND)
        set(TPU_PYTHON_ENABLED ON)
    elseif(TPU_PYTHON STREQUAL "AUTO")
        message(STATUS "Python extension not built: needs Python 3 with pybind11 "
                       "(./tpusim sets up both in build/venv)")
    else()
        message(FATAL_ERROR "TPU_PYTHON=ON, but ${Python3_EXECUTABLE} has no pybind11: "
                            "pip install -r python/requirements.txt")
    endif()
endif()
if(TPU_PYTHON_ENABLED)
    # Static libraries linked into a shared object must be position-independent. Without
    # semantic interposition GCC still inlines and specialises calls between global functions,
    # as it does in the default position-independent executables.
    set(CMAKE_POSITION_INDEPENDENT_CODE ON)
    target_compile_options(tpu_options INTERFACE
                           $<$<CXX_COMPILER_ID:GNU>:-fno-semantic-interposition>)
endif()
