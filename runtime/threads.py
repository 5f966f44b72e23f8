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
import threading
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


def thread_options(threads: int) -> list[int]:
    """The pool sizes a :class:`PoolTuner` chooses among: all threads, one core fewer (the
    common case: one other busy process), half, one."""
    return sorted({threads, threads - 1, threads // 2, 1} - {0}, reverse=True)


class PoolTuner:
    """How many of TVM's pool threads this thread's kernels run on, chosen by measuring steps.

    Why: TVM's pool splits each kernel evenly over its threads, pins the workers to cores and
    makes the launching thread spin until the last part is done. When another process keeps
    one core busy, the worker on that core runs only when the OS scheduler gives it a time
    slice, and every one of a forward's hundreds of kernels waits for it: SmolLM2 decoded at
    21-29 tok/s instead of 190 beside one ``yes`` on a 2-core EPYC, where one thread gave
    117-179. No setting is right on every host and load, and the load changes while a server
    runs, so the tuner measures: per pool size and step shape, a running mean of step seconds
    (weight EMA per step: it has to remember the rare 80-300 ms step that all threads take
    beside a busy process, which costs more than all its ordinary ones). The size with the
    lowest mean for the step's shape is current. The others' means are kept fresh by probes:
    PROBE steps at another size after FIRST_PROBE steps (beside a busy process the first steps
    on all threads took 250-610 ms, against 8 on one), then at intervals that double from
    PROBE_MIN, and at least long enough that lost probes cost BUDGET of the time (up to
    PROBE_MAX), and at once when a step is SLOWDOWN x slower or faster than its mean (a
    process started or ended beside us). A probe ends at its first step slower than the
    current size's mean: on an idle host it costs one slower step. Bits do not depend on the pool size: every kernel
    splits its outputs, never a reduction, over threads (tests/runtime/test_threads.py checks it)."""

    PROBE_MIN, PROBE_MAX = 32, 256  # steps between probes, growing while the current size stays best
    BUDGET = 0.01  # share of the time lost probes may cost
    PROBE = 3  # most steps a probe runs at another size
    FIRST_PROBE = 3  # steps before the first probe: a fresh process knows nothing of its host
    SLOWDOWN = 3.0  # a step this far from its mean: the host changed
    EMA = 1 / 8  # weight of a step in its size's mean

    def __init__(self, threads: int, apply=None):
        self.options = thread_options(threads)
        self.current = self.options[0]
        self.apply = apply or _config_pool  # apply(threads): resize this thread's TVM pool
        self.mean: dict = {}  # (size, step shape) -> running mean seconds
        self.seen: set = set()  # (size, step shape) whose first step ran
        self.steps = 0
        self.interval = self.PROBE_MIN
        self.probe_at = self.FIRST_PROBE
        self.turn = 0  # which other size the next probe tries
        self.probe: list[float] = []  # seconds of the running probe's steps
        self.previous, self.switched_at = None, 0  # the size before the last switch, and when
        self.running = None  # the size the step in flight runs at
        self.owner = None  # (thread ident, size) the pool was last set for
        self.switches = 0

    def begin(self) -> int:
        """The pool size for the step about to run (set on this thread's pool)."""
        others = [n for n in self.options if n != self.current]
        if others and not self.probe and self.steps >= self.probe_at:
            self.turn += 1
        probing = others and (self.probe or self.steps >= self.probe_at)
        size = others[self.turn % len(others)] if probing else self.current
        self._set(size)
        self.running = size
        return size

    def end(self, shape, seconds: float) -> None:
        """The step begun last had this shape (anything hashable: its rows and draft forwards)
        and took ``seconds``."""
        size, self.running = self.running, None
        self.steps += 1
        if size != self.current:
            self._probed(size, shape, seconds)
        elif (size, shape) not in self.seen:
            self.seen.add((size, shape))  # a shape's first step is slow (allocations, cold caches): not timed
        else:
            mean = self.mean.get((size, shape))
            settled = self.steps - self.switched_at >= self.PROBE_MIN  # (a fresh switch answers for itself)
            if settled and mean is not None and not mean / self.SLOWDOWN <= seconds <= self.SLOWDOWN * mean:
                self.probe_at, self.interval = self.steps, self.PROBE_MIN  # the host changed: compare sizes now
            self.mean[size, shape] = seconds if mean is None else mean + self.EMA * (seconds - mean)
            self._choose(shape)
        self._set(self.current)  # what runs before the next step (a prefill) runs at the current size

    def _probed(self, size: int, shape, seconds: float) -> None:
        """A probe's step: the probe's own steps, not older ones, say what this size costs now."""
        ours = self.mean.get((self.current, shape))
        self.probe.append(seconds)
        # it runs on while its steps beat the current size's mean: one slower step already loses it
        if len(self.probe) < self.PROBE and ours is not None and seconds < ours:
            return
        ran, self.mean[size, shape] = len(self.probe), sum(self.probe) / len(self.probe)
        self.probe = []
        if ours is None or not self._choose(shape):  # the probe lost: the next one waits longer
            loss = ran * max(self.mean[size, shape] / ours - 1, 0.0) / self.BUDGET if ours else 0.0
            self.interval = int(min(max(2 * self.interval, loss), self.PROBE_MAX))
        self.probe_at = self.steps + self.interval

    def _choose(self, shape) -> bool:
        """Make the size with the lowest mean for this shape current; whether it changed. Going
        back to the size left within the last PROBE_MIN steps counts as a lost probe (beside a
        busy process, a few steps on all threads can be fast by luck)."""
        means = {n: self.mean[n, shape] for n in self.options if (n, shape) in self.mean}
        best = min(means, key=lambda n: (means[n], n != self.current))
        if best == self.current:
            return False
        if best == self.previous and self.steps - self.switched_at < self.PROBE_MIN:
            self.interval = min(2 * self.interval, self.PROBE_MAX)
            self.probe_at = self.steps + self.interval
        self.previous, self.current, self.switched_at = self.current, best, self.steps
        self.switches += 1
        return True

    def _set(self, size: int) -> None:
        key = (threading.get_ident(), size)  # TVM keeps a pool per launching thread
        if self.owner != key:
            self.apply(size)
            self.owner = key


def _config_pool(threads: int) -> None:
    """Resize the calling thread's TVM thread pool (TVM keeps one pool per launching thread;
    its workers stay alive, only how many a kernel uses changes). Mode 1 is TVM's default
    affinity (workers on the big cores, the launching thread free to move)."""
    import tvm

    tvm.get_global_func("runtime.config_threadpool")(1, threads)
