"""The step verify's shared State (tools/gpu/verify/step_arena.py): the layout (aligned,
disjoint, the State's shapes), the views both processes take of it, the CPU's sealed memfd and
the GPU's device memory shared by descriptor. The device path runs here on the stand-in driver
of guard_gpu_support.py (its memory a CPU byte tensor, its descriptor a pipe); on a real GPU:
tests/gpu/test_decode_step_gpu.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from harnesslab.tests.tools.gpu import guard_gpu_support as support
from harnesslab.tests.tools.gpu.guard_gpu_support import CpuTorch, Driver
from harnesslab.tools.gpu import runner, step_trace
from harnesslab.tools.gpu.verify import step_arena
from harnesslab.tools.gpu.verify.guard_kid import sealed_memfd
from harnesslab.tools.task import load_task

TASK = load_task("decode_step")
REF = runner.load_module(TASK.root / "reference.py", "decode_step_reference_arena")
drv = support.drv  # the fixture: the stand-in driver, devmem's for the test


def config(dtype: str = "bfloat16"):
    return REF.Config(**TASK.step.interpreter.model_dump(), dtype=dtype)  # type: ignore[union-attr]


def test_the_layout_holds_every_state_tensor_aligned_and_apart() -> None:
    c = config()
    layout, size = step_arena.layout(c)
    state = REF.new_state(c)
    want = {**{f"w.{k}": w for k, w in state.weights.items()}, "rope_cos": state.rope_cos,
            "rope_sin": state.rope_sin, "kv_cache": state.kv_cache, "lengths": state.lengths}  # fmt: skip
    end = 0
    for name, spec in layout.items():
        assert spec["offset"] % step_arena.ALIGN == 0 and spec["offset"] >= end, name
        t = want.get(name)
        assert all(type(x) is int for x in spec["shape"]), name  # sent to the child as JSON
        if t is not None:
            assert spec["shape"] == list(t.shape) and spec["dtype"] == str(t.dtype)[6:], name
        nbytes = getattr(torch, spec["dtype"]).itemsize
        for s in spec["shape"]:
            nbytes *= s
        end = spec["offset"] + nbytes
    assert set(want) < set(layout) and layout["tokens"]["dtype"] == "int64"
    assert layout["tokens"]["shape"] == [c.batch]
    assert layout["logits"] == {**layout["logits"], "shape": [c.batch, c.vocab],
                                "dtype": "bfloat16"}  # fmt: skip
    assert end <= size < end + step_arena.ALIGN


def test_views_are_disjoint_tensors_of_the_layouts_shapes_and_dtypes_over_the_bytes() -> None:
    layout, size = step_arena.layout(config("float16"))
    u8 = torch.zeros(size, dtype=torch.uint8)
    views = step_arena.views(torch, u8, layout)
    for name, spec in layout.items():
        v = views[name]
        assert list(v.shape) == spec["shape"] and str(v.dtype) == f"torch.{spec['dtype']}", name
        assert v.is_contiguous() and v.data_ptr() == u8.data_ptr() + spec["offset"], name
    views["lengths"].fill_(3)
    views["tokens"].fill_(-1)
    views["logits"].fill_(float("nan"))
    assert views["lengths"].tolist() == [3] * len(views["lengths"])  # the tokens did not land
    assert not views["kv_cache"].isnan().any() and int(u8.sum()) > 0


def share(arena_type, torch_, size: int, scratch: Path):
    """The parent's arena and the child's mapping of it (the descriptor it would inherit), and
    the child's descriptor."""
    parent = arena_type.create(torch_, size, str(scratch))
    inherited = os.dup(parent.fd)
    return parent, arena_type.mapped(torch_, inherited, parent.size), inherited


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_what_the_parent_writes_in_its_views_the_childs_step_reads_in_its_own(
    device: str, tmp_path: Path, drv: Driver
) -> None:
    """Prompts, poison and tokens the parent writes are in the child's State with no copy, and
    the logits and cache the child's step writes are in the parent's views: one memory."""
    torch_ = CpuTorch(drv) if device == "cuda" else torch
    c = config("float16")
    layout, size = step_arena.layout(c)
    parent, child, _ = share(step_arena.ARENAS[device], torch_, size, tmp_path)
    mine, theirs = parent.views(layout), child.views(layout)
    cand = REF.State(config=c, weights={}, kv_cache=mine["kv_cache"], lengths=mine["lengths"],
                     host_lengths=[0] * c.batch, rope_cos=mine["rope_cos"],
                     rope_sin=mine["rope_sin"])  # fmt: skip
    step_trace.reset_state(cand)
    REF.prefill(cand, 1, 5, seed=3)
    step_trace.poison_stale(torch, cand, cand.host_lengths)
    mine["tokens"].copy_(torch.arange(c.batch))
    assert torch.equal(theirs["kv_cache"], mine["kv_cache"])
    assert (theirs["kv_cache"][:, 1, 1, :, 5:] == step_trace.POISON).all()
    assert theirs["lengths"].tolist() == [0, 5, 0, 0] and theirs["tokens"].tolist() == [0, 1, 2, 3]
    theirs["logits"].fill_(0.25)
    theirs["kv_cache"][0, 0, 1, 0, 5].fill_(1.5)
    assert (mine["logits"] == 0.25).all() and (mine["kv_cache"][0, 0, 1, 0, 5] == 1.5).all()
    del mine, theirs, cand
    child.close()
    parent.close()


