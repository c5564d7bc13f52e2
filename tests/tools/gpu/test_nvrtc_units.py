"""NVRTC's binding (tools/gpu/cuda_cpp/nvrtc.py) without NVRTC: where the library and the
headers are looked for and which wins, the option allowlist, the defines, what `compile` asks
of libnvrtc and makes of its answers (on a stand-in library that fills the output arguments
as libnvrtc does), the error text, the cache's refusals, the PTX check on PTX text.
Real compiles: tests/tools/gpu/test_nvrtc.py (needs libnvrtc, no GPU)."""

from __future__ import annotations

import ctypes
import glob as globmod
import hashlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harnesslab.tests.tools.gpu.cuda_support import staged

nvrtc = staged("nvrtc")

# ----------------------------------------------------------------------------------------------
# the allowlist


EXACT = ["--use_fast_math", "-use_fast_math", "-lineinfo", "--generate-line-info",
         "--extra-device-vectorization", "-extra-device-vectorization", "--restrict", "-restrict",
         "--device-as-default-execution-space", "-default-device", "--disable-warnings", "-w",
         "-std=c++17", "--std=c++17", "-std=c++20", "--std=c++20"]  # fmt: skip
PREFIXED = ["--fmad=false", "-fmad=true", "--ftz=true", "-ftz=false", "--prec-div=false",
            "-prec-div=true", "--prec-sqrt=false", "-prec-sqrt=true", "--maxrregcount=64",
            "-maxrregcount=32", "-DVEC=4"]  # fmt: skip


@pytest.mark.parametrize("option", EXACT + PREFIXED)
def test_each_option_of_the_allowlist_is_accepted(option: str) -> None:
    assert nvrtc.check_options([option]) == [option]


@pytest.mark.parametrize("option", [5, None, b"-w", "-w ", "--fmad", "-Dx\ny", "-DEFINE=1x\n"])
def test_anything_else_is_refused_as_an_option_error(option: Any) -> None:
    with pytest.raises(nvrtc.OptionError, match="not allowed"):
        nvrtc.check_options(["-w", option])


def test_defines_refuse_names_that_are_not_identifiers_and_long_values() -> None:
    for bad in ({5: 1}, {"9x": 1}, {"A": None}, {"A": "x" * 201}):
        with pytest.raises(nvrtc.OptionError):
            nvrtc.define_options(bad)
    assert nvrtc.define_options({"A": "x" * 200, "F": False}) == [f"-DA={'x' * 200}", "-DF=0"]
    assert nvrtc.define_options(None) == []


# ----------------------------------------------------------------------------------------------
# where the library is looked for


def _fake_glob(fake: set[str]) -> Callable[[str], list[str]]:
    """glob.glob: /usr/local/cuda* from `fake` (`*` stops at a slash), the rest real."""
    real = globmod.glob

    def glob(pattern: str) -> list[str]:
        if not pattern.startswith("/usr/local/cuda"):
            return real(pattern)
        rx = re.escape(pattern).replace(r"\*", "[^/]*")
        return [p for p in sorted(fake) if re.fullmatch(rx, p)]

    return glob


