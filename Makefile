# Thin wrapper around CMake: make, make test, make demo, make install; make deps installs packages (root).
BUILD   ?= build
PREFIX  ?= /usr/local
JOBS    ?= $(shell nproc)
NP      ?= 2
CMAKE_FLAGS ?=

# The packages the build, the tests and the demo need, by package manager. `make deps` installs them
# (as root) and is the only target that touches the system; `make` finds the libraries from the
# system, modules or prefixes (cmake/ShardlmDeps.cmake) and names a missing one.
APT_PACKAGES = cmake make g++ pkg-config libopenmpi-dev openmpi-bin libboost-program-options-dev \
               libboost-test-dev libopenblas-dev nlohmann-json3-dev \
               libhdf5-openmpi-dev hdf5-tools libpcre2-dev libyaml-cpp-dev libicu-dev
# RHEL, Rocky, Alma 9 (with EPEL and CRB): the MPI compilers then come from `module load mpi/openmpi-x86_64`.
DNF_PACKAGES = cmake make gcc-c++ pkgconf-pkg-config openmpi-devel boost-devel openblas-devel json-devel \
               hdf5-openmpi-devel pcre2-devel yaml-cpp-devel libicu-devel environment-modules

# mpirun refuses to start as root unless told; the demo may oversubscribe a small machine.
MPIRUN_FLAGS = --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root,)

.PHONY: all build deps test test-gpu test-gpu-ptx80 demo install clean

# A plain `make` builds with what the machine has (no package manager, no root).
all: build

# Installs the missing packages with apt-get (Debian, Ubuntu) or dnf (RHEL-family) as root; as
# anyone else, prints the command (or the modules to load instead).
deps:
	@if command -v apt-get >/dev/null 2>&1; then \
	  missing=""; for p in $(APT_PACKAGES); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	  done; install="apt-get install -y"; update="apt-get update -qq"; \
	elif command -v dnf >/dev/null 2>&1; then \
	  missing=""; for p in $(DNF_PACKAGES); do rpm -q $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  install="dnf install -y"; update="dnf -y install epel-release >/dev/null 2>&1; dnf config-manager --set-enabled crb >/dev/null 2>&1 || true"; \
	else \
	  echo "make deps: neither apt-get nor dnf here; load the modules docs/cluster.md names (Building without root)"; exit 1; \
	fi; \
	if [ -z "$$missing" ]; then echo "make deps: every package is installed"; exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	  echo "installing:$$missing"; \
	  eval "$$update" && DEBIAN_FRONTEND=noninteractive $$install $$missing >/dev/null || exit 1; \
	else \
	  echo "missing packages; as root: $$install$$missing"; \
	  echo "without root: load the site's modules instead (docs/cluster.md, Building without root)"; exit 1; \
	fi

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# GPU suites need a GPU; they run with `make test-gpu` on a GPU machine.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE gpu

test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

# The A100 code path on a newer GPU: a build with compute_80 PTX only (the driver JIT-compiles it),
# in its own folder, then the GPU suites on it.
test-gpu-ptx80:
	$(MAKE) test-gpu BUILD=build-ptx80 CMAKE_FLAGS="$(CMAKE_FLAGS) -DSHARDLM_CUDA=ON -DSHARDLM_CUDA_ARCHS=80-virtual"
	@if cuobjdump --list-elf build-ptx80/bin/shardlm 2>/dev/null | grep -q sm_; then \
	  echo "build-ptx80/bin/shardlm holds SASS: not a PTX-only build"; exit 1; fi

demo: build
	mpirun -np $(NP) $(MPIRUN_FLAGS) $(BUILD)/bin/shardlm train input/demo.ini

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD)
