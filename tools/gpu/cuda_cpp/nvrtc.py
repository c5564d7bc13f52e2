"""NVRTC through ctypes: CUDA C++ source -> cubin (or PTX) for one GPU architecture, no GPU
needed, cached by content hash in a folder the caller names.

Staged to the GPU host beside runner.py; standard library only. Used by harnesslab_cuda.py (the
candidate's launcher, in the sandboxed candidate process) and, for evidence, by the trusted side
(`ptx_findings` on PTX it compiled itself). What it compiles is always agent-written source, so
nothing here trusts a cache entry beyond its own key and checksum, and NVRTC only reads what
the harness names: the option list is an allowlist (no include paths, no pre-includes, no
relocatable code, nothing that writes files), headers the source may include come from the
toolkit's include folder or from memory (`stdint.h`, `cstdint`, the candidate's own .cuh files
handed over by the launcher).

Where libnvrtc comes from, first found: torch's CUDA wheels (site-packages `nvidia/cu13/lib`,
`nvidia/cuda_nvrtc/lib`), the pip wheels `nvidia-cuda-nvrtc` + `nvidia-cuda-runtime` (CUDA 13,
headers in `nvidia/cu13/include`), the toolkit (`/usr/local/cuda*/lib64`), the loader's path.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CACHE_FORMAT = 1
DEFAULT_STD = "-std=c++17"
ARCH_RE = re.compile(r"^sm_(\d{2,3})a?$")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Options a candidate may pass (exact, or a prefix followed by a value). The harness adds the
# architecture, the language standard (unless given) and the include folder itself.
ALLOWED_EXACT = {
    "--use_fast_math", "-use_fast_math", "-lineinfo", "--generate-line-info",
    "--extra-device-vectorization", "-extra-device-vectorization", "--restrict", "-restrict",
    "--device-as-default-execution-space", "-default-device", "--disable-warnings", "-w",
    "-std=c++17", "--std=c++17", "-std=c++20", "--std=c++20",
}  # fmt: skip
ALLOWED_PREFIX = (
    "--fmad=", "-fmad=", "--ftz=", "-ftz=", "--prec-div=", "-prec-div=", "--prec-sqrt=",
    "-prec-sqrt=", "--maxrregcount=", "-maxrregcount=", "-D",
)  # fmt: skip
# In-memory headers: NVRTC ships no C library headers, and the toolkit's stdint.h is a host
# header. These are what a kernel needs from them.
_INTS = [("int8_t", "signed char"), ("uint8_t", "unsigned char"), ("int16_t", "short"),
         ("uint16_t", "unsigned short"), ("int32_t", "int"), ("uint32_t", "unsigned int"),
         ("int64_t", "long long"), ("uint64_t", "unsigned long long"),
         ("intptr_t", "long long"), ("uintptr_t", "unsigned long long")]  # fmt: skip
STDINT_H = (
    "#pragma once\n"
    + "".join(f"typedef {c} {t};\n" for t, c in _INTS)
    + "#define INT32_MAX 2147483647\n#define INT32_MIN (-INT32_MAX - 1)\n"
    "#define UINT32_MAX 4294967295u\n#define INT64_MAX 9223372036854775807LL\n"
)
CSTDINT = (
    "#pragma once\n#include <stdint.h>\nnamespace std {\n"
    + "".join(f"using ::{t};\n" for t, _ in _INTS)
    + "}\n"
)
BUILTIN_HEADERS = {"stdint.h": STDINT_H, "cstdint": CSTDINT}

# PTX that a kernel never needs and a gamed one does (tools/integrity/scan_cuda.py says the same
# of the source; this is the check macros and builtins cannot hide from).
SPECIAL_REGISTERS = re.compile(
    r"%(globaltimer(?:_lo|_hi)?|clock(?:64|_hi)?|smid|nsmid|gridid|warpid|nwarpid|"
    r"pm[0-7](?:_64)?|envreg\d+|current_graph_exec)\b"
)
PTX_GLOBAL_VAR = re.compile(
    r"^\s*(?:\.(?:visible|weak|extern)\s+)*\.global\s+[^;]*?([A-Za-z_$][\w$]*)\s*(?:\[[^\]]*\])?"
    r"\s*(?:=[^;]*)?;",
    re.MULTILINE,
)
PTX_EXTERN_FUNC = re.compile(
    r"^\s*\.extern\s+\.func\s*(?:\([^)]*\))?\s*([A-Za-z_$][\w$]*)", re.MULTILINE
)
ALLOWED_EXTERN = {"__assertfail"}  # assert(): traps, harmless
COMPILER_STRINGS = re.compile(r"^(\$str(\$\d+)?|__unnamed_\d+)$")  # printf/assert messages
LOG_LINE = re.compile(r"^(?P<file>[^\s(]+)\((?P<line>\d+)\): (?P<rest>.*)$")


class NvrtcError(RuntimeError):
    """NVRTC is missing, refused an option, or failed a call."""


class NvrtcNotFound(NvrtcError):
    pass


class OptionError(NvrtcError):
    pass


class CompileError(NvrtcError):
    """The source does not compile: `errors` are `file:line: error: ...` lines, `log` all."""

    def __init__(self, message: str, log: str, errors: list[str]) -> None:
        super().__init__(message)
        self.log, self.errors = log, errors


@dataclass(frozen=True)
class Compiled:
    key: str
    arch: str  # "sm_90", or "compute_90" for target="ptx"
    target: str  # "cubin" or "ptx"
    image: bytes  # what the driver loads: the cubin, or the PTX text
    ptx: str
    lowered: dict[str, str]  # name expression -> the function's name in the image
    log: str
    nvrtc_version: tuple[int, int]
    compile_s: float
    cached: bool = False
    options: tuple[str, ...] = field(default=())


# ----------------------------------------------------------------------------------------------
# finding the library and the headers


def _site_dirs() -> list[str]:
    return [p for p in sys.path if p and os.path.isdir(os.path.join(p, "nvidia"))]


def library_candidates() -> list[str]:
    """Every libnvrtc this process could use, in the order find_library prefers them."""
    found: list[str] = []
    for site in _site_dirs():
        for sub in ("cu13", "cuda_nvrtc", "cu12"):
            found += sorted(glob.glob(os.path.join(site, "nvidia", sub, "lib", "libnvrtc.so.*")))
    for root in ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]:
        for lib in ("lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            found += sorted(glob.glob(os.path.join(root, lib, "libnvrtc.so*")))
    good = [p for p in found if "builtins" not in os.path.basename(p) and ".alt." not in p]
    return list(dict.fromkeys(good))


def _major_of(path: str) -> int | None:
    m = re.search(r"libnvrtc\.so\.(\d+)", path) or re.search(r"cuda-(\d+)", path)
    return int(m.group(1)) if m else None


def find_library(prefer_major: int | None = None) -> str | None:
    """The libnvrtc to load: with `prefer_major` (torch's CUDA major) one of that major first."""
    cands = library_candidates()
    if prefer_major is not None:
        cands.sort(key=lambda p: _major_of(p) != prefer_major)  # stable: keeps the order
    return cands[0] if cands else None


def _cudart_major(include: str) -> int | None:
    try:
        with open(os.path.join(include, "cuda_runtime_api.h"), errors="replace") as f:
            m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
    except OSError:
        return None
    return int(m.group(1)) // 1000 if m else None


def find_include_dir(library: str | None, major: int) -> str | None:
    """The folder with cuda_fp16.h for NVRTC `major`: beside the library, the pip runtime wheel,
    the toolkit. One of the same CUDA major wins; else any."""
    cands: list[str] = []
    if library:
        cands.append(os.path.join(os.path.dirname(os.path.dirname(library)), "include"))
    for site in _site_dirs():
        cands += [os.path.join(site, "nvidia", sub, "include") for sub in ("cu13", "cuda_runtime")]
    cands += ["/usr/local/cuda/include", *sorted(glob.glob("/usr/local/cuda-*/include"))]
    have = [c for c in dict.fromkeys(cands) if os.path.isfile(os.path.join(c, "cuda_fp16.h"))]
    # Same major first, then the most complete (the toolkit's folder has CCCL's nv/target and
    # crt/, which cooperative_groups.h and mma.h need; the pip runtime wheel has neither).
    have.sort(key=lambda c: (_cudart_major(c) != major,
                             not os.path.isfile(os.path.join(c, "nv", "target")),
                             not os.path.isfile(os.path.join(c, "crt", "mma.h"))))  # fmt: skip
    return have[0] if have else None


# ----------------------------------------------------------------------------------------------
# options


def define_options(defines: Mapping[str, Any] | None) -> list[str]:
    """`-DNAME=value` for each define: ints, floats, bools (1/0) and single-line strings."""
    out = []
    for name, value in (defines or {}).items():
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise OptionError(f"define {name!r}: a -D name is a C identifier")
        if isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, int | float):
            text = repr(value)
        elif isinstance(value, str) and "\n" not in value and len(value) <= 200:
            text = value
        else:
            raise OptionError(
                f"define {name}={value!r}: a -D value is an int, a float, a bool or a "
                "one-line string"
            )
        out.append(f"-D{name}={text}")
    return out


