"""How many CPU threads TVM's kernels run on.

TVM sizes its CPU thread pool as ``hardware_concurrency / 2`` on x86 unless told otherwise,
assuming two hyper-threads per core. On a VM or a phone without SMT that halves the
machine: on a 2-vCPU EPYC it is one thread, and Qwen2.5-1.5B q4 decodes at 28 tok/s
instead of 44. So before the first kernel runs (the pool reads the setting when it is
created), we set ``TVM_NUM_THREADS`` to the number of *physical* cores this process may
run on, counted from the kernel's CPU topology, unless the user chose a value through
``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS``.
"""
from __future__ import annotations

import os
from pathlib import Path


def physical_cores() -> int:
    """Distinct (package, core) pairs among the CPUs this process may use."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text().strip(),
                       topo.joinpath("core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))  # no topology (not Linux, or hidden): count the CPU itself
    return max(1, len(cores))


def configure_threads() -> int:
    """Set TVM_NUM_THREADS unless the user did; returns the thread count in effect."""
    for var in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var, "").strip().isdigit():
            return int(os.environ[var])
    n = physical_cores()
    os.environ["TVM_NUM_THREADS"] = str(n)
    return n