def _touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site-packages with every wheel layout, first on sys.path (twice, with '' and a folder
    without nvidia/), and a toolkit of two versions under /usr/local."""
    root = tmp_path / "site"
    for sub, name in (("cu12", "libnvrtc.so.12"), ("cuda_nvrtc", "libnvrtc.so.12"),
                      ("cu13", "libnvrtc.so.13"), ("cu13", "libnvrtc-builtins.so.13.0"),
                      ("cu13", "libnvrtc.alt.so.13")):  # fmt: skip
        _touch(root / "nvidia" / sub / "lib" / name)
    (tmp_path / "plain").mkdir()
    monkeypatch.chdir(tmp_path)  # '' on sys.path: no nvidia/ in the working folder counts
    _touch(tmp_path / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13")
    monkeypatch.setattr(sys, "path", ["", str(root), str(tmp_path / "plain"), str(root)])
    fake = {
        "/usr/local/cuda-12.8", "/usr/local/cuda-13.0",
        "/usr/local/cuda/lib64/libnvrtc.so",
        "/usr/local/cuda-12.8/lib64/libnvrtc.so.12",
        "/usr/local/cuda-13.0/targets/x86_64-linux/lib/libnvrtc.so.13",
        "/usr/local/cuda-13.0/targets/sbsa-linux/lib/libnvrtc.so.13",
        "/usr/local/cuda-13.0/lib64/libnvrtc-builtins.so",
    }  # fmt: skip
    monkeypatch.setattr(nvrtc.glob, "glob", _fake_glob(fake))
    return root


def test_the_site_folders_are_those_with_nvidia_wheels(site: Path) -> None:
    assert nvrtc._site_dirs() == [str(site), str(site)]


def test_library_candidates_come_in_order_without_builtins_or_duplicates(site: Path) -> None:
    lib = site / "nvidia"
    assert nvrtc.library_candidates() == [
        str(lib / "cu13" / "lib" / "libnvrtc.so.13"),
        str(lib / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"),
        str(lib / "cu12" / "lib" / "libnvrtc.so.12"),
        "/usr/local/cuda/lib64/libnvrtc.so",
        "/usr/local/cuda-13.0/targets/x86_64-linux/lib/libnvrtc.so.13",
        "/usr/local/cuda-13.0/targets/sbsa-linux/lib/libnvrtc.so.13",
        "/usr/local/cuda-12.8/lib64/libnvrtc.so.12",
    ]


def test_find_library_prefers_the_major_asked_for_and_else_the_first(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert nvrtc.find_library() == str(site / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13")
    assert nvrtc.find_library(12) == str(site / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12")
    assert nvrtc.find_library(13) == nvrtc.find_library()
    monkeypatch.setattr(nvrtc, "library_candidates", lambda: ["/usr/local/cuda-11.8/lib64/libnvrtc.so", "/opt/libnvrtc.so"])  # fmt: skip
    assert nvrtc.find_library(12) == "/usr/local/cuda-11.8/lib64/libnvrtc.so"
    assert nvrtc.find_library(11) == "/usr/local/cuda-11.8/lib64/libnvrtc.so"
    monkeypatch.setattr(nvrtc, "library_candidates", lambda: ["/opt/libnvrtc.so", "/usr/local/cuda-11.8/lib64/libnvrtc.so"])  # fmt: skip
    assert nvrtc.find_library(11) == "/usr/local/cuda-11.8/lib64/libnvrtc.so"


# ----------------------------------------------------------------------------------------------
# which headers


def _include(folder: Path, version: int | None, *, fp16: bool = True, nv: bool = False,
             mma: bool = False) -> Path:  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    if version is not None:
        _touch(folder / "cuda_runtime_api.h", f"/* \xff */\n#define CUDART_VERSION {version}\n")
    if fp16:
        _touch(folder / "cuda_fp16.h")
    if nv:
        _touch(folder / "nv" / "target")
    if mma:
        _touch(folder / "crt" / "mma.h")
    return folder


def test_the_runtime_major_is_read_from_the_header(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "cuda_runtime_api.h").write_bytes(
        b"/* \xff\xfe */\n#define CUDART_VERSION 13000\n"
    )
    assert nvrtc._cudart_major(str(tmp_path / "a")) == 13
    assert nvrtc._cudart_major(str(_include(tmp_path / "b", 12090))) == 12
    _touch(tmp_path / "c" / "cuda_runtime_api.h", "no version here")
    assert nvrtc._cudart_major(str(tmp_path / "c")) is None
    assert nvrtc._cudart_major(str(tmp_path / "missing")) is None


def test_the_include_folder_of_the_same_major_wins_then_the_most_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    monkeypatch.setattr(sys, "path", [str(site)])
    lib = tmp_path / "tk" / "lib" / "libnvrtc.so.99"
    _include(site / "nvidia" / "cu13" / "include", 98000)
    _include(site / "nvidia" / "cuda_runtime" / "include", 99000)
    assert nvrtc.find_include_dir(None, 99) == str(site / "nvidia" / "cuda_runtime" / "include")
    assert nvrtc.find_include_dir(None, 98) == str(site / "nvidia" / "cu13" / "include")
    _include(tmp_path / "tk" / "include", 99000)  # beside the library: first of equals
    assert nvrtc.find_include_dir(str(lib), 99) == str(tmp_path / "tk" / "include")
    _include(site / "nvidia" / "cuda_runtime" / "include", 99000, mma=True)
    assert nvrtc.find_include_dir(str(lib), 99) == str(site / "nvidia" / "cuda_runtime" / "include")
    _include(site / "nvidia" / "cu13" / "include", 99000, nv=True)
    assert nvrtc.find_include_dir(str(lib), 99) == str(site / "nvidia" / "cu13" / "include")
    # a folder without cuda_fp16.h is no include folder, whatever its version
    _include(tmp_path / "x" / "include", 97000, fp16=False)
    assert nvrtc.find_include_dir(str(tmp_path / "x" / "lib" / "libnvrtc.so"), 97) != str(
        tmp_path / "x" / "include"
    )
    monkeypatch.setattr(nvrtc.os.path, "isfile", lambda p: False)
    assert nvrtc.find_include_dir(str(lib), 99) is None


# ----------------------------------------------------------------------------------------------
# compile, on a stand-in libnvrtc


class Entry:
    """One entry point: calls `fn`, or answers an int as a pointer would without a restype."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.restype: Any = ctypes.c_int

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class FakeNvrtc:
    """libnvrtc stand-in: version 13.2, archs 75..100, a program that compiles to what
    `log`, `ptx`, `cubin`, `code` and `lowered_names` say; `fail` makes one call fail."""

    def __init__(self) -> None:
        self.log, self.code = b"", 0
        self.ptx, self.cubin = b".version 9.0\n.target sm_90\n\0", b"\x7fELF cubin"
        self.lowered_names: dict[bytes, bytes | None] = {}
        self.fail: dict[str, int] = {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.destroyed = 0
        self.error_names: dict[int, bytes | None] = {7: b"NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID"}
        self.nvrtcGetErrorString = Entry(self._error_string)

    def _error_string(self, code: int) -> Any:
        if self.nvrtcGetErrorString.restype is not ctypes.c_char_p:
            return 140737 + code  # the pointer, as an int
        return self.error_names.get(code)

    def __getattr__(self, sym: str) -> Any:
        if not sym.startswith("nvrtc"):
            raise AttributeError(sym)

        def entry(*args: Any) -> int:
            self.calls.append((sym, args))
            if sym in self.fail:
                return self.fail[sym]
            return getattr(self, "_" + sym, lambda *a: 0)(*args)

        return entry

    def _nvrtcVersion(self, major: Any, minor: Any) -> int:
        major._obj.value, minor._obj.value = 13, 2
        return 0

    def _nvrtcGetNumSupportedArchs(self, n: Any) -> int:
        n._obj.value = 4
        return 0

    def _nvrtcGetSupportedArchs(self, archs: Any) -> int:
        for i, a in enumerate((75, 80, 90, 100)):
            archs[i] = a
        return 0

    def _nvrtcCreateProgram(self, prog: Any, src: bytes, name: bytes, n: int, srcs: Any, incs: Any) -> int:  # fmt: skip
        prog._obj.value = 4242
        self.program = (src, name, {incs[i]: srcs[i] for i in range(n)})
        return 0

    def _nvrtcCompileProgram(self, prog: Any, n: int, argv: Any) -> int:
        self.options = [argv[i].decode() for i in range(n)]
        return self.code

    def _size(self, data: bytes, size: Any) -> int:
        size._obj.value = len(data)
        return 0

    def _fill(self, data: bytes, buf: Any) -> int:
        ctypes.memmove(buf, data, len(data))
        return 0

    def _nvrtcGetProgramLogSize(self, prog: Any, size: Any) -> int:
        return self._size(self.log + b"\0", size)

    def _nvrtcGetProgramLog(self, prog: Any, buf: Any) -> int:
        return self._fill(self.log + b"\0", buf)

    def _nvrtcGetPTXSize(self, prog: Any, size: Any) -> int:
        return self._size(self.ptx, size)

    def _nvrtcGetPTX(self, prog: Any, buf: Any) -> int:
        return self._fill(self.ptx, buf)

    def _nvrtcGetCUBINSize(self, prog: Any, size: Any) -> int:
        return self._size(self.cubin, size)

    def _nvrtcGetCUBIN(self, prog: Any, buf: Any) -> int:
        return self._fill(self.cubin, buf)

    def _nvrtcGetLoweredName(self, prog: Any, expr: bytes, out: Any) -> int:
        out._obj.value = self.lowered_names.get(expr, b"_Z" + expr)
        return 0

    def _nvrtcDestroyProgram(self, prog: Any) -> int:
        assert prog._obj.value == 4242
        self.destroyed += 1
        return 0


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvrtc:
    return FakeNvrtc()


@pytest.fixture
def cc(fake: FakeNvrtc, monkeypatch: pytest.MonkeyPatch) -> Any:
    loaded: list[str] = []
    with monkeypatch.context() as m:
        m.setattr(nvrtc, "find_library", lambda prefer=None: "/nowhere/libnvrtc.so.13")
        m.setattr(nvrtc.ctypes, "CDLL", lambda path: loaded.append(path) or fake)
        out = nvrtc.Nvrtc("/opt/nv/lib/libnvrtc.so.13")
    assert loaded == ["/opt/nv/lib/libnvrtc.so.13"] and out.path == loaded[0]
    return out


def test_the_library_named_is_the_one_loaded_and_its_version_read(cc: Any) -> None:
    assert cc.version == (13, 2) and cc.supported_archs() == [75, 80, 90, 100]
    assert cc._header_version == (nvrtc._cudart_major(cc.include_dir) if cc.include_dir else None)


def test_a_library_that_does_not_load_is_not_found(tmp_path: Path) -> None:
    bogus = _touch(tmp_path / "libnvrtc.so.13", "not an ELF file")
    with pytest.raises(nvrtc.NvrtcNotFound, match="cannot load"):
        nvrtc.Nvrtc(str(bogus))


def test_a_failed_call_names_the_call_and_nvrtcs_error(cc: Any, fake: FakeNvrtc) -> None:
    fake.fail["nvrtcAddNameExpression"] = 7
    with pytest.raises(nvrtc.NvrtcError, match=r"^nvrtcAddNameExpression failed: NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID \(7\)$"):  # fmt: skip
        cc.compile("src", name_expressions=["k"])
    assert fake.destroyed == 1  # the program is destroyed on every way out
    fake.error_names[7] = None
    with pytest.raises(nvrtc.NvrtcError, match=r"failed: unknown \(7\)"):
        cc.compile("src", name_expressions=["k"])
    fake.error_names[7] = b"NVRTC_\xff"
    with pytest.raises(nvrtc.NvrtcError, match="failed: NVRTC_\ufffd \\(7\\)"):
        cc.compile("src", name_expressions=["k"])


def test_without_a_path_the_library_found_is_loaded(
    fake: FakeNvrtc, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Any] = []
    monkeypatch.setattr(
        nvrtc, "find_library", lambda prefer=None: asked.append(prefer) or "/x/libnvrtc.so.13"
    )
    monkeypatch.setattr(
        nvrtc.ctypes, "CDLL", lambda path: fake if path == "/x/libnvrtc.so.13" else None
    )
    assert nvrtc.Nvrtc(prefer_major=12).path == "/x/libnvrtc.so.13" and asked == [12]


def test_options_the_architecture_and_the_default_standard(cc: Any, fake: FakeNvrtc) -> None:
    out = cc.compile("src", arch="sm_80", defines={"V": 2}, options=["-lineinfo"])
    inc = [f"--include-path={cc.include_dir}"] if cc.include_dir else []
    want = ["--gpu-architecture=sm_80", "-std=c++17", *inc, "-DV=2", "-lineinfo"]
    assert fake.options == want and list(out.options) == want and out.arch == "sm_80"
    cc.compile("src", arch="sm_90a", target="ptx", options=["-w", "--std=c++20"])
    assert fake.options == ["--gpu-architecture=compute_90a", *inc, "-w", "--std=c++20"]
    with pytest.raises(nvrtc.OptionError, match="cannot compile for sm_86"):
        cc.compile("src", arch="sm_86")
    with pytest.raises(nvrtc.OptionError, match="cubin or ptx"):
        cc.compile("src", target="fatbin")
    with pytest.raises(nvrtc.OptionError, match="not allowed"):
        cc.compile("src", options=["-I/etc"])
    assert fake.destroyed == 2  # only the two that compiled made a program


def test_the_program_gets_the_source_its_name_and_the_headers(cc: Any, fake: FakeNvrtc) -> None:
    cc.compile("int x;", name="k.cu", headers={"my.cuh": "#define V 3"})
    src, name, headers = fake.program
    assert (src, name) == (b"int x;", b"k.cu")
    assert headers == {b"stdint.h": nvrtc.STDINT_H.encode(), b"cstdint": nvrtc.CSTDINT.encode(),
                       b"my.cuh": b"#define V 3"}  # fmt: skip


def test_what_a_compile_returns(cc: Any, fake: FakeNvrtc) -> None:
    fake.lowered_names = {b"fill<int>": b"_Z4fillIiEvPT_", b"gone": None}
    fake.log = b"remark \xff\n"
    out = cc.compile("src", name_expressions=["fill<int>", "gone"])
    assert out.image == fake.cubin and out.ptx == ".version 9.0\n.target sm_90\n"
    assert out.lowered == {"fill<int>": "_Z4fillIiEvPT_", "gone": ""}
    assert out.log == "remark \ufffd\n" and out.target == "cubin" and not out.cached
    assert 0 <= out.compile_s < 60 and out.nvrtc_version == (13, 2)
    assert [a[1] for s, a in fake.calls if s == "nvrtcAddNameExpression"] == [b"fill<int>", b"gone"]
    assert fake.destroyed == 1
    fake.ptx = b".version 9.0\n// \xfe\n\0\0"
    ptx = cc.compile("src", target="ptx")
    assert ptx.ptx == ".version 9.0\n// \ufffd\n" and ptx.image == ptx.ptx.encode()


LOG = (
    b'kernel.cu(3): warning #177-D: variable "error_flag" was declared but never referenced\n'
    b'kernel.cu(5): error: identifier "a" is undefined\n'
    b"  some context \xff\n"
    b'kernel.cu(9): error: expected a ";"\n'
    b'kernel.cu(12): catastrophic error: cannot open source file "x.h"\n'
    b'3 errors detected in the compilation of "kernel.cu".\n'
)


def test_a_failed_compile_says_its_first_error_and_how_many_more(cc: Any, fake: FakeNvrtc) -> None:
    fake.code, fake.log = 6, LOG
    with pytest.raises(nvrtc.CompileError) as err:
        cc.compile("src", arch="sm_90")
    first = str(err.value).splitlines()[0]
    assert (
        first
        == 'kernel.cu:5: error: identifier "a" is undefined (NVRTC 13.2, sm_90, 2 more errors)'
    )
    assert err.value.errors == [
        'kernel.cu:5: error: identifier "a" is undefined',
        'kernel.cu:9: error: expected a ";"',
        'kernel.cu:12: catastrophic error: cannot open source file "x.h"',
    ]
    assert "some context \ufffd" in err.value.log and fake.destroyed == 1
    fake.log = LOG.split(b"  some")[0] + b'kernel.cu(9): error: expected a ";"\n'
    with pytest.raises(
        nvrtc.CompileError, match=r"undefined \(NVRTC 13\.2, sm_90, 1 more errors\)\n"
    ):
        cc.compile("src")
    fake.log = b'kernel.cu(5): error: identifier "a" is undefined\n'
    with pytest.raises(nvrtc.CompileError, match=r"undefined \(NVRTC 13\.2, sm_90\)\n"):
        cc.compile("src")
    fake.log = b"something went wrong\n"
    with pytest.raises(nvrtc.CompileError, match=r"^k\.cu does not compile \(NVRTC 13\.2, sm_90\)"):
        cc.compile("src", name="k.cu")


# ----------------------------------------------------------------------------------------------
# the cache


def test_the_cache_gives_back_what_was_compiled(cc: Any, fake: FakeNvrtc, tmp_path: Path) -> None:
    folder = str(tmp_path / "a" / "b")  # made when first written
    fake.log = b"x" * 30000
    first = cc.compile("src", name_expressions=["k"], options=["-w"], cache_dir=folder)
    again = cc.compile("src", name_expressions=["k"], options=["-w"], cache_dir=folder)
    assert again.cached and not first.cached and again.compile_s == 0.0
    assert (again.key, again.arch, again.target, again.image, again.ptx, again.lowered) == (
        first.key, first.arch, first.target, first.image, first.ptx, first.lowered)  # fmt: skip
    assert again.options == first.options and again.nvrtc_version == (13, 2)
    assert again.log == "x" * 20000
    assert len([s for s, _ in fake.calls if s == "nvrtcCompileProgram"]) == 1


def test_the_key_covers_the_source_the_headers_and_the_options(cc: Any) -> None:
    keys = {
        cc.compile("src").key,
        cc.compile("src2").key,
        cc.compile("src", name="b.cu").key,
        cc.compile("src", target="ptx").key,
        cc.compile("src", options=["-w"]).key,
        cc.compile("src", name_expressions=["k"]).key,
        cc.compile("src", headers={"a.cuh": "1"}).key,
        cc.compile("src", headers={"a.cuh": "2"}).key,
    }
    assert len(keys) == 8 and cc.compile("src").key in keys


def _entry(tmp_path: Path, cc: Any) -> tuple[Any, dict[str, Any]]:
    first = cc.compile("src", cache_dir=str(tmp_path))
    return first, json.loads((tmp_path / f"{first.key}.json").read_text())


def test_an_entry_under_another_key_is_compiled_again(cc: Any, tmp_path: Path) -> None:
    first, _meta = _entry(tmp_path, cc)
    other = cc.compile("other", cache_dir=str(tmp_path))
    for suffix in (".bin", ".ptx", ".json"):  # first's files under other's key
        (tmp_path / f"{other.key}{suffix}").write_bytes(
            (tmp_path / f"{first.key}{suffix}").read_bytes()
        )
    assert nvrtc._cache_read(str(tmp_path), other.key) is None
    assert not cc.compile("other", cache_dir=str(tmp_path)).cached


def test_an_entry_that_is_no_object_or_lacks_a_field_is_compiled_again(
    cc: Any, tmp_path: Path
) -> None:
    first, meta = _entry(tmp_path, cc)
    path = tmp_path / f"{first.key}.json"
    path.write_text(json.dumps([first.key]))
    assert nvrtc._cache_read(str(tmp_path), first.key) is None
    for broken in ({"nvrtc": [13]}, {"nvrtc": None}, {"lowered": 5}):
        path.write_text(json.dumps({**meta, **broken}))
        assert nvrtc._cache_read(str(tmp_path), first.key) is None, broken
    del meta["arch"]
    path.write_text(json.dumps(meta))
    assert nvrtc._cache_read(str(tmp_path), first.key) is None


def test_an_entry_with_undecodable_ptx_is_read_with_replacements(cc: Any, tmp_path: Path) -> None:
    first, meta = _entry(tmp_path, cc)
    image, ptx = (tmp_path / f"{first.key}.bin").read_bytes(), b".version \xff\n"
    (tmp_path / f"{first.key}.ptx").write_bytes(ptx)
    meta["sha256"] = hashlib.sha256(image + b"\0" + ptx).hexdigest()
    (tmp_path / f"{first.key}.json").write_text(json.dumps(meta))
    got = nvrtc._cache_read(str(tmp_path), first.key)
    assert got is not None and got.ptx == ".version \ufffd\n"


def test_a_cache_that_cannot_be_written_costs_only_the_write(cc: Any, tmp_path: Path) -> None:
    blocker = _touch(tmp_path / "file")
    out = cc.compile("src", cache_dir=str(blocker / "sub"))
    assert out.image and not out.cached


# ----------------------------------------------------------------------------------------------
# get and the PTX check on text


def test_get_loads_once_with_the_major_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    monkeypatch.setattr(nvrtc, "_INSTANCE", [])
    monkeypatch.setattr(nvrtc, "Nvrtc", lambda prefer_major=None: made.append(prefer_major) or object())  # fmt: skip
    first = nvrtc.get(12)
    assert nvrtc.get(13) is first and made == [12]


def test_the_ptx_check_on_ptx_text() -> None:
    ptx = (
        ".extern .func (.param .b32 r) vprintf\n.extern .func malloc\n.extern .func free\n"
        ".extern .func __assertfail\n.global .align 1 .b8 $str[3] = {104, 105, 0};\n"
        ".global .align 4 .u32 counter;\n.visible .global .align 4 .b32 __unnamed_1[2];\n"
    )
    found = nvrtc.ptx_findings(ptx)
    assert ("device_state", "calls malloc (the device heap)") in found
    assert ("device_state", "calls free (the device heap)") in found
    assert ("cuda_host_code", "calls vprintf (device printf)") in found
    assert {d.split(":")[0] for c, d in found if d.startswith("device global")} == {
        "device global $str", "device global counter", "device global __unnamed_1"}  # fmt: skip
    debug = nvrtc.ptx_findings(ptx, debug=True)
    assert [d.split(":")[0] for c, d in debug if d.startswith("device global")] == [
        "device global counter"
    ]
    assert not any("vprintf" in d or "__assertfail" in d for _, d in debug)
