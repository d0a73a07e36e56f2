# kiln: `make train` and `make test` work on a fresh machine (setup, build, run).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
LAUNCHER := $(if $(shell command -v ccache),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache,)
# The CUDA backend: AUTO builds it where a GPU is visible, so `make train` on a machine without one
# builds the CPU library only; `make train KILN_CUDA=ON` asks for it. `make test` compiles it wherever
# nvcc is, GPU or not, so the CUDA code keeps compiling (its tests skip without a GPU).
KILN_CUDA ?=
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
TEST_CUDA := $(or $(KILN_CUDA),$(if $(NVCC),ON,AUTO))
# The tests' Python packages (nanobind, scikit-build-core, pytest, ml_dtypes) live in this venv.
VENV ?= $(BUILD)/venv

.PHONY: all setup configure configure-test build test test-cpp test-python test-fuzz train bench clean

all: build

setup:
	@scripts/setup.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(LAUNCHER) $(CMAKE_FLAGS) \
	  $(if $(KILN_CUDA),-DKILN_CUDA=$(KILN_CUDA))

configure: setup $(BUILD)/build.ninja
	$(if $(KILN_CUDA),cmake -S . -B $(BUILD) -DKILN_CUDA=$(KILN_CUDA) >/dev/null)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The test build: the CUDA code too where nvcc is (see KILN_CUDA above).
configure-test: setup $(BUILD)/build.ninja
	cmake -S . -B $(BUILD) -DKILN_CUDA=$(TEST_CUDA) >/dev/null

# Every C++ test (CUDA tests skip with a message where there is no GPU).
test-cpp: configure-test
	cmake --build $(BUILD) -j $(JOBS)
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The Python package's tests, built in the same build dir (kiln's objects are shared with the C++
# build) with the test venv's interpreter.
test-python: configure-test
	@scripts/setup.sh venv $(VENV)
	cmake -S . -B $(BUILD) -DKILN_PYTHON=ON -DPython_EXECUTABLE=$(abspath $(VENV))/bin/python >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target kiln_python
	PYTHONPATH=$(BUILD)/python $(VENV)/bin/python -m pytest python/tests -q

# A short libFuzzer run of both checkpoint parsers under ASan + UBSan (corpora in fuzz/corpus).
test-fuzz: setup
	scripts/fuzz.sh 20

test: test-cpp test-python test-fuzz

# The main job: a small GPT trained on the CPU on the Python standard library (kiln train --help).
TRAIN_TIME_NOTE := from scratch about 3 min on 2 idle cores, longer on a busy machine; ninja counts [done/total]
# Builds only the `kiln` command (not the tests and benchmarks) before it runs.
train: configure
	@echo "make train: building the kiln command, $$(grep -qE '^KILN_CUDA_BUILT:INTERNAL=(ON|1|TRUE)' $(BUILD)/CMakeCache.txt && echo 'CPU + CUDA' || echo 'CPU only') ($(TRAIN_TIME_NOTE))"
	cmake --build $(BUILD) -j $(JOBS) --target kiln_cli
	$(BUILD)/kiln train

# The CPU benchmarks of the fused loss and FlexAttention at small shapes (GPU figures: scripts/gpu.sh).
bench: build
	$(BUILD)/bench/bench_lce --device cpu --tokens 512 --hidden 256 --vocab 8192
	$(BUILD)/bench/bench_flex --device cpu

# kiln on aarch64 (scripts/arm.sh): a cross build into build-arm/, then every CPU test under
# qemu-aarch64 with SVE at 128, 256 and 512 bits and with NEON only (and the SIMD kernel tests on
# A64FX's plain SVE), `kiln info` printing the Highway target the kernels dispatched to in each.
# Left out under qemu: the install check, the CLI and docs checks and
# FlexBlockMask.MillionTokenSlidingWindowIsFastAndSmall (a wall-clock bound for native speed); tests
# that start child processes start them through qemu too.
.PHONY: test-arm
test-arm:
	JOBS=$(JOBS) scripts/arm.sh all

clean:
	rm -rf $(BUILD)
