# kiln: `make train` and `make test` work on a fresh machine (setup, build, run).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
LAUNCHER := $(if $(shell command -v ccache),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache,)

.PHONY: all setup configure build test test-cpp test-python test-fuzz train bench clean

all: build

setup:
	@scripts/setup.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(LAUNCHER) $(CMAKE_FLAGS)

configure: setup $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Every C++ test (CUDA tests skip with a message where there is no GPU).
test-cpp: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The Python package's tests, built in the same build dir (kiln's objects are shared with the C++ build).
test-python: configure
	cmake -S . -B $(BUILD) -DKILN_PYTHON=ON
	cmake --build $(BUILD) -j $(JOBS) --target kiln_python
	PYTHONPATH=$(BUILD)/python python3 -m pytest python/tests -q

# A short libFuzzer run of both checkpoint parsers under ASan + UBSan (corpora in fuzz/corpus).
test-fuzz: setup
	scripts/fuzz.sh 20

test: test-cpp test-python test-fuzz

# The main job: a small GPT trained on the CPU on the Python standard library (kiln train --help).
# Builds only the `kiln` command (not the tests and benchmarks) before it runs.
train: configure
	cmake --build $(BUILD) -j $(JOBS) --target kiln_cli
	$(BUILD)/kiln train

# The CPU benchmarks of the fused loss and FlexAttention at small shapes (GPU figures: scripts/gpu.sh).
bench: build
	$(BUILD)/bench/bench_lce --device cpu --tokens 512 --hidden 256 --vocab 8192
	$(BUILD)/bench/bench_flex --device cpu

# kiln on aarch64 (scripts/arm.sh): a cross build into build-arm/, then every CPU test under
# qemu-aarch64 with SVE at 128, 256 and 512 bits and with NEON only (and the SIMD kernel tests on
# A64FX's plain SVE), `kiln info` printing the Highway target the kernels dispatched to in each.
# Left out under qemu: the install check, Train.KillNineLosesOnlyStepsSinceCheckpoint (it execs
# an aarch64 child, which needs binfmt_misc) and FlexBlockMask.MillionTokenSlidingWindowIsFastAndSmall
# (a wall-clock bound for native speed).
.PHONY: test-arm
test-arm:
	JOBS=$(JOBS) scripts/arm.sh all

clean:
	rm -rf $(BUILD)
