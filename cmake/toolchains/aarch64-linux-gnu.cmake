# Cross build for aarch64 Linux with Debian's g++-aarch64-linux-gnu (scripts/arm.sh drives it).
# KILN_ARM_SYSROOT: a folder holding the arm64 builds of kiln's dependencies under usr/ (the
# unpacked arm64 .debs); the cross toolchain's own /usr/aarch64-linux-gnu provides libc,
# libstdc++ and libgomp. Tests run through qemu-aarch64, its CPU model taken from QEMU_CPU.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_CUDA_COMPILER "")  # no CUDA in this build; also spares check_language(CUDA)

# try_compile projects re-read this file: hand them the sysroot too.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES KILN_ARM_SYSROOT)
if(NOT KILN_ARM_SYSROOT)
  message(FATAL_ERROR "aarch64 toolchain: set KILN_ARM_SYSROOT to the folder of arm64 dependencies")
endif()
set(_kiln_arm_lib "${KILN_ARM_SYSROOT}/usr/lib/aarch64-linux-gnu")

set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu "${KILN_ARM_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# The compiler searches the sysroot's headers as a native one searches /usr/include (cblas.h is
# in the multiarch folder).
set(CMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES
    "${KILN_ARM_SYSROOT}/usr/include/aarch64-linux-gnu" "${KILN_ARM_SYSROOT}/usr/include")

# The linker resolves what OpenBLAS itself needs (libgfortran) from the same folders.
# Every folder of the sysroot that holds libraries: Gloo's package keeps its own in usr/lib, libnl
# (which ibverbs, and so Gloo, loads) in lib/aarch64-linux-gnu.
string(JOIN ":" _kiln_arm_lib_path "${_kiln_arm_lib}" "${_kiln_arm_lib}/openblas-pthread"
       "${KILN_ARM_SYSROOT}/lib/aarch64-linux-gnu" "${KILN_ARM_SYSROOT}/usr/lib")
set(_kiln_arm_link "-Wl,-rpath-link,${_kiln_arm_lib_path}")
set(CMAKE_EXE_LINKER_FLAGS_INIT "${_kiln_arm_link}")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "${_kiln_arm_link}")

# CTest and gtest_discover_tests run the aarch64 binaries through qemu-user.
find_program(KILN_QEMU_AARCH64 qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR
    "${KILN_QEMU_AARCH64};-L;/usr/aarch64-linux-gnu;-E;LD_LIBRARY_PATH=${_kiln_arm_lib_path}")
