# Cross-build for 64-bit ARM Linux (Raspberry Pi OS 64-bit, Jetson, other aarch64 boards) on a
# Debian/Ubuntu x86-64 host with its cross compilers:
#   apt-get install g++-aarch64-linux-gnu libc6-dev-arm64-cross   (`make arm-system`)
#   cmake -S runtime/capi -B build/capi-aarch64-linux-gnu \
#     -DCMAKE_TOOLCHAIN_FILE=runtime/capi/cmake/aarch64-linux-gnu.cmake \
#     -DTVM_ROOT=<unzipped aarch64 tvm wheel>/tvm -DTVM_FFI_ROOT=<unzipped aarch64 tvm-ffi wheel>/tvm_ffi
# (`make capi HOST=aarch64-linux-gnu` does all of it). For another GNU triple with Debian's naming
# (arm-linux-gnueabihf, riscv64-linux-gnu, ...) pass -DSPC_CROSS_TRIPLE=<triple> (and, where
# `uname -m` differs from the triple's first word, -DSPC_CROSS_PROCESSOR=<it>), or copy this file.
if(NOT SPC_CROSS_TRIPLE)
  set(SPC_CROSS_TRIPLE aarch64-linux-gnu)
endif()
if(NOT SPC_CROSS_PROCESSOR)
  string(REGEX REPLACE "-.*" "" SPC_CROSS_PROCESSOR "${SPC_CROSS_TRIPLE}")
endif()
# try_compile projects re-read this file: hand them the choices made on the command line
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES SPC_CROSS_TRIPLE SPC_CROSS_PROCESSOR)

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR "${SPC_CROSS_PROCESSOR}")
set(CMAKE_C_COMPILER "${SPC_CROSS_TRIPLE}-gcc")
set(CMAKE_CXX_COMPILER "${SPC_CROSS_TRIPLE}-g++")
# the target's headers and libraries (libc6-dev-arm64-cross installs them here)
set(CMAKE_FIND_ROOT_PATH "/usr/${SPC_CROSS_TRIPLE}")
# programs (python, ...) are the build host's; libraries, headers and packages only the target's.
# The TVM runtime libraries live outside the root: the C API's CMakeLists finds them with
# NO_CMAKE_FIND_ROOT_PATH.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# programs built here run on the target, not here (qemu-aarch64 -L /usr/aarch64-linux-gnu does)
set(CMAKE_CROSSCOMPILING_EMULATOR "qemu-${SPC_CROSS_PROCESSOR};-L;/usr/${SPC_CROSS_TRIPLE}")
# GCC's aarch64 note that std::pair<double, double> is passed as GCC >= 10.1 does: nothing here was
# built by an older GCC
set(CMAKE_CXX_FLAGS_INIT "-Wno-psabi")
