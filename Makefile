# Two entry points for a fresh machine: `make run` and `make test` (see README.md).
BUILD ?= build
JOBS ?= $(shell nproc)
DEMO ?= models/demo-mamba2

.PHONY: setup build run test bench clean

setup:
	bash scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

$(DEMO)/config.json:
	/usr/bin/python3 tools/make_test_checkpoint.py --preset mamba2-tiny --seed 1 --tokenizer ../shared/data/tokenizers/gpt-neox-20b/tokenizer.json --out $(DEMO)

run: build $(DEMO)/config.json
	@echo "NOTE: $(DEMO) holds RANDOM weights (no trained model ships yet); the text below is noise."
	$(BUILD)/hybridlm inspect -m $(DEMO)
	$(BUILD)/hybridlm generate -m $(DEMO) -p "The history of state space models" -n 48 --seed 1

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD)
