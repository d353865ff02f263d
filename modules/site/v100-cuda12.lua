-- Site settings for V100 nodes with CUDA 12: Lua that the shardlm modulefile ends with.
-- V100 is sm_70, which CUDA 13 dropped, so build with CUDA 12 (or 11.8; docs/cluster.md "Building for
-- V100 and A100"). Build and install with
-- this site's module names (examples; `module avail` shows yours):
--   module load cuda/12.4 openmpi/4.1.6 hdf5/1.14.3-mpi
--   cmake -S . -B build -DSHARDLM_CUDA=ON -DSHARDLM_CUDA_ARCHS=70 \
--         -DSHARDLM_MODULE_CUDA=cuda/12.4 -DSHARDLM_MODULE_MPI=openmpi/4.1.6 \
--         -DSHARDLM_MODULE_HDF5=hdf5/1.14.3-mpi -DSHARDLM_MODULE_SITE=modules/site/v100-cuda12.lua \
--         -DCMAKE_INSTALL_PREFIX=/apps/shardlm/0.1.0
--   cmake --build build -j 16 && cmake --install build
--   module use /apps/shardlm/0.1.0/share/modulefiles     (or copy the modulefile into the site tree)
--
-- The job scripts (jobscripts/common.sh) turn these variables into deck overrides on the CUDA
-- backend; an override on the sbatch line wins, and unsetting a variable keeps the deck's value.

-- V100 has no bf16: gather and compute in fp16 (dynamic loss scaling then turns itself on) and
-- reduce gradients in fp32.
setenv("SHARDLM_PARAM_DTYPE", "fp16")
setenv("SHARDLM_REDUCE_DTYPE", "fp32")
-- Peak dense fp16 tensor-core rate of one V100 SXM2, TFLOP/s: the log's MFU column divides by it.
setenv("SHARDLM_PEAK_TFLOPS", "125")

-- NCCL on DGX-1-like nodes (NVLink inside a node, InfiniBand EDR between): set what applies.
-- setenv("NCCL_IB_HCA", "mlx5_0,mlx5_1,mlx5_2,mlx5_3")
-- setenv("NCCL_SOCKET_IFNAME", "ib0")
