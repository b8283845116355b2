# Thin wrapper over CMake. `make demo` and `make test` install what is missing first.
BUILD   ?= build
TYPE    ?= Release
JOBS    ?= $(shell nproc)
PYTHON  ?= /usr/bin/python3
CMAKE_ARGS ?=

.PHONY: all deps configure build demo test bench clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(TYPE) -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_ARGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 -j 2

bench: build
	@bash bench/run_all.sh $(BUILD)

clean:
	rm -rf $(BUILD)
