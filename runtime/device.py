"""One parser for ``--device``, shared by ``compile`` and the runtime commands.

MLC-LLM users write devices as ``auto``, ``cpu``, ``cuda``, ``cuda:1``, ``opencl``,
``metal``, ``vulkan`` -- and, when compiling, a target string such as
``"llvm -mcpu=znver3"`` or a JSON target ``{"kind": "llvm", "mcpu": "znver3"}``. Both sides
must read these the same way, and the runtime must import only the TVM runtime, so the
parser lives here (pure Python, no TVM at all) and ``speccompile/compiler/targets.py`` imports it.

TVM 0.27 no longer parses CLI target strings (``Target("llvm -mcpu=x")`` raises), which
is one more reason to read them ourselves: the compile side turns the parsed attributes
into TVM's dict form.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

# what a user may write -> the kind speccompile uses ("llvm" is the CPU, as in TVM targets)
_KINDS = {"auto": "auto", "cpu": "llvm", "llvm": "llvm", "cuda": "cuda", "rocm": "rocm", "opencl": "opencl",
          "vulkan": "vulkan", "metal": "metal", "android": "android", "iphone": "iphone"}
# names of app/OS targets: something to compile for, not a device to run on
COMPILE_ONLY = ("android", "iphone")
# runtime-only kinds: MLC-LLM runs on them, speccompile has no code generator for them
RUNTIME_ONLY = ("rocm",)
# target-string attributes compile understands, per kind (anything else is refused by name)
TARGET_ATTRS = {"llvm": ("mcpu", "mtriple", "mattr", "num-cores"), "cuda": ("arch",)}


class DeviceError(ValueError):
    """A --device string that cannot be used, with what to write instead."""


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed --device: ``kind`` ("auto", "llvm" for the CPU, "cuda", ...), the device
    ``index`` when one was given (``cuda:1`` -> 1), and target-string ``attrs``
    (``"llvm -mcpu=znver3"`` -> {"mcpu": "znver3"}; compile only)."""

    text: str
    kind: str
    index: int | None = None
    attrs: dict = field(default_factory=dict)

    @property
    def tvm_device_type(self) -> str:
        """The name ``tvm.device()`` takes: "cpu" for the CPU, else the kind."""
        return "cpu" if self.kind == "llvm" else self.kind


def _accepted(for_compile: bool) -> str:
    if for_compile:
        return ('auto, cpu (= llvm), cuda, opencl, metal, vulkan, android, iphone, a device index such as cuda:0, '
                'or a target string such as "llvm -mcpu=znver3" / \'{"kind": "llvm", "mcpu": "znver3"}\'')
    return "auto, cpu, cuda, rocm, opencl, metal or vulkan, optionally with a device index (cuda:1, cpu:0)"


def _kind(name: str, text: str, for_compile: bool) -> str:
    kind = _KINDS.get(name.lower())
    if kind is None:
        raise DeviceError(f"unknown --device {text!r}; use {_accepted(for_compile)}")
    if not for_compile and kind in COMPILE_ONLY:
        raise DeviceError(f"--device {text!r} names a compile target (an app archive), not a device to run on; "
                          f"at run time use {_accepted(False)}")
    if for_compile and kind in RUNTIME_ONLY:
        raise DeviceError(f"speccompile cannot compile for {kind}; use {_accepted(True)}")
    return kind


def _target_attrs(kind: str, pairs: dict, text: str) -> dict:
    allowed = TARGET_ATTRS.get(kind, ())
    for key in pairs:
        if key not in allowed:
            have = f"it takes {', '.join('-' + a for a in allowed)}" if allowed else "it takes no attributes"
            raise DeviceError(f"--device {text!r}: unknown attribute -{key} for {kind}; {have}")
    attrs = dict(pairs)
    if "mattr" in attrs:  # "+avx2,+fma" or a JSON list
        mattr = attrs["mattr"]
        items = mattr if isinstance(mattr, list) else [m for m in str(mattr).split(",") if m]
        bad = [m for m in items if not (isinstance(m, str) and len(m) > 1 and m[0] in "+-")]
        if bad or not items:
            raise DeviceError(f"--device {text!r}: -mattr takes +feature/-feature items, e.g. -mattr=+avx512vnni")
        attrs["mattr"] = list(items)
    if "num-cores" in attrs:
        try:
            attrs["num-cores"] = int(attrs["num-cores"])
        except (TypeError, ValueError):
            raise DeviceError(f"--device {text!r}: -num-cores takes an integer") from None
        if attrs["num-cores"] < 1:
            raise DeviceError(f"--device {text!r}: -num-cores must be >= 1")
    return attrs


def parse_device(text: str, for_compile: bool = False) -> DeviceSpec:
    """Read a --device string; raise DeviceError naming what is wrong and what to write.

    ``for_compile`` admits target strings, JSON targets and the app targets (android,
    iphone); at run time only a device, with an optional index, makes sense."""
    raw = (text or "").strip()
    if not raw:
        raise DeviceError(f"--device is empty; use {_accepted(for_compile)}")
    if raw.startswith("{"):
        if not for_compile:
            raise DeviceError(f"--device {raw!r} is a compile target; at run time use {_accepted(False)}")
        try:
            obj = json.loads(raw)
        except ValueError as err:
            raise DeviceError(f"--device {raw!r} is not valid JSON: {err}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
            raise DeviceError(f'--device {raw!r}: a JSON target needs a "kind", e.g. {{"kind": "llvm", "mcpu": "znver3"}}')
        kind = _kind(obj["kind"], raw, True)
        return DeviceSpec(raw, kind, None, _target_attrs(kind, {k: v for k, v in obj.items() if k != "kind"}, raw))
    words = raw.split()
    head, options = words[0], words[1:]
    index = None
    if ":" in head:
        head, _, idx = head.partition(":")
        if not idx.isdigit():
            raise DeviceError(f"--device {raw!r}: the device index after ':' must be a number, e.g. cuda:0")
        index = int(idx)
    kind = _kind(head, raw, for_compile)
    if options and not for_compile:
        raise DeviceError(f"--device {raw!r} is a compile target string; at run time use {_accepted(False)}")
    if kind == "auto" and (options or index is not None):
        raise DeviceError(f"--device {raw!r}: auto takes no index or attributes")
    if kind == "llvm" and index not in (None, 0):
        raise DeviceError(f"--device {raw!r}: the CPU is a single device; write cpu (or cpu:0)")
    pairs: dict = {}
    for opt in options:
        key, eq, value = opt.lstrip("-").partition("=")
        if not opt.startswith("-") or not eq or not key or not value:
            raise DeviceError(f"--device {raw!r}: {opt!r} is not of the form -key=value (e.g. -mcpu=znver3)")
        if key in pairs:
            raise DeviceError(f"--device {raw!r}: -{key} is given twice")
        pairs[key] = value
    return DeviceSpec(raw, kind, index, _target_attrs(kind, pairs, raw))
