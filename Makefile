# Two entry points for a fresh machine: `make run` and `make test` (see README.md).
BUILD ?= build
JOBS ?= $(shell nproc)
# ccache keys on paths relative to the checkout, so a fresh clone (CI) reuses earlier objects.
export CCACHE_BASEDIR := $(CURDIR)
# Sanitizer and fuzz builds: light optimisation and line tables only (they exist to find bugs).
SAN_FLAGS = -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" -DCMAKE_C_FLAGS_RELEASE="-O1 -g1"
DEMO ?= models/demo-mamba2

.PHONY: setup build run test test-sanitize fuzz-smoke ci bench clean

setup:
	bash scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

$(DEMO)/config.json:
	/usr/bin/python3 tools/make_test_checkpoint.py --preset mamba2-tiny --seed 1 --tokenizer tests/data/tokenizers/gpt-neox-20b/tokenizer.json --out $(DEMO)

run: build $(DEMO)/config.json
	@echo "NOTE: $(DEMO) holds RANDOM weights (no trained model ships yet); the text below is noise."
	$(BUILD)/hybridlm inspect -m $(DEMO)
	$(BUILD)/hybridlm generate -m $(DEMO) -p "The history of state space models" -n 48 --seed 1

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

# What CI runs (.ci/run): the README's test command, then the sanitizer suite and the fuzz smoke run.
ci: test test-sanitize fuzz-smoke

clean:
	rm -rf $(BUILD)
