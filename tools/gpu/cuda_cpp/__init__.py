"""What runs a CUDA C++ candidate (staged flat with the rest of tools/gpu).

harnesslab_cuda.py is the launcher a candidate's kernel.py imports (`from harnesslab_cuda import
load`): the one place a CUDA launch happens, hooked by the guarded verify's recorder
(../verify/guard_record.py); nvrtc.py compiles through NVRTC (ctypes) and checks the PTX;
cuda_source.py reads a .cu source's declarations and includes. Candidate side of the trust
boundary where the candidate runs; the host's scan (tools/integrity/scan_cuda.py) imports
cuda_source and nvrtc's register table as a library. The CUDA driver API they launch through
is ../cudadrv.py, shared with the replayer.
"""
