# The libraries shardlm builds against, found without root: from the system's packages (Debian,
# RHEL-family), from an environment module (which puts compilers on PATH and sets *_ROOT / *_HOME or
# PKG_CONFIG_PATH), or from a prefix given as a CMake or environment variable (HDF5_ROOT, BOOST_ROOT,
# OPENBLAS_ROOT, nlohmann_json_ROOT, ...; MPI from mpicc on PATH or MPI_HOME). A missing one stops the
# configure step with one message naming it as a module and as the dnf and apt package to install.
#
# Out: the imported targets shardlm links (MPI::MPI_C, Boost::program_options,
# Boost::unit_test_framework, nlohmann_json::nlohmann_json, shardlm::openblas, shardlm::hdf5,
# PkgConfig::PCRE2, PkgConfig::ICU and, when found, PkgConfig::YAMLCPP with YAMLCPP_FOUND).

# Stops with what to load or install: `what` (what it is for), a module name, the dnf and apt
# packages, and how to point at an installation in a prefix (`where`).
function(shardlm_missing what module dnf apt where)
  message(FATAL_ERROR "shardlm needs ${what}, which was not found. On a cluster: `module load ${module}` "
                      "(or ${where}); RHEL, Rocky, Alma (EPEL and CRB enabled): "
                      "`dnf install ${dnf}`; Debian, Ubuntu: `apt-get install ${apt}`; or `make deps` as root "
                      "(docs/cluster.md, \"Building without root\").")
endfunction()

find_package(MPI COMPONENTS C)
if(NOT MPI_C_FOUND)
  shardlm_missing("MPI (mpicc)" "openmpi" "openmpi-devel (then `module load mpi/openmpi-x86_64`)"
                  "libopenmpi-dev openmpi-bin" "set MPI_HOME to its prefix")
endif()

find_package(Boost 1.74 COMPONENTS program_options unit_test_framework)
if(NOT Boost_FOUND)
  shardlm_missing("Boost 1.74+ (program_options, unit_test_framework)" "boost" "boost-devel"
                  "libboost-program-options-dev libboost-test-dev" "set BOOST_ROOT to its prefix")
endif()

find_package(nlohmann_json 3 QUIET)
if(NOT nlohmann_json_FOUND)
  shardlm_missing("nlohmann_json 3 (a header-only JSON library)" "nlohmann-json" "json-devel" "nlohmann-json3-dev"
                  "set nlohmann_json_ROOT to its prefix")
endif()

find_package(PkgConfig REQUIRED)

# A pkg-config module, else a library and header under <NAME>_ROOT (environment or CMake) or the
# default paths: the interface target `target` (empty `library`: pkg-config only).
function(shardlm_find_library target pc_module prefix_var library header)
  pkg_check_modules(_shardlm_pc QUIET IMPORTED_TARGET GLOBAL ${pc_module})
  if(_shardlm_pc_FOUND)
    add_library(${target} ALIAS PkgConfig::_shardlm_pc)
    return()
  endif()
  set(_hints "")
  if(DEFINED ${prefix_var})
    list(APPEND _hints "${${prefix_var}}")
  elseif(DEFINED ENV{${prefix_var}})
    list(APPEND _hints "$ENV{${prefix_var}}")
  endif()
  find_library(_shardlm_lib_${library} ${library} HINTS ${_hints} PATH_SUFFIXES lib lib64)
  find_path(_shardlm_inc_${library} ${header} HINTS ${_hints} PATH_SUFFIXES include include/openblas)
  if(_shardlm_lib_${library} AND _shardlm_inc_${library})
    add_library(${target} INTERFACE IMPORTED GLOBAL)
    target_link_libraries(${target} INTERFACE "${_shardlm_lib_${library}}")
    target_include_directories(${target} INTERFACE "${_shardlm_inc_${library}}")
  endif()
endfunction()

