"""The driver binding's launch attributes on a real GPU (tools/gpu/cudadrv.py): a kernel launched
in clusters reads the cluster shape the launch gave it. Cluster launches need compute
capability 9.0 (Hopper); on an older GPU the test skips. The same rule without a GPU, on a
stand-in libcuda: tests/tools/gpu/test_cudadrv_units.py."""

from __future__ import annotations

import ctypes

import pytest
import torch

from harnesslab.tests.tools.gpu.cuda_support import compiler, staged

cudadrv = staged("cudadrv")

DIMS = r"""
extern "C" __global__ void dims(unsigned* out) {
    unsigned x, y, z;
    asm("mov.u32 %0, %%cluster_nctaid.x;" : "=r"(x));
    asm("mov.u32 %0, %%cluster_nctaid.y;" : "=r"(y));
    asm("mov.u32 %0, %%cluster_nctaid.z;" : "=r"(z));
    if (blockIdx.x == 0 && threadIdx.x == 0) { out[0] = x; out[1] = y; out[2] = z; }
}
"""


def test_a_cluster_launch_gives_the_kernel_clusters_of_num_ctas_by_1_by_1() -> None:
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("cluster launches need compute capability 9.0")
    image = compiler().compile(DIMS, name="dims.cu", arch="sm_90", name_expressions=["dims"])
    drv = cudadrv.Driver()
    drv.init_primary(torch.cuda.current_device())
    _, fn = drv.load_function(image.image, image.lowered["dims"], 0)
    ptr = drv.alloc(12)
    try:
        arg = ctypes.c_uint64(ptr)
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(arg), ctypes.c_void_p))
        drv.launch(fn, (1, 1, 1), 32, 0, 0, params, num_ctas=2)
        drv.synchronize()
        host = (ctypes.c_uint32 * 3)()
        drv.call("cuMemcpyDtoH", host, ctypes.c_uint64(ptr), ctypes.c_size_t(12))
        assert list(host) == [2, 1, 1]
    finally:
        drv.free(ptr)
