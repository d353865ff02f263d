# The CUDA toolkit, its host compiler, NCCL and cuDNN, picked coherently (CUDA 11.8 to 13).
#
# One toolkit decides everything: the nvcc of CMAKE_CUDA_COMPILER or CUDACXX, else
# CUDAToolkit_ROOT/bin/nvcc, else nvcc on PATH, else CUDA_HOME or CUDA_PATH/bin/nvcc, else
# /usr/local/cuda/bin/nvcc. Its own ptxas is put
# first on the compiler's PATH (another toolkit's ptxas earlier on PATH cannot compile for it), its
# headers and cuBLASLt come from find_package(CUDAToolkit) of that compiler, the host compiler is
# one it supports (g++-N picked when the default g++ is too new), NCCL comes from NCCL_HOME /
# NCCL_ROOT or beside the toolkit (its nccl.h staged alone when it sits among another toolkit's
# headers), cuDNN 9 from CUDNN_ROOT or the toolkit, and the default architectures follow the toolkit.
#
# In: SHARDLM_CUDA (AUTO/ON/OFF), SHARDLM_CUDNN, SHARDLM_CUDA_ARCHS. Out: SHARDLM_HAVE_CUDA,
# SHARDLM_HAVE_CUDNN, SHARDLM_CUDA_ARCHS, NCCL_INCLUDE_DIR, NCCL_LIBRARY, CUDNN_INCLUDE_DIR,
# CUDNN_LIBRARY, and the summary line.

