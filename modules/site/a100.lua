-- Site settings for A100 nodes: Lua that the shardlm modulefile ends with.
-- Build and install with this site's module names (examples; `module avail` shows yours):
--   module load cuda/12.4 openmpi/4.1.6 hdf5/1.14.3-mpi
--   cmake -S . -B build -DSHARDLM_CUDA=ON -DSHARDLM_CUDA_ARCHS=80 \
--         -DSHARDLM_MODULE_CUDA=cuda/12.4 -DSHARDLM_MODULE_MPI=openmpi/4.1.6 \
--         -DSHARDLM_MODULE_HDF5=hdf5/1.14.3-mpi -DSHARDLM_MODULE_SITE=modules/site/a100.lua \
--         -DCMAKE_INSTALL_PREFIX=/apps/shardlm/0.1.0
--   cmake --build build -j 16 && cmake --install build
--   module use /apps/shardlm/0.1.0/share/modulefiles     (or copy the modulefile into the site tree)
--
-- The job scripts (jobscripts/common.sh) turn these variables into deck overrides on the CUDA
-- backend; an override on the sbatch line wins, and unsetting a variable keeps the deck's value.

-- A100 computes in bf16 at the fp16 rate without loss scaling; gradients are reduced in fp32.
setenv("SHARDLM_PARAM_DTYPE", "bf16")
setenv("SHARDLM_REDUCE_DTYPE", "fp32")
-- Peak dense bf16 tensor-core rate of one A100, TFLOP/s: the log's MFU column divides by it.
setenv("SHARDLM_PEAK_TFLOPS", "312")

-- NCCL on DGX A100-like nodes (NVSwitch inside, 8 HDR InfiniBand adapters): set what applies.
-- setenv("NCCL_IB_HCA", "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_6,mlx5_7,mlx5_8,mlx5_9")
-- setenv("NCCL_SOCKET_IFNAME", "ib0")
