# nibble: top-level entry points. A fresh machine needs only `make demo` and `make test`.
NIBBLE_SHARED ?= $(abspath ../shared)
NIBBLE_CUDA   ?= auto
BUILD_TYPE    ?= Release
BUILD_DIR     ?= build
JOBS          ?= $(shell nproc)
NIBBLE        := $(BUILD_DIR)/bin/nibble
DEMO_OUT      ?= demo-out

export NIBBLE_SHARED

.PHONY: all deps configure build test demo asan debug fuzz clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DNIBBLE_CUDA=$(NIBBLE_CUDA) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# AddressSanitizer + UBSan build and test run, in build-asan/.
asan:
	@$(MAKE) --no-print-directory test BUILD_TYPE=Asan BUILD_DIR=build-asan NIBBLE_CUDA=off

debug:
	@$(MAKE) --no-print-directory build BUILD_TYPE=Debug BUILD_DIR=build-debug

# libFuzzer targets for the safetensors, GGUF and .npy readers, GGUF models, the tokenizer, config.json and tokenizer.json, rivals' quantized linears (clang); see docs/FUZZING.md.
fuzz:
	@scripts/install-deps.sh --fuzz
	@CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DNIBBLE_CUDA=off -DNIBBLE_TESTS=OFF -DNIBBLE_FUZZ=ON >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzz_safetensors fuzz_gguf fuzz_gguf_model fuzz_tokenizer fuzz_hf_json fuzz_npy fuzz_rival

demo: build
	@scripts/demo.sh $(NIBBLE) $(NIBBLE_SHARED) $(DEMO_OUT)

clean:
	rm -rf build build-asan build-debug build-fuzz $(DEMO_OUT)
