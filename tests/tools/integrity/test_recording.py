"""The recording a candidate's process sends is hostile input: the trusted side's schema check
(guard_schema.validate) and the replayer's argument packing (replay.pack_scalar), on the CPU.

The GPU path itself (record -> replay -> check -> time) runs in tests/gpu/test_guarded_verify_gpu.py
and benchmarks/integrity2_gpu.py on a GPU host."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from harnesslab.tools.gpu.verify import guard_schema, replay


def recording(**over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "kernels": [{"id": "k0_row", "name": "row_kernel", "cubin": base64.b64encode(b"\0").decode(),
                     "shared": 0, "num_warps": 4, "num_ctas": 1}],
        "allocs": [{"nbytes": 4096}],
        "steps": [{"op": "launch", "kernel": "k0_row", "grid": [8, 1, 1], "params": [
            {"k": "ptr", "buf": "in0", "offset": 0},
            {"k": "ptr", "buf": "a0", "offset": 0},
            {"k": "scalar", "type": "i32", "value": 1024},
            {"k": "scalar", "type": "fp32", "value": 1e-5},
            {"k": "scratch", "which": "global", "nbytes": 0},
        ]}],
        "output": {"buf": "a0", "offset": 0, "shape": [2, 1024], "strides": [1024, 1],
                   "dtype": "float16"},
        "unsupported": [],
    }  # fmt: skip
    rec.update(over)
    return rec


def test_a_well_formed_recording_is_kept_as_the_replay_will_use_it() -> None:
    r = guard_schema.validate(recording(), n_inputs=1)
    assert list(r["kernels"]) == ["k0_row"] and r["sizes"] == {"in0": None, "a0": 4096}
    assert r["steps"][0]["params"][-1] == {"k": "scratch", "buf": None}
    assert r["output"]["buf"] == "a0"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"unsupported": ["copy"]}, "unreplayable"),
        ({"unsupported": ["foreign_memory"]}, "unreplayable"),
        ({"kernels": [{"id": "k", "name": "bad name; rm -rf", "cubin": "", "shared": 0,
                       "num_warps": 4}]}, "forged_recording"),
        ({"allocs": [{"nbytes": True}]}, "forged_recording"),  # a bool is not a size
        ({"allocs": [{"nbytes": 1 << 40}]}, "forged_recording"),
        ({"steps": [{"op": "launch", "kernel": "nope", "grid": [1, 1, 1], "params": []}]},
         "forged_recording"),
        ({"steps": [{"op": "launch", "kernel": "k0_row", "grid": [1, 1], "params": []}]},
         "forged_recording"),
        ({"steps": [{"op": "launch", "kernel": "k0_row", "grid": [1, 1, 1],
                     "params": [{"k": "ptr", "buf": "in7", "offset": 0}]}]}, "forged_recording"),
        ({"steps": [{"op": "launch", "kernel": "k0_row", "grid": [1, 1, 1],
                     "params": [{"k": "scalar", "type": "i32", "value": "1024"}]}]},
         "forged_recording"),
        ({"steps": [{"op": "memset", "buf": "a0", "offset": 0, "width": 8, "value": 0,
                     "count": 1}]}, "forged_recording"),
        ({"output": {"buf": "a0", "offset": 0, "shape": [2], "strides": [1, 1],
                     "dtype": "float16"}}, "forged_recording"),
        ({"output": {"buf": "a0", "offset": 0, "shape": [2], "strides": [1],
                     "dtype": "object"}}, "forged_recording"),
    ],
)  # fmt: skip
def test_a_broken_or_unreplayable_recording_is_refused_with_its_code(change, code) -> None:
    with pytest.raises(guard_schema.Bad) as err:
        guard_schema.validate(recording(**change), n_inputs=1)
    assert err.value.code == code


def test_no_text_of_the_recording_appears_in_a_refusal() -> None:
    name = "Leak_final0_10107x4096"
    with pytest.raises(guard_schema.Bad) as err:
        guard_schema.validate(recording(kernels=[{"id": name, "name": name + " !", "cubin": "",
                                               "shared": 0, "num_warps": 4}]), n_inputs=1)  # fmt: skip
    assert "Leak" not in str(err.value) and "10107" not in str(err.value)


@pytest.mark.parametrize(
    ("ty", "value", "raw"),
    [
        ("i32", -3, struct.pack("<i", -3)),
        ("i64", 1 << 40, struct.pack("<q", 1 << 40)),
        ("i1", True, b"\x01"),
        ("u8", 255, b"\xff"),
        ("fp32", 1e-5, struct.pack("<f", 1e-5)),
        ("fp16", 0.5, struct.pack("<e", 0.5)),
        ("bf16", 1.0, struct.pack("<f", 1.0)[2:]),  # Triton truncates: the high half
        ("fp64", 0.1, struct.pack("<d", 0.1)),
    ],
)
def test_scalars_are_packed_the_way_tritons_launcher_packs_them(ty, value, raw) -> None:
    v = replay.pack_scalar(ty, value)
    assert bytes(v) == raw
