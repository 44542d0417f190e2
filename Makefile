# Two entry points for a fresh machine: `make run` and `make test` (see README.md).
BUILD ?= build
JOBS ?= $(shell nproc)
# ccache keys on paths relative to the checkout, so a fresh clone (CI) reuses earlier objects.
export CCACHE_BASEDIR := $(CURDIR)
# Sanitizer and fuzz builds: light optimisation and line tables only (they exist to find bugs).
SAN_FLAGS = -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" -DCMAKE_C_FLAGS_RELEASE="-O1 -g1"
# The model `make run` generates from: the one this engine trained (scripts/train_default_model.sh).
DEFAULT_MODEL ?= models/default

.PHONY: setup build run test test-sanitize fuzz-smoke test-aarch64 ci bench clean

setup:
	bash scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/hybridlm inspect -m $(DEFAULT_MODEL)
	$(BUILD)/hybridlm generate -m $(DEFAULT_MODEL) -p "And God said" -n 48 --seed 1 --temp 0.7

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The whole suite built with AddressSanitizer + UndefinedBehaviorSanitizer (no recovery).
test-sanitize: setup
	cmake -S . -B build-asan -G Ninja $(SAN_FLAGS) -DHYBRIDLM_SANITIZE=ON
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

# Every libFuzzer target for FUZZ_SECONDS each (scripts/fuzz.sh; longer runs: docs/security.md).
FUZZ_SECONDS ?= 60
fuzz-smoke: setup
	bash scripts/fuzz.sh $(FUZZ_SECONDS)

# The portable build on another CPU: the project cross-compiled for aarch64
# (cmake/aarch64-linux-gnu.cmake: Debian's g++-aarch64-linux-gnu and arm64 multiarch libraries,
# -Werror as everywhere) and its ctest suite run under qemu-aarch64 (less four CLI-only tests and
# the 16-bit-KV model invariants; see tests/runtime, tests/models). The C++ tests
# and fuzz replays run through CMAKE_CROSSCOMPILING_EMULATOR; cli_test, reference_numpy and
# tokenizer_vs_hf_js hand their host Python / Node driver a script that runs the emulated binary;
# reference_selfcheck and the two fixture makers are host Python only. The kernels have only the
# portable path there, so kernels_test runs once (its AVX2 / portable re-runs are x86-64 tests).
# `setup.sh --aarch64` adds dpkg's arm64 architecture and installs the cross compiler, qemu-user
# and the arm64 libraries.
test-aarch64:
	bash scripts/setup.sh --aarch64
	cmake -S . -B build-aarch64 -G Ninja -DCMAKE_BUILD_TYPE=Release --toolchain cmake/aarch64-linux-gnu.cmake
	cmake --build build-aarch64 -j $(JOBS)
	cd build-aarch64 && ctest --output-on-failure -j $(JOBS)

# What CI runs (.ci/run): the README's test command, then the sanitizer suite, the fuzz smoke run
# and the aarch64 cross build's suite under qemu.
ci: test test-sanitize fuzz-smoke test-aarch64

clean:
	rm -rf $(BUILD)