def check_options(options: Iterable[str]) -> list[str]:
    """The options as given, or OptionError naming the first one NVRTC may not get from a
    candidate (include paths, pre-includes, architecture, relocatable code, file output)."""
    out = []
    for opt in options:
        if not isinstance(opt, str) or not (
            opt in ALLOWED_EXACT or (opt.startswith(ALLOWED_PREFIX) and "\n" not in opt)
        ):
            raise OptionError(
                f"NVRTC option {opt!r} is not allowed. Allowed: {', '.join(sorted(ALLOWED_EXACT))}"
                f" and {', '.join(p + '...' for p in ALLOWED_PREFIX)}; the harness sets the "
                "architecture and the include folder"
            )
        out.append(opt)
    return out


# ----------------------------------------------------------------------------------------------
# the compiler


class Nvrtc:
    """libnvrtc with checked calls. One instance per process is enough (`get()`)."""

    def __init__(self, path: str | None = None, *, prefer_major: int | None = None) -> None:
        path = path or find_library(prefer_major)
        if path is None:
            raise NvrtcNotFound(
                "NVRTC (libnvrtc) is not installed here: install the CUDA toolkit, or "
                "`pip install nvidia-cuda-nvrtc nvidia-cuda-runtime` (CUDA 13; torch's CUDA wheels "
                "ship it too)"
            )
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as exc:
            raise NvrtcNotFound(f"cannot load {path}: {exc}") from exc
        self.path = path
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._call("nvrtcVersion", ctypes.byref(major), ctypes.byref(minor))
        self.version = (major.value, minor.value)
        self.include_dir = find_include_dir(path, major.value)
        self._header_version = _cudart_major(self.include_dir) if self.include_dir else None

    def _call(self, name: str, *args: Any) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            text = (self.lib.nvrtcGetErrorString(code) or b"unknown").decode(errors="replace")
            raise NvrtcError(f"{name} failed: {text} ({code})")

    def supported_archs(self) -> list[int]:
        n = ctypes.c_int()
        self._call("nvrtcGetNumSupportedArchs", ctypes.byref(n))
        archs = (ctypes.c_int * max(1, n.value))()
        self._call("nvrtcGetSupportedArchs", archs)
        return list(archs)[: n.value]

    def _options(self, arch: str, target: str, options: Sequence[str]) -> list[str]:
        m = ARCH_RE.match(arch)
        if m is None:
            raise OptionError(f"architecture {arch!r}: expected sm_<major><minor>, e.g. sm_90")
        if int(m.group(1)) not in self.supported_archs():
            raise OptionError(
                f"NVRTC {self.version[0]}.{self.version[1]} ({self.path}) cannot compile for "
                f"{arch}; it supports sm_{', sm_'.join(map(str, self.supported_archs()))}"
            )
        user = check_options(options)
        gpu = arch if target == "cubin" else arch.replace("sm_", "compute_")
        out = [f"--gpu-architecture={gpu}"]
        if not any(o.lstrip("-").startswith("std=") for o in user):
            out.append(DEFAULT_STD)
        if self.include_dir:
            out.append(f"--include-path={self.include_dir}")
        return out + user

    def compile(
        self,
        source: str,
        *,
        name: str = "kernel.cu",
        arch: str = "sm_90",
        target: str = "cubin",
        defines: Mapping[str, Any] | None = None,
        options: Sequence[str] = (),
        name_expressions: Sequence[str] = (),
        headers: Mapping[str, str] | None = None,
        cache_dir: str | None = None,
    ) -> Compiled:
        """Compile `source` (the file name `name` appears in errors). `name_expressions` are
        kernels as C++ expressions (`rms_gate`, `softmax<__half, 8>`): each one's name in the
        image is in `lowered`. `headers` are in-memory files `#include "x.cuh"` may name. With
        `cache_dir`, an identical compile (source, headers, options, arch, NVRTC and header
        versions) is read back instead of compiled."""
        if target not in ("cubin", "ptx"):
            raise OptionError(f"target {target!r}: cubin or ptx")
        opts = self._options(arch, target, [*define_options(defines), *options])
        all_headers = {**BUILTIN_HEADERS, **(headers or {})}
        key = hashlib.sha256(
            json.dumps(
                [CACHE_FORMAT, source, name, target, opts, list(name_expressions),
                 sorted(all_headers.items()), self.version, self._header_version],
                sort_keys=True,
            ).encode()
        ).hexdigest()  # fmt: skip
        if cache_dir:
            hit = _cache_read(cache_dir, key)
            if hit is not None:
                return hit
        started = time.perf_counter()
        prog = ctypes.c_void_p()
        hnames = list(all_headers)
        srcs = (ctypes.c_char_p * len(hnames))(*[all_headers[h].encode() for h in hnames])
        incs = (ctypes.c_char_p * len(hnames))(*[h.encode() for h in hnames])
        self._call("nvrtcCreateProgram", ctypes.byref(prog), source.encode(), name.encode(),
                   len(hnames), srcs, incs)  # fmt: skip
        try:
            for expr in name_expressions:
                self._call("nvrtcAddNameExpression", prog, expr.encode())
            argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            code = self.lib.nvrtcCompileProgram(prog, len(opts), argv)
            log = self._log(prog)
            if code != 0:
                # The first error on the first line (one-line reasons keep only that), the
                # rest of the log after it.
                errors = parse_log(log)
                first = errors[0] if errors else f"{name} does not compile"
                more = f", {len(errors) - 1} more errors" if len(errors) > 1 else ""
                raise CompileError(
                    f"{first} (NVRTC {self.version[0]}.{self.version[1]}, {arch}{more})\n"
                    + log.strip()[:4000],
                    log,
                    errors,
                )
            ptx = self._blob(prog, "PTX").rstrip(b"\0").decode(errors="replace")
            image = self._blob(prog, "CUBIN") if target == "cubin" else ptx.encode()
            lowered = {}
            for expr in name_expressions:
                low = ctypes.c_char_p()
                self._call("nvrtcGetLoweredName", prog, expr.encode(), ctypes.byref(low))
                lowered[expr] = (low.value or b"").decode()
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))
        out = Compiled(
            key=key,
            arch=opts[0].split("=", 1)[1],
            target=target,
            image=image,
            ptx=ptx,
            lowered=lowered,
            log=log,
            nvrtc_version=self.version,
            compile_s=time.perf_counter() - started,
            options=tuple(opts),
        )
        if cache_dir:
            _cache_write(cache_dir, out)
        return out

    def _log(self, prog: Any) -> str:
        n = ctypes.c_size_t()
        self._call("nvrtcGetProgramLogSize", prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(max(1, n.value))
        self._call("nvrtcGetProgramLog", prog, buf)
        return buf.value.decode(errors="replace")

    def _blob(self, prog: Any, what: str) -> bytes:
        n = ctypes.c_size_t()
        self._call(f"nvrtcGet{what}Size", prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(max(1, n.value))
        self._call(f"nvrtcGet{what}", prog, buf)
        return buf.raw[: n.value]


_INSTANCE: list[Nvrtc] = []


def get(prefer_major: int | None = None) -> Nvrtc:
    """The process's NVRTC (loaded once)."""
    if not _INSTANCE:
        _INSTANCE.append(Nvrtc(prefer_major=prefer_major))
    return _INSTANCE[0]


def parse_log(log: str) -> list[str]:
    """NVRTC's `kernel.cu(12): error: ...` lines as `kernel.cu:12: error: ...`, errors only."""
    out = []
    for line in log.splitlines():
        m = LOG_LINE.match(line)
        if m and ("error" in m.group("rest").split(":", 1)[0]):
            out.append(f"{m.group('file')}:{m.group('line')}: {m.group('rest')}")
    return out


# ----------------------------------------------------------------------------------------------
# what compiled device code may not do (the PTX is the truth: macros and builtins included)


def ptx_findings(ptx: str, *, debug: bool = False) -> list[tuple[str, str]]:
    """(reason code, detail) for each thing in `ptx` a kernel may not do: read timers or
    hardware identity registers (cuda_timer), keep state in device globals that outlive a
    launch or use the device heap (device_state), call functions outside the module
    (cuda_host_code: device printf, device-side launches). Codes as tools/integrity/reasons.
    `debug` (eval's launcher): printf and the message strings of printf and assert() are
    allowed; the verify allows neither (a string global is a global the source could name)."""
    out: list[tuple[str, str]] = []
    for reg in sorted(set(SPECIAL_REGISTERS.findall(ptx))):
        out.append(("cuda_timer", f"reads %{reg} (a timer or which SM/warp/graph runs it)"))
    for var in sorted(set(PTX_GLOBAL_VAR.findall(ptx))):
        if debug and COMPILER_STRINGS.match(var):
            continue
        out.append((
            "device_state",
            f"device global {var}: state that outlives a launch (tables go in __constant__; "
            "printf/assert message strings count too)",
        ))  # fmt: skip
    allowed = ALLOWED_EXTERN | ({"vprintf"} if debug else set())
    for fn in sorted(set(PTX_EXTERN_FUNC.findall(ptx)) - allowed):
        code = "device_state" if fn in ("malloc", "free") else "cuda_host_code"
        what = {"vprintf": "device printf", "malloc": "the device heap", "free": "the device heap"}
        out.append((code, f"calls {fn} ({what.get(fn, 'a function outside the module')})"))
    return out


# ----------------------------------------------------------------------------------------------
# cache


def _cache_read(folder: str, key: str) -> Compiled | None:
    try:
        with open(os.path.join(folder, f"{key}.json")) as f:
            meta = json.load(f)
        with open(os.path.join(folder, f"{key}.bin"), "rb") as f:
            image = f.read()
        with open(os.path.join(folder, f"{key}.ptx"), "rb") as f:
            ptx = f.read()
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("key") != key:
        return None
    if meta.get("sha256") != hashlib.sha256(image + b"\0" + ptx).hexdigest():
        return None  # torn or edited: compile again
    try:
        return Compiled(
            key=key,
            arch=str(meta["arch"]),
            target=str(meta["target"]),
            image=image,
            ptx=ptx.decode(errors="replace"),
            lowered={str(k): str(v) for k, v in dict(meta["lowered"]).items()},
            log=str(meta.get("log", "")),
            nvrtc_version=(int(meta["nvrtc"][0]), int(meta["nvrtc"][1])),
            compile_s=0.0,
            cached=True,
            options=tuple(str(o) for o in meta.get("options", [])),
        )
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def _cache_write(folder: str, c: Compiled) -> None:
    """Three files written to temporaries and renamed; a reader checks the checksum."""
    try:
        os.makedirs(folder, exist_ok=True)
        ptx = c.ptx.encode()
        meta = {
            "key": c.key, "arch": c.arch, "target": c.target, "lowered": c.lowered,
            "log": c.log[:20000], "nvrtc": list(c.nvrtc_version), "options": list(c.options),
            "sha256": hashlib.sha256(c.image + b"\0" + ptx).hexdigest(),
        }  # fmt: skip
        tag = f".{os.getpid()}.{time.monotonic_ns()}.tmp"
        for suffix, data in (
            (".bin", c.image),
            (".ptx", ptx),
            (".json", json.dumps(meta).encode()),
        ):
            tmp = os.path.join(folder, c.key + suffix + tag)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, os.path.join(folder, c.key + suffix))
    except OSError:
        pass  # a cache that cannot be written costs a compile next time, nothing else


__all__ = [
    "ALLOWED_EXACT",
    "ALLOWED_PREFIX",
    "CompileError",
    "Compiled",
    "Nvrtc",
    "NvrtcError",
    "NvrtcNotFound",
    "OptionError",
    "check_options",
    "define_options",
    "find_include_dir",
    "find_library",
    "get",
    "library_candidates",
    "parse_log",
    "ptx_findings",
]
