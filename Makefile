# Thin wrapper around CMake: make, make test, make demo, make install.
BUILD   ?= build
PREFIX  ?= /usr/local
JOBS    ?= $(shell nproc)
NP      ?= 2
CMAKE_FLAGS ?=

# Debian packages the build, the tests and the demo need.
PACKAGES = cmake make g++ pkg-config libopenmpi-dev openmpi-bin libboost-program-options-dev \
           libboost-test-dev libopenblas-dev nlohmann-json3-dev \
           libhdf5-openmpi-dev hdf5-tools libpcre2-dev libyaml-cpp-dev libicu-dev

# mpirun refuses to start as root unless told; the demo may oversubscribe a small machine.
MPIRUN_FLAGS = --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root,)

.PHONY: all build deps test test-gpu test-gpu-ptx80 demo install clean

# A plain `make` on a fresh machine installs (as root) or names the missing packages first;
# `make build` (and test-gpu, install) leave the packages alone, for machines with no package mirror.
all: deps
	$(MAKE) build

deps:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
	  else \
	    echo "missing packages; install them with:"; \
	    echo "  sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# GPU suites need a GPU; they run with `make test-gpu` on a GPU machine.
test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE gpu

test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

# The A100 code path on a newer GPU: a build with compute_80 PTX only (the driver JIT-compiles it),
# in its own folder, then the GPU suites on it.
test-gpu-ptx80:
	$(MAKE) test-gpu BUILD=build-ptx80 CMAKE_FLAGS="$(CMAKE_FLAGS) -DSHARDLM_CUDA=ON -DSHARDLM_CUDA_ARCHS=80-virtual"
	@if cuobjdump --list-elf build-ptx80/bin/shardlm 2>/dev/null | grep -q sm_; then \
	  echo "build-ptx80/bin/shardlm holds SASS: not a PTX-only build"; exit 1; fi

demo: deps build
	mpirun -np $(NP) $(MPIRUN_FLAGS) $(BUILD)/bin/shardlm train input/demo.ini

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD)
