#!/usr/bin/env bash
# Wheels the GPU host lacks (it has torch, triton, numpy, anyio, httpx, rich...): cp312 manylinux
# builds into .whl/ (git-ignored), carried to the device with `carry: [".whl"]`.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
PLAT=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" -d .whl \
  mcp==2.3.0 mcp-types==2.3.0 asyncssh==2.24.1 cryptography cffi pycparser \
  pydantic==2.14.3 pydantic-core==2.50.4 pydantic-settings==2.16.3 python-dotenv typing-inspection annotated-types \
  httpx2 httpcore2 truststore jsonschema jsonschema-specifications referencing rpds-py opentelemetry-api pyjwt \
  python-multipart sse-starlette starlette uvicorn
# The lab's peers (issue 18): pure-Python wheels. fla-core needs einops beyond torch+triton
# (the device image has einops; carried so a host without it imports too); liger-kernel needs
# nothing else. Both import on a CPU host with only torch, triton and these (checked 2026-11-23:
# fla.modules.fused_norm_gate.rms_norm_gated, liger_kernel.ops.swiglu/softmax).
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl \
  fla-core==0.6.0 liger-kernel==0.8.5 einops==0.8.2 pytest pluggy iniconfig packaging pytest-timeout anyio sniffio h11 idna certifi
ls .whl | wc -l