def test_the_device_arena_is_shared_by_descriptor_mapped_at_its_size_and_freed_after_a_sync(
    tmp_path: Path, drv: Driver
) -> None:
    t = CpuTorch(drv)
    parent, child, inherited = share(step_arena.DeviceArena, t, 4096, tmp_path)
    assert parent.size == 4096 and child.size == 4096 and drv.sizes == [4096]
    assert child.fd == -1  # the child closed the descriptor it inherited once mapped
    with pytest.raises(OSError):
        os.fstat(inherited)
    assert child.buf.u8 is parent.buf.u8  # the stand-in's one memory: the same bytes
    child.close()
    assert drv.freed == [(parent.buf.ptr, 4096, ("imported", parent.buf.ptr))]
    fd = parent.fd
    parent.close()
    assert drv.freed[-1] == (parent.buf.ptr, 4096, ("handle", parent.buf.ptr))
    with pytest.raises(OSError):
        os.fstat(fd)  # the parent's descriptor closed with its arena


def test_the_host_arena_is_a_sealed_memfd_unmapped_and_closed_with_it(tmp_path: Path) -> None:
    arena = step_arena.HostArena.create(torch, 4096, str(tmp_path))
    fd = arena.fd
    assert os.fstat(fd).st_size == 4096 and arena.u8.numel() == 4096
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 8192)
    arena.close()
    assert arena.map.closed
    with pytest.raises(OSError):
        os.fstat(fd)


def test_no_more_seals_can_be_added_to_the_arena(tmp_path: Path) -> None:
    import fcntl

    fd = sealed_memfd(4096, str(tmp_path))
    try:
        with pytest.raises(PermissionError):  # F_ADD_SEALS F_SEAL_WRITE: the parent could not write
            fcntl.fcntl(fd, 1033, 0x0008)
    finally:
        os.close(fd)


def test_every_device_has_its_arena() -> None:
    assert step_arena.ARENAS == {"cpu": step_arena.HostArena, "cuda": step_arena.DeviceArena}


def test_the_arena_memfd_is_sealed_against_resizing(tmp_path: Path) -> None:
    fd = sealed_memfd(4096, str(tmp_path))
    try:
        assert os.fstat(fd).st_size == 4096
        for size in (0, 8192):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, size)
    finally:
        os.close(fd)


def test_the_fallback_arena_is_a_file_that_leaves_nothing_in_the_scratch(tmp_path: Path,
                                                                        monkeypatch) -> None:  # fmt: skip
    monkeypatch.delattr(os, "memfd_create")
    fd = sealed_memfd(4096, str(tmp_path))
    try:
        assert os.fstat(fd).st_size == 4096 and list(tmp_path.iterdir()) == []
    finally:
        os.close(fd)
