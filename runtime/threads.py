"""How many CPU threads TVM's kernels run on.

TVM sizes its CPU thread pool as ``hardware_concurrency / 2`` on x86 unless told otherwise,
assuming two hyper-threads per core. On a VM or a phone without SMT that halves the
machine: on a 2-vCPU EPYC it is one thread, and Qwen2.5-1.5B q4 decodes at 28 tok/s
instead of 44. So before the first kernel runs (the pool reads the setting once, when it
is created), we set ``TVM_NUM_THREADS`` to the number of *physical* cores this process may
run on, counted from the kernel's CPU topology, unless the user chose a value through
``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS``.

Who calls :func:`configure_threads`, and why there: importing a library must not change the
process's environment, so nothing does it at import. Our own entry points do it, each
before it can run a TVM kernel: the ``speccompile`` command's main group (every
subcommand, the server included), the runtime's ``Model`` loader (runtime/model.py: every
engine, draft model and head of the Python API loads through it before its first forward)
and the test session (tests/conftest.py). An application that runs TVM kernels of its own
before loading a model should export ``TVM_NUM_THREADS`` itself, as C API embedders do.
"""
from __future__ import annotations

import os
from pathlib import Path

USER_VARIABLES = ("TVM_NUM_THREADS", "OMP_NUM_THREADS")  # TVM's pool honours the first one set


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


def user_threads() -> int | None:
    """The thread count the user chose through the environment, or None."""
    for var in USER_VARIABLES:
        if os.environ.get(var, "").strip().isdigit():
            return int(os.environ[var])
    return None


def thread_count() -> int:
    """The thread count :func:`configure_threads` puts (or has put) in effect, without
    changing anything: what a cost profile measured on this host depends on
    (runtime/costs.py keys its cache with it)."""
    chosen = user_threads()
    return chosen if chosen is not None else physical_cores()


def configure_threads() -> int:
    """Set TVM_NUM_THREADS unless the user did; returns the thread count in effect.

    Call it before the first TVM kernel of the process runs; later calls are harmless (a
    value set by an earlier call counts as the user's)."""
    chosen = user_threads()
    if chosen is not None:
        return chosen
    n = physical_cores()
    os.environ["TVM_NUM_THREADS"] = str(n)
    return n