# The first of the given settings that is set, as a CMake variable or else in the environment.
function(_shardlm_setting out)
  foreach(name ${ARGN})
    if(DEFINED ${name})
      set(${out} "${${name}}" PARENT_SCOPE)
      return()
    elseif(DEFINED ENV{${name}})
      set(${out} "$ENV{${name}}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

# ---- the compiler, before enable_language(CUDA) ----
_shardlm_setting(_shardlm_root CUDAToolkit_ROOT)
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  if(_shardlm_root)
    if(NOT EXISTS "${_shardlm_root}/bin/nvcc")
      message(FATAL_ERROR "CUDAToolkit_ROOT=${_shardlm_root} has no bin/nvcc")
    endif()
    set(CMAKE_CUDA_COMPILER "${_shardlm_root}/bin/nvcc")
  else()
    find_program(_shardlm_nvcc_on_path nvcc)
    _shardlm_setting(_shardlm_cuda_home CUDA_HOME CUDA_PATH)  # what CUDA modules set beside PATH
    if(_shardlm_nvcc_on_path)
      set(CMAKE_CUDA_COMPILER "${_shardlm_nvcc_on_path}")
    elseif(_shardlm_cuda_home AND EXISTS "${_shardlm_cuda_home}/bin/nvcc")
      set(CMAKE_CUDA_COMPILER "${_shardlm_cuda_home}/bin/nvcc")
    elseif(EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
  endif()
elseif(NOT CMAKE_CUDA_COMPILER)
  set(CMAKE_CUDA_COMPILER "$ENV{CUDACXX}")
endif()

set(SHARDLM_HAVE_CUDA OFF)
if(CMAKE_CUDA_COMPILER)
  execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --version OUTPUT_VARIABLE _shardlm_nvcc_text
                  RESULT_VARIABLE _shardlm_nvcc_rc ERROR_QUIET)
  string(REGEX MATCH "release ([0-9]+)\\.([0-9]+)" _shardlm_release "${_shardlm_nvcc_text}")
  if(NOT _shardlm_nvcc_rc EQUAL 0 OR NOT _shardlm_release)
    message(FATAL_ERROR "${CMAKE_CUDA_COMPILER} --version does not run or says no release")
  endif()
  set(_shardlm_cuda_major ${CMAKE_MATCH_1})
  set(_shardlm_cuda_minor ${CMAKE_MATCH_2})
  set(_shardlm_cuda_version "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
  if(_shardlm_cuda_version VERSION_LESS 11.8)
    message(FATAL_ERROR "nvcc ${CMAKE_CUDA_COMPILER} is CUDA ${_shardlm_cuda_version}; shardlm needs 11.8 or newer")
  endif()

  # The toolkit's own ptxas: beside its nvcc (or the real nvcc a wrapper script execs, as Debian's
  # /usr/bin/nvcc does), of the same release.
  get_filename_component(_shardlm_nvcc_dir "${CMAKE_CUDA_COMPILER}" DIRECTORY)
  get_filename_component(_shardlm_nvcc_real "${CMAKE_CUDA_COMPILER}" REALPATH)
  get_filename_component(_shardlm_nvcc_real_dir "${_shardlm_nvcc_real}" DIRECTORY)
  file(STRINGS "${CMAKE_CUDA_COMPILER}" _shardlm_exec REGEX "^exec .*/nvcc" LIMIT_COUNT 1 LIMIT_INPUT 4096)
  if(_shardlm_exec)
    string(REGEX REPLACE "^exec +\"?([^ \"]*)/nvcc.*" "\\1" _shardlm_exec_dir "${_shardlm_exec}")
  endif()
  find_program(SHARDLM_PTXAS ptxas HINTS ${_shardlm_nvcc_dir} ${_shardlm_nvcc_real_dir} ${_shardlm_exec_dir}
               NO_DEFAULT_PATH)
  if(NOT SHARDLM_PTXAS)
    message(FATAL_ERROR "no ptxas beside ${CMAKE_CUDA_COMPILER}: the toolkit is incomplete")
  endif()
  execute_process(COMMAND "${SHARDLM_PTXAS}" --version OUTPUT_VARIABLE _shardlm_ptxas_text ERROR_QUIET)
  if(NOT _shardlm_ptxas_text MATCHES "release ${_shardlm_cuda_major}\\.${_shardlm_cuda_minor}")
    message(FATAL_ERROR "${SHARDLM_PTXAS} is not CUDA ${_shardlm_cuda_version}'s ptxas (the toolkit of "
                        "${CMAKE_CUDA_COMPILER}); pass -DSHARDLM_PTXAS=<that toolkit>/bin/ptxas")
  endif()
  get_filename_component(_shardlm_ptxas_dir "${SHARDLM_PTXAS}" DIRECTORY)

  # A host compiler this nvcc supports: g++ up to 11 for CUDA 11.8, 12 for 12.0-12.3, 13 for
  # 12.4-12.9, 14 for 13.x.
  if(_shardlm_cuda_version VERSION_LESS 12.0)
    set(_shardlm_gcc_max 11)
  elseif(_shardlm_cuda_version VERSION_LESS 12.4)
    set(_shardlm_gcc_max 12)
  elseif(_shardlm_cuda_version VERSION_LESS 13.0)
    set(_shardlm_gcc_max 13)
  else()
    set(_shardlm_gcc_max 14)
  endif()
  if(NOT CMAKE_CUDA_HOST_COMPILER AND NOT DEFINED ENV{CUDAHOSTCXX})
    set(_shardlm_cxx "${CMAKE_CXX_COMPILER}")
    if(NOT _shardlm_cxx)
      set(_shardlm_cxx g++)
    endif()
    execute_process(COMMAND "${_shardlm_cxx}" -dumpversion OUTPUT_VARIABLE _shardlm_gcc_version
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(COMMAND "${_shardlm_cxx}" --version OUTPUT_VARIABLE _shardlm_cxx_text ERROR_QUIET)
    string(REGEX MATCH "^[0-9]+" _shardlm_gcc_major "${_shardlm_gcc_version}")
    if(_shardlm_cxx_text MATCHES "Free Software Foundation" AND _shardlm_gcc_major GREATER _shardlm_gcc_max)
      set(_shardlm_host "")
      foreach(v RANGE ${_shardlm_gcc_max} 9 -1)
        find_program(_shardlm_gxx_${v} g++-${v})
        if(_shardlm_gxx_${v} AND NOT _shardlm_host)
          set(_shardlm_host "${_shardlm_gxx_${v}}")
        endif()
      endforeach()
      if(NOT _shardlm_host)
        message(FATAL_ERROR "CUDA ${_shardlm_cuda_version} supports g++ up to ${_shardlm_gcc_max}, and ${_shardlm_cxx} is "
                            "g++ ${_shardlm_gcc_version}: install one it supports (Debian: apt-get install "
                            "g++-${_shardlm_gcc_max}) or pass -DCMAKE_CUDA_HOST_COMPILER=<a g++ up to ${_shardlm_gcc_max}>")
      endif()
      set(CMAKE_CUDA_HOST_COMPILER "${_shardlm_host}" CACHE FILEPATH "host compiler of nvcc" FORCE)
    endif()
  endif()

  # Every nvcc call runs with the toolkit's ptxas first on PATH.
  set(_shardlm_launcher ${CMAKE_COMMAND} -E env "PATH=${_shardlm_ptxas_dir}:$ENV{PATH}")
  if(CMAKE_CUDA_COMPILER_LAUNCHER)
    list(APPEND _shardlm_launcher ${CMAKE_CUDA_COMPILER_LAUNCHER})
  endif()
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${_shardlm_launcher})
  set(ENV{PATH} "${_shardlm_ptxas_dir}:$ENV{PATH}")  # and so does CMake's own check of the compiler

  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(SHARDLM_HAVE_CUDA ON)
  endif()
endif()
if(NOT SHARDLM_HAVE_CUDA)
  if(SHARDLM_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SHARDLM_CUDA=ON but no CUDA compiler was found (set CUDAToolkit_ROOT, CUDA_HOME or CUDACXX or put "
                        "nvcc on PATH): `module load cuda`; RHEL-family: `dnf install cuda-toolkit` from NVIDIA's "
                        "repository; Debian: `apt-get install nvidia-cuda-toolkit` (contrib non-free)")
  endif()
  message(STATUS "shardlm: no CUDA compiler found; building the CPU backend only")
  return()
endif()

# CMake's default architecture is replaced per target; this only silences its check.
if(NOT CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES OFF)
endif()
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
find_package(CUDAToolkit REQUIRED)
if(NOT CUDAToolkit_VERSION_MAJOR EQUAL _shardlm_cuda_major OR NOT CUDAToolkit_VERSION_MINOR EQUAL _shardlm_cuda_minor)
  message(FATAL_ERROR "find_package(CUDAToolkit) found CUDA ${CUDAToolkit_VERSION} at ${CUDAToolkit_BIN_DIR}, not "
                      "the ${_shardlm_cuda_version} of ${CMAKE_CUDA_COMPILER}: set CUDAToolkit_ROOT to one toolkit")
endif()

# Default architectures: 70;80;90 where the toolkit still compiles for sm_70 (11.8, 12.x), 80;90 with 13.
if(NOT SHARDLM_CUDA_ARCHS)
  if(CUDAToolkit_VERSION_MAJOR GREATER_EQUAL 13)
    set(SHARDLM_CUDA_ARCHS "80;90")
  else()
    set(SHARDLM_CUDA_ARCHS "70;80;90")
  endif()
endif()
if(CUDAToolkit_VERSION_MAJOR GREATER_EQUAL 13 AND SHARDLM_CUDA_ARCHS MATCHES "(^|;)7[0-9]")
  message(FATAL_ERROR "SHARDLM_CUDA_ARCHS=${SHARDLM_CUDA_ARCHS}: CUDA ${CUDAToolkit_VERSION} cannot compile for "
                      "sm_7x (V100); build the V100 flavour with CUDA 11.8 or 12 (docs/cluster.md)")
endif()

# ---- NCCL ----
_shardlm_setting(_shardlm_nccl_home NCCL_HOME NCCL_ROOT)
if(_shardlm_nccl_home)
  find_path(NCCL_INCLUDE_DIR nccl.h PATHS "${_shardlm_nccl_home}/include" "${_shardlm_nccl_home}" NO_DEFAULT_PATH)
  find_library(NCCL_LIBRARY nccl PATHS "${_shardlm_nccl_home}/lib" "${_shardlm_nccl_home}/lib64" NO_DEFAULT_PATH)
  set(_shardlm_nccl_hint "under NCCL_HOME/NCCL_ROOT=${_shardlm_nccl_home}")
else()
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  set(_shardlm_nccl_hint "beside CUDA ${CUDAToolkit_VERSION} or in the system's folders (set NCCL_HOME)")
endif()
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  message(FATAL_ERROR "the CUDA backend needs NCCL: nccl.h and libnccl not found ${_shardlm_nccl_hint}: `module load nccl` "
                      "(or set NCCL_HOME); RHEL-family: `dnf install libnccl-devel` from NVIDIA's repository; Debian: "
                      "`apt-get install libnccl-dev`; or -DSHARDLM_CUDA=OFF for the CPU backend alone")
endif()
# An nccl.h among another toolkit's headers (NCCL_HOME=/usr/local/cuda with CUDA 11.8 chosen) would
# bring that toolkit's cuda_runtime.h in with it: stage nccl.h alone in the build tree instead.
set(SHARDLM_NCCL_INCLUDE_DIR "${NCCL_INCLUDE_DIR}")
list(FIND CUDAToolkit_INCLUDE_DIRS "${NCCL_INCLUDE_DIR}" _shardlm_nccl_in_toolkit)
if(EXISTS "${NCCL_INCLUDE_DIR}/cuda_runtime_api.h" AND _shardlm_nccl_in_toolkit EQUAL -1)
  set(SHARDLM_NCCL_INCLUDE_DIR "${CMAKE_BINARY_DIR}/nccl-include")
  file(MAKE_DIRECTORY "${SHARDLM_NCCL_INCLUDE_DIR}")
  file(GLOB _shardlm_nccl_headers "${NCCL_INCLUDE_DIR}/nccl*.h")
  foreach(h ${_shardlm_nccl_headers})
    get_filename_component(n "${h}" NAME)
    file(CREATE_LINK "${h}" "${SHARDLM_NCCL_INCLUDE_DIR}/${n}" SYMBOLIC)
  endforeach()
  if(EXISTS "${NCCL_INCLUDE_DIR}/nccl_device")
    file(CREATE_LINK "${NCCL_INCLUDE_DIR}/nccl_device" "${SHARDLM_NCCL_INCLUDE_DIR}/nccl_device" SYMBOLIC)
  endif()
  set(_shardlm_nccl_staged " (nccl.h staged alone: ${NCCL_INCLUDE_DIR} holds another toolkit's headers)")
endif()

# ---- cuDNN (optional): its fused attention serves sm_80 and newer ----
set(SHARDLM_HAVE_CUDNN OFF)
if(NOT SHARDLM_CUDNN STREQUAL "OFF")
  _shardlm_setting(_shardlm_cudnn_root CUDNN_ROOT)
  if(_shardlm_cudnn_root)
    find_path(CUDNN_INCLUDE_DIR cudnn_graph.h PATHS "${_shardlm_cudnn_root}/include" NO_DEFAULT_PATH)
    find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 PATHS "${_shardlm_cudnn_root}/lib" "${_shardlm_cudnn_root}/lib64"
                 NO_DEFAULT_PATH)
  else()
    find_path(CUDNN_INCLUDE_DIR cudnn_graph.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${CUDAToolkit_LIBRARY_DIR})
  endif()
  if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
    set(SHARDLM_HAVE_CUDNN ON)
  elseif(SHARDLM_CUDNN STREQUAL "ON")
    message(FATAL_ERROR "SHARDLM_CUDNN=ON but cuDNN 9 (cudnn_graph.h, libcudnn) was not found (set CUDNN_ROOT): "
                        "`module load cudnn`; RHEL-family: `dnf install libcudnn9-devel-cuda-12` (NVIDIA's repository); "
                        "Debian: `apt-get install libcudnn9-dev-cuda-12`; or -DSHARDLM_CUDNN=AUTO to build without it")
  endif()
endif()

if(SHARDLM_HAVE_CUDNN)
  set(_shardlm_cudnn_text "cuDNN ${CUDNN_LIBRARY}")
else()
  set(_shardlm_cudnn_text "no cuDNN (native attention only)")
endif()
if(CMAKE_CUDA_HOST_COMPILER)
  set(_shardlm_host_text ", host compiler ${CMAKE_CUDA_HOST_COMPILER}")
endif()
message(STATUS "shardlm: CUDA ${CUDAToolkit_VERSION} (nvcc ${CMAKE_CUDA_COMPILER}, ptxas ${SHARDLM_PTXAS}${_shardlm_host_text}, "
               "cuBLASLt ${CUDAToolkit_LIBRARY_DIR}), architectures ${SHARDLM_CUDA_ARCHS}, "
               "NCCL ${NCCL_LIBRARY}${_shardlm_nccl_staged}, ${_shardlm_cudnn_text}")
