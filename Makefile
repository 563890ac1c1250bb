# Thin wrapper over CMake. `make` builds, `make test` runs every test,
# `make run` generates from the tiny model in tests/fixtures.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all build test run asan asan-test cuda clean

all: build

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

run: build
	$(BUILD)/vllm generate --model tests/fixtures/nh_dense --prompt-ids 1,2,3,4,5 --max-tokens 16

asan:
	@$(MAKE) build BUILD=build-asan CMAKE_FLAGS="-DVLLM_ASAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo"

asan-test: asan
	cd build-asan && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

cuda:
	@$(MAKE) build BUILD=build-cuda CMAKE_FLAGS="-DVLLM_CUDA=ON"

clean:
	rm -rf build build-asan build-cuda
