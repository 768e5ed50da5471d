# Finds LibTorch and checks that it is a version hyperparallel supports.
#
# Where from, in order: a LibTorch the user names (Torch_DIR, or CMAKE_PREFIX_PATH holding
# one); else the torch wheel of the Python interpreter HP_PYTHON (the Makefile passes the
# project's environment made by scripts/setup.sh), asked for torch.utils.cmake_prefix_path;
# else one under the system's prefixes.
# The supported range is stated once here and refused with that range at configure time:
# older releases lack the c10d and autograd interfaces the sources use, newer ones are not
# tested (docs/building.md "LibTorch").
set(HP_TORCH_MIN_VERSION 2.11.0)
set(HP_TORCH_MAX_VERSION 2.11.99)
set(HP_PYTHON "" CACHE FILEPATH "Python whose torch wheel provides LibTorch (when Torch_DIR is not set)")

# The wheel's Caffe2 config probes the CUDA toolkit with CMAKE_CUDA_STANDARD, which it copies
# from CMAKE_CXX_STANDARD when unset; CMake 3.25 knows no CUDA20 flags for nvcc, so a C++20
# configure failed there. Nothing of ours compiles CUDA: its standard stays 17.
if(NOT DEFINED CMAKE_CUDA_STANDARD)
  set(CMAKE_CUDA_STANDARD 17)
endif()

# First only the places a user names: Torch_DIR and CMAKE_PREFIX_PATH (as CMake variables or
# environment variables), not the system's own prefixes. A Debian machine may carry an older
# LibTorch under /usr (libtorch-dev, 1.13); searching there first would pick it over the
# project's wheel and refuse it below. TorchConfig finds its Caffe2 half with
# find_package(Caffe2 PATHS <beside it>), and PATHS come after the system's prefixes: so Caffe2_DIR
# is set beside Torch_DIR wherever we know where Torch is (hp_caffe2_beside_torch), and checked
# after the search.
macro(hp_caffe2_beside_torch torch_dir)
  get_filename_component(_hp_caffe2_dir "${torch_dir}/../Caffe2" ABSOLUTE)
  set(Caffe2_DIR "${_hp_caffe2_dir}" CACHE PATH "LibTorch's Caffe2 CMake folder" FORCE)
endmacro()
if(NOT Torch_DIR AND DEFINED ENV{Torch_DIR})
  set(Torch_DIR "$ENV{Torch_DIR}")
endif()
if(Torch_DIR)
  hp_caffe2_beside_torch("${Torch_DIR}")
endif()
find_package(Torch QUIET CONFIG NO_SYSTEM_ENVIRONMENT_PATH NO_CMAKE_SYSTEM_PATH
             NO_CMAKE_PACKAGE_REGISTRY NO_CMAKE_SYSTEM_PACKAGE_REGISTRY)
if(NOT Torch_FOUND AND HP_PYTHON)
  execute_process(COMMAND "${HP_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE _hp_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _hp_torch_rc ERROR_VARIABLE _hp_torch_err)
  if(NOT _hp_torch_rc EQUAL 0)
    message(FATAL_ERROR "HP_PYTHON=${HP_PYTHON} has no usable torch (${_hp_torch_err}); "
                        "run scripts/setup.sh, or set Torch_DIR to a LibTorch ${HP_TORCH_MIN_VERSION}")
  endif()
  hp_caffe2_beside_torch("${_hp_torch_prefix}/Torch")
  find_package(Torch CONFIG PATHS "${_hp_torch_prefix}" NO_DEFAULT_PATH)
endif()
if(NOT Torch_FOUND)
  find_package(Torch QUIET CONFIG)  # last: the system's prefixes
endif()
if(NOT Torch_FOUND)
  message(FATAL_ERROR "LibTorch not found: run scripts/setup.sh and configure through the Makefile "
                      "(it passes -DHP_PYTHON=<the project's environment>/bin/python), or point "
                      "Torch_DIR at a LibTorch ${HP_TORCH_MIN_VERSION} .. ${HP_TORCH_MAX_VERSION} "
                      "(its share/cmake/Torch folder)")
endif()
if(Torch_VERSION VERSION_LESS HP_TORCH_MIN_VERSION OR Torch_VERSION VERSION_GREATER HP_TORCH_MAX_VERSION)
  message(FATAL_ERROR "LibTorch ${Torch_VERSION} at ${Torch_DIR} is not supported: hyperparallel builds "
                      "against LibTorch ${HP_TORCH_MIN_VERSION} .. ${HP_TORCH_MAX_VERSION}; point Torch_DIR at "
                      "one (scripts/setup.sh installs torch==2.11.0 into the project's environment)")
endif()
get_filename_component(_hp_torch_root "${Torch_DIR}/.." ABSOLUTE)
get_filename_component(_hp_caffe2_root "${Caffe2_DIR}/.." ABSOLUTE)
if(NOT _hp_torch_root STREQUAL _hp_caffe2_root)
  message(FATAL_ERROR "LibTorch's two halves come from different installs: Torch from ${Torch_DIR}, "
                      "Caffe2 from ${Caffe2_DIR}; set Caffe2_DIR to ${_hp_torch_root}/Caffe2 "
                      "(or configure a fresh build folder)")
endif()
message(STATUS "LibTorch ${Torch_VERSION} from ${Torch_DIR}")

# What our targets link: LibTorch's CPU libraries only. The wheel is built with CUDA, and
# TORCH_LIBRARIES forces libtorch_cuda with cuDNN, cuBLAS, NCCL, ... into every program
# (--no-as-needed), which each process then loads: measured 1.6 s and ~470 MB resident for
# `hyperparallel --version` on a 2-core machine, paid by every rank of every test. Nothing of
# ours uses them yet (docs/building.md "CUDA libraries").
#
# libstdc++ comes first: the wheel's libtorch.so and libtorch_cpu.so export their own copies of
# libstdc++'s newer symbols (std::filesystem among them, from the toolchain they were built
# with), and a program that lists them before libstdc++.so.6 binds to those copies at run time:
# measured, std::filesystem::remove_all jumps to address 0 (SIGSEGV) in a three-line program
# linked with -ltorch. Naming libstdc++ first puts it ahead in the search order. The installed
# package does the same (cmake/hyperparallelConfig.cmake.in; docs/building.md "libstdc++ first").
set(HP_TORCH_LIBRARIES torch_cpu c10)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  list(PREPEND HP_TORCH_LIBRARIES stdc++)
endif()
