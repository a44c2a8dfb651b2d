# Locates the CUTLASS/CuTe headers (the directory holding cute/ and cutlass/)
# and sets FLASH3_CUTLASS_DIR. Order:
#   1. FLASH3_CUTLASS_DIR (cache or environment variable), if given;
#   2. the Python interpreter's `cutlass_library` package (nvidia-cutlass wheel);
#   3. `pip download --no-deps nvidia-cutlass==<version>` into the build tree.
# Step 3 exists because `pip install .` builds in an isolated environment
# where the user's site-packages are invisible, and nvidia-cutlass cannot be a
# build requirement (its dependencies are heavy and unused: we need headers).

set(FLASH3_CUTLASS_VERSION "4.2.0.0" CACHE STRING "nvidia-cutlass wheel fetched when no CUTLASS is found")
set(FLASH3_CUTLASS_DIR "$ENV{FLASH3_CUTLASS_DIR}" CACHE PATH
    "CUTLASS include directory (contains cute/ and cutlass/); empty = find it")

function(_flash3_is_cutlass_include dir out)
  if(dir AND EXISTS "${dir}/cute/tensor.hpp" AND EXISTS "${dir}/cutlass/cutlass.h")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

if(FLASH3_CUTLASS_DIR)
  _flash3_is_cutlass_include("${FLASH3_CUTLASS_DIR}" _ok)
  if(NOT _ok)
    message(FATAL_ERROR "FLASH3_CUTLASS_DIR=${FLASH3_CUTLASS_DIR} does not contain "
                        "cute/tensor.hpp and cutlass/cutlass.h (point it at CUTLASS's include/)")
  endif()
  return()
endif()

find_package(Python3 COMPONENTS Interpreter)

if(Python3_Interpreter_FOUND)
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
      "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
    OUTPUT_VARIABLE _dir OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _rc ERROR_QUIET)
  if(_rc EQUAL 0)
    _flash3_is_cutlass_include("${_dir}" _ok)
    if(_ok)
      message(STATUS "flash3: CUTLASS headers from the cutlass_library package: ${_dir}")
      set(FLASH3_CUTLASS_DIR "${_dir}" CACHE PATH "CUTLASS include directory" FORCE)
      return()
    endif()
  endif()
endif()

# 3. Fetch the wheel (a zip) and unpack only its headers. Kept in the build tree,
#    so reconfiguring does not download again.
set(_root "${CMAKE_BINARY_DIR}/_deps/cutlass-${FLASH3_CUTLASS_VERSION}")
set(_dir "${_root}/cutlass_library/source/include")
_flash3_is_cutlass_include("${_dir}" _ok)
if(NOT _ok)
  if(NOT Python3_Interpreter_FOUND)
    message(FATAL_ERROR "flash3: no CUTLASS headers found and no Python to fetch them; "
                        "set FLASH3_CUTLASS_DIR to CUTLASS's include/ directory")
  endif()
  message(STATUS "flash3: downloading nvidia-cutlass==${FLASH3_CUTLASS_VERSION} (headers only)")
  file(MAKE_DIRECTORY "${_root}")
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -m pip download --no-deps --disable-pip-version-check
            --quiet --dest "${_root}" "nvidia-cutlass==${FLASH3_CUTLASS_VERSION}"
    RESULT_VARIABLE _rc ERROR_VARIABLE _err)
  file(GLOB _wheel "${_root}/nvidia_cutlass-*.whl")
  if(NOT _rc EQUAL 0 OR NOT _wheel)
    message(FATAL_ERROR "flash3: could not download nvidia-cutlass==${FLASH3_CUTLASS_VERSION} "
                        "(${_err}); set FLASH3_CUTLASS_DIR to CUTLASS's include/ directory")
  endif()
  list(GET _wheel 0 _wheel)
  file(ARCHIVE_EXTRACT INPUT "${_wheel}" DESTINATION "${_root}"
       PATTERNS "cutlass_library/source/include/*")
  _flash3_is_cutlass_include("${_dir}" _ok)
  if(NOT _ok)
    message(FATAL_ERROR "flash3: ${_wheel} has no cutlass_library/source/include")
  endif()
endif()
message(STATUS "flash3: CUTLASS headers from the downloaded wheel: ${_dir}")
set(FLASH3_CUTLASS_DIR "${_dir}" CACHE PATH "CUTLASS include directory" FORCE)
