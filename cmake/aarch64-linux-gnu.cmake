# Cross build for 64-bit Arm Linux with Debian's cross compiler (g++-aarch64-linux-gnu) against
# the arm64 libraries of Debian multiarch (libpcre2-dev:arm64, libyaml-cpp0.7:arm64,
# libgtest-dev:arm64 in /usr/lib/aarch64-linux-gnu); `bash scripts/setup.sh --aarch64` installs
# all of it.
#   cmake -S . -B build-aarch64 -G Ninja --toolchain cmake/aarch64-linux-gnu.cmake
# ctest runs the test executables through qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Multiarch: the target's libraries and CMake packages sit in /usr/lib/aarch64-linux-gnu, next to
# the host's, so the default search (host prefixes, this architecture's lib/ subfolder) finds
# them; the header-only packages (nlohmann-json, CLI11) are the host's. pkg-config (PCRE2) reads
# the target's .pc files only.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)

# qemu runs the binaries on the multiarch arm64 runtime (/lib/ld-linux-aarch64.so.1, libc6:arm64,
# libstdc++6:arm64): `-L /`, whatever QEMU_LD_PREFIX says. Not -L /usr/aarch64-linux-gnu: that
# prefix holds the cross toolchain's ld.so (glibc 2.36-8cross1 on bookworm), but the loader still
# finds libc.so.6 in /lib/aarch64-linux-gnu (libc6:arm64, 2.36-9+deb12u14), and ld.so and libc
# from different builds hang in the first pthread_create.
find_program(HYBRIDLM_QEMU_AARCH64 qemu-aarch64)
if(HYBRIDLM_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${HYBRIDLM_QEMU_AARCH64} -L /)
endif()