# OpenBLAS: openblas.pc (Debian, EPEL, Spack), else libopenblas under OPENBLAS_ROOT (an OpenBLAS module).
shardlm_find_library(shardlm::openblas openblas OPENBLAS_ROOT openblas cblas.h)
if(NOT TARGET shardlm::openblas)
  shardlm_missing("OpenBLAS" "openblas" "openblas-devel" "libopenblas-dev" "set OPENBLAS_ROOT to its prefix")
endif()

# Parallel HDF5 (the MPI-IO driver) for the sharded checkpoints: HDF5_ROOT or an HDF5 module's h5pcc
# first (a site's own build), else Debian's hdf5-openmpi.pc, else any parallel HDF5 CMake finds.
set(_shardlm_hdf5_root "")
if(DEFINED HDF5_ROOT)
  set(_shardlm_hdf5_root "${HDF5_ROOT}")
elseif(DEFINED ENV{HDF5_ROOT})
  set(_shardlm_hdf5_root "$ENV{HDF5_ROOT}")
endif()
if(NOT _shardlm_hdf5_root)
  pkg_check_modules(_shardlm_hdf5_pc QUIET IMPORTED_TARGET GLOBAL hdf5-openmpi)
endif()
if(_shardlm_hdf5_pc_FOUND)
  add_library(shardlm::hdf5 ALIAS PkgConfig::_shardlm_hdf5_pc)
else()
  set(HDF5_PREFER_PARALLEL ON)
  find_package(HDF5 COMPONENTS C)
  if(HDF5_FOUND AND HDF5_IS_PARALLEL)
    add_library(shardlm::hdf5 INTERFACE IMPORTED GLOBAL)
    target_link_libraries(shardlm::hdf5 INTERFACE ${HDF5_C_LIBRARIES})
    target_include_directories(shardlm::hdf5 INTERFACE ${HDF5_C_INCLUDE_DIRS})
    target_compile_definitions(shardlm::hdf5 INTERFACE ${HDF5_C_DEFINITIONS})
  elseif(HDF5_FOUND)
    message(FATAL_ERROR "HDF5 at ${HDF5_C_INCLUDE_DIRS} is a serial build; shardlm's checkpoints need parallel HDF5 "
                        "(an MPI build): `module load` an hdf5 module built with MPI (and set HDF5_ROOT), "
                        "`dnf install hdf5-openmpi-devel` or `apt-get install libhdf5-openmpi-dev`")
  else()
    shardlm_missing("parallel HDF5 (built with MPI)" "hdf5 (an MPI build, e.g. hdf5/1.14-openmpi)"
                    "hdf5-openmpi-devel" "libhdf5-openmpi-dev hdf5-tools" "set HDF5_ROOT to its prefix")
  endif()
endif()

# PCRE2 (with its JIT) runs the Unicode regexes of Hugging Face tokenizer.json pre-tokenizers.
pkg_check_modules(PCRE2 IMPORTED_TARGET libpcre2-8)
if(NOT PCRE2_FOUND)
  shardlm_missing("PCRE2 (libpcre2-8)" "pcre2" "pcre2-devel" "libpcre2-dev" "add its lib/pkgconfig to PKG_CONFIG_PATH")
endif()
# ICU gives SQuAD's answer normalisation Python 3's lower-casing and character classes.
pkg_check_modules(ICU IMPORTED_TARGET icu-uc)
if(NOT ICU_FOUND)
  shardlm_missing("ICU (icu-uc)" "icu4c" "libicu-devel" "libicu-dev" "add its lib/pkgconfig to PKG_CONFIG_PATH")
endif()
# yaml-cpp reads Accelerate's config files (`shardlm import-accelerate`); without it (a GPU machine
# with no package mirror) the rest builds and that command says what to install.
pkg_check_modules(YAMLCPP IMPORTED_TARGET yaml-cpp)
if(NOT YAMLCPP_FOUND)
  message(WARNING "yaml-cpp not found (module yaml-cpp; dnf: yaml-cpp-devel; apt: libyaml-cpp-dev): "
                  "`shardlm import-accelerate` is left out")
endif()
