# Two commands set everything up on a fresh Debian machine (as root):
#   make demo   setup + build + the built-in default job
#   make test   setup + build + all default tests
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
export CCACHE_DIR ?= $(HOME)/.cache/ccache
# The project's Python environment (scripts/setup.sh): LibTorch is its torch wheel.
HP_PYTHON ?= $(shell scripts/python_env.sh)/bin/python
CMAKE_CONFIGURE = cmake -G Ninja -DCMAKE_BUILD_TYPE=Release -DHP_PYTHON=$(HP_PYTHON)

.PHONY: all setup configure build test test-long test-asan test-asan-unit demo demo-4d bench fuzz clean

all: build

setup:
	@scripts/setup.sh

$(BUILD_DIR)/build.ninja:
	$(CMAKE_CONFIGURE) -S . -B $(BUILD_DIR)

configure: setup $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest -L default --output-on-failure -j 2

test-long: build
	cd $(BUILD_DIR) && ctest -L long --output-on-failure -j 1

# The demo: 4 local ranks fine-tune a tiny Qwen3 with FSDP (examples/demo_sft.yaml), report
# held-out accuracy before and after, export to output/demo_sft, then answer one prompt.
DEMO_PROMPT ?= Reverse the words: moon river stone bird cloud
demo: build
	$(BUILD_DIR)/hyperparallel train examples/demo_sft.yaml
	$(BUILD_DIR)/hyperparallel generate --model output/demo_sft --prompt "$(DEMO_PROMPT)"

# The flagship job from HyperParallel's YAML on 8 ranks (TP2 x CP2 x EP2 + FSDP2), its losses
# beside one process's (examples/hp_qwen3_moe_4d.yaml, docs/hyperparallel-yaml.md).
demo-4d: build
	scripts/demo_4d.sh $(BUILD_DIR)

# The tests built with ASan + UBSan in build-asan/ (a cold build takes longer than make test).
# Leaks are not checked: LibTorch keeps its globals to exit. test-asan-unit runs the component
# suites (CI does); test-asan runs every default suite.
ASAN_ENV = ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
build-asan/build.ninja:
	$(CMAKE_CONFIGURE) -S . -B build-asan -DHP_SANITIZE=ON

test-asan-unit: setup build-asan/build.ninja
	cmake --build build-asan -j $(JOBS) --target hp_tests hyperparallel
	cd build-asan && $(ASAN_ENV) ctest -L unit --output-on-failure -j 2

test-asan: setup build-asan/build.ninja
	cmake --build build-asan -j $(JOBS) --target hp_tests hyperparallel cpp_api_sft_steps fsdp_custom_module
	cd build-asan && $(ASAN_ENV) ctest -L default --output-on-failure -j 2

# libFuzzer targets (fuzz/) under ASan + UBSan, FUZZ_SECONDS each (default 60).
fuzz: setup
	scripts/fuzz.sh

bench: build
	scripts/bench_comm.sh $(BUILD_DIR)
	scripts/bench_fsdp.sh $(BUILD_DIR)
	scripts/bench_tp.sh $(BUILD_DIR)
	scripts/bench_ep.sh $(BUILD_DIR)
	scripts/bench_cp.sh $(BUILD_DIR)
	scripts/bench_pp.sh $(BUILD_DIR)
	scripts/bench_memory.sh $(BUILD_DIR)
	scripts/bench_models.sh $(BUILD_DIR)
	scripts/bench_tokenizer.sh $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR)
