"""What the GPU check reads off the machine it runs on (names for the JSON and its file name)
and off a decode step (StepClock: library time against time blocked on the device)."""
from __future__ import annotations

import platform
import re
import subprocess
import time
from pathlib import Path


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_identity(device: str) -> tuple[str, str]:
    """(nvidia-smi's name, driver version), or the CPU's name for a dry run."""
    if device == "cpu":
        return f"CPU dry run: {cpu_name()}", "n/a"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        name, driver = (s.strip() for s in out.split(",", 1))
        return name, driver
    except (OSError, IndexError, ValueError, subprocess.TimeoutExpired):
        return "unknown GPU (nvidia-smi failed)", "unknown"


class StepClock:
    """Splits a decode step's wall time: time inside the library's calls, and time blocked on
    the device -- a sync placed before the step's first read of device results (the greedy
    verification), which would otherwise block in the same place."""

    def __init__(self, model):
        self.vm = self.wait = 0.0
        for name, fn in list(model._fn.items()):
            model._fn[name] = self._timed(fn)
        accept = model.accept_greedy

        def synced(*args, **kwargs):
            t0 = time.perf_counter()
            model.device.sync()
            self.wait += time.perf_counter() - t0
            return accept(*args, **kwargs)

        model.accept_greedy = synced

    def _timed(self, fn):
        def call(*args):
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.vm += time.perf_counter() - t0
        return call

    def reset(self) -> None:
        self.vm = self.wait = 0.0
