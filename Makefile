# Thin wrapper over CMake. `make demo` and `make test` install what is missing first.
BUILD   ?= build
TYPE    ?= Release
JOBS    ?= $(shell nproc)
PYTHON  ?= /usr/bin/python3
CMAKE_ARGS ?=
# ON: every compiler warning fails the build (CI sets it).
WERROR ?= OFF
PREFIX  ?= /usr/local

.PHONY: all deps configure build demo test test-asan test-tsan bench install clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(TYPE) -DPython3_EXECUTABLE=$(PYTHON) -DDLCP_WERROR=$(WERROR) $(CMAKE_ARGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 -j 2

# dlcpd, dlcpctl, dlcp-bench, libdlcp.so with its headers, CMake package and pkg-config file, and
# the Python package, under PREFIX (docs/deploy.md, "Installing from source"). DESTDIR stages it.
# The prefix is configured, not only passed to --install: it decides where python3 will look.
install: build
	cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) > /dev/null
	cmake --install $(BUILD)

# Configures a sanitizer build: $(1) the folder, $(2) optimization and debug flags, $(3) the
# sanitizer flags, for compiling and linking alike.
# As a unity build (CMake batches each library's sources into a few compiler runs), which compiles
# a quarter to a third faster: the libraries' sources share most of their headers. Two helpers of
# one name in the anonymous namespaces of one library's files then collide; name them apart, or
# set the target's UNITY_BUILD off as proto/ does. The plain build (make build, make test) stays
# one file per compiler run, so it still catches a file that misses an include of its own.
sanitizer_build = cmake -S . -B $(1) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=$(PYTHON) \
  -DDLCP_WERROR=$(WERROR) $(CMAKE_ARGS) \
  -DCMAKE_UNITY_BUILD=ON -DDLCP_WITH_CUDA=OFF "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$(2)" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$(2)" \
  "-DCMAKE_CXX_FLAGS=$(3)" "-DCMAKE_C_FLAGS=$(3)" "-DCMAKE_EXE_LINKER_FLAGS=$(3)" "-DCMAKE_SHARED_LINKER_FLAGS=$(3)"

# ASan + UBSan over every unit and integration test (the real binaries run sanitized too).
# Not here: the fuzz test (built with its own sanitizers), the manifest and image checks (no C++),
# the soak test (sanitizer quarantine distorts memory growth), the Python suites (an ASan-built
# extension cannot load into the uninstrumented interpreter; the C++ paths they drive run here),
# and the install test (it builds programs of its own, without the sanitizer runtime).
# Built at -O1 (what ASan's authors advise) with line tables only (-g1): reports still name file
# and line, and the build, CI's longest step, takes about two thirds of the time -O2 -g takes.
# Without the CUDA packer: nvcc's code is not instrumented, and no GPU runs these tests in CI.
SAN_FLAGS = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
SAN_OPT = -O1 -g1 -DNDEBUG
test-asan: deps
	$(call sanitizer_build,build-asan,$(SAN_OPT),$(SAN_FLAGS))
	cmake --build build-asan -j $(JOBS) --target dlcp_tests
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure --timeout 600 -j 2 -E "^fuzz$$|k8s_manifests|docker_lockstep|Soak|Netbed|Python|RdmaVm|Install"

# TSan over the reduction engine, the transports, the round state and the in-process client
# tests. Debian's gRPC and Abseil are not built with TSan, so reports inside them are suppressed
# (tests/tsan.supp); reports in dlcp's own code still fail the run.
# At -O1, as for ASan: the build is nearly all of this step and compiles a quarter faster than at
# -O2, and these tests take seconds either way.
TSAN_FLAGS = -fsanitize=thread
TSAN_OPT = -O1 -g1 -DNDEBUG
TSAN_TESTS = engine_test transport_test address_test round_test loss_tracker_test allreduce_test bounded_loss_test client_errors_test \
  data_plane_validation_test \
  result_requests_test key_rotation_test key_ring_test \
  failover_test regroup_barrier_test packer_test timeline_writer_test straggler_board_test shm_test stage_steps_test \
  host_broker_test spare_buffers_test
test-tsan: deps
	$(call sanitizer_build,build-tsan,$(TSAN_OPT),$(TSAN_FLAGS))
	cmake --build build-tsan -j $(JOBS) --target $(TSAN_TESTS)
	for t in $(TSAN_TESTS); do \
	  TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1" \
	    build-tsan/tests/$$t --gtest_brief=1 || exit 1; \
	done

bench: build
	@bash bench/run_all.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-tsan
