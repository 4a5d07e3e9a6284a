"""Work that ``matmul()`` hands to a thread of its own, so that no call waits on it: deriving an
unseen call's plan, tuning a shape bucket and building a chosen kernel (the last two in a child
process the thread waits for; a built library is then opened here).

``Worker`` runs one job at a time on one daemon thread, started when needed, which lingers
``linger_s`` for more work (starting a thread costs the caller tens of microseconds). A key already
queued or running is not queued again, so a bucket is tuned once however many calls ask; jobs of
one ``group`` queued together are handed over together (``run(group, payloads)``), so one child
tunes every waiting bucket. A job that raises is logged.

A daemon thread inside torch when the interpreter finalizes aborts the whole process ("terminate
called without an active exception"). So at exit every worker is closed (``close``: queue dropped,
no new job), and one whose jobs call torch (``exit_join_s``: the planner's) gets up to that long
(``EXIT_JOIN_S`` in all) to finish; its jobs look at ``closing`` between steps. Tuning and building
workers only wait on a child and are not waited for.

The caller and a worker share the GIL, and a thread that wants it waits up to the switch interval
(5 ms): a plan's derivation would add milliseconds to calls of microseconds. While any job runs,
``quick_switching`` lowers the interval to ``SWITCH_INTERVAL_S`` and restores it after the last.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import sys
import threading
import time
import weakref
from typing import Any, Callable, Hashable, Optional

log = logging.getLogger(__name__)

EXIT_JOIN_S = 2.0  # at exit, the longest wait for the workers' threads, in all
SWITCH_INTERVAL_S = 5e-5  # the GIL's switch interval while background work runs (Python's default: 5 ms)

_switching = threading.Lock()
_jobs_running = 0
_saved_interval: Optional[float] = None


@contextlib.contextmanager
def quick_switching():
    """The GIL's switch interval at ``SWITCH_INTERVAL_S`` (or the caller's, if lower) while the block runs."""
    global _jobs_running, _saved_interval
    with _switching:
        if _jobs_running == 0:
            _saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(_saved_interval, SWITCH_INTERVAL_S))
        _jobs_running += 1
    try:
        yield
    finally:
        with _switching:
            _jobs_running -= 1
            if _jobs_running == 0 and _saved_interval is not None:
                sys.setswitchinterval(_saved_interval)
                _saved_interval = None


class Worker:
    def __init__(
        self,
        name: str,
        run: Callable[[Hashable, list[Any]], None],
        linger_s: float = 0.0,
        poll_s: Optional[float] = None,
        exit_join_s: float = 0.0,
    ):
        self.name = name
        self.run = run
        self.linger_s = linger_s
        # while it lingers, the thread looks at the queue this often for jobs submitted without a wake
        self.poll_s = poll_s
        # at exit, how long to wait for the job under way: a job that calls torch needs it; one that
        # waits on a child process (tuning, building) must not hold the caller's exit for minutes
        self.exit_join_s = exit_join_s
        self.condition = threading.Condition()
        self.queue: collections.OrderedDict[Hashable, tuple[Hashable, Any]] = collections.OrderedDict()
        self.running: set[Hashable] = set()
        self.thread: Optional[threading.Thread] = None
        self.closing = False  # set by ``close``: no job is queued or started from then on
        _workers.add(self)

    def close(self) -> None:
        """Drop the queued jobs and start no more (the process is exiting); the job running finishes."""
        with self.condition:
            self.closing = True
            self.queue.clear()
            self.condition.notify_all()

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the thread to end; whether it has."""
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            return not thread.is_alive()
        return True

    def submit(self, key: Hashable, payload: Any, group: Hashable = None, wake: bool = True) -> bool:
        """Queue ``payload`` under ``key`` (jobs of one ``group`` may run together); False if that key
        is queued or running already. ``wake=False`` leaves a lingering thread asleep until its next
        look at the queue (``poll_s``): a thread woken now would take the GIL the moment the caller
        releases it (a launch) and hold it when the caller wants it back, for a job that would only
        wait anyway."""
        with self.condition:
            if key in self.queue or key in self.running or self.closing:
                return False
            self.queue[key] = (group, payload)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self.thread.start()
            elif wake or self.poll_s is None:
                self.condition.notify_all()
            return True

    def pending(self, key: Hashable) -> bool:
        """Whether the job of ``key`` is queued or running."""
        with self.condition:
            return key in self.queue or key in self.running

    def busy(self) -> bool:
        """Whether any job is queued or running."""
        with self.condition:
            return bool(self.queue or self.running)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until nothing is queued or running; False if ``timeout`` (seconds) passed first."""
        with self.condition:
            return self.condition.wait_for(lambda: not self.queue and not self.running, timeout)

    def _loop(self) -> None:
        while True:
            with self.condition:
                if not self.queue and self.linger_s > 0:
                    deadline = time.monotonic() + self.linger_s
                    while not self.queue and not self.closing and (left := deadline - time.monotonic()) > 0:
                        self.condition.wait(left if self.poll_s is None else min(left, self.poll_s))
                if not self.queue or self.closing:
                    self.thread = None
                    return
                key, (group, first) = self.queue.popitem(last=False)
                keys, payloads = [key], [first]
                del first
                if group is not None:
                    for other in [k for k, (g, _) in self.queue.items() if g == group]:
                        keys.append(other)
                        payloads.append(self.queue.pop(other)[1])
                self.running.update(keys)
            try:
                with quick_switching():
                    # the list is the payloads' only holder: a job may release each one as it is done
                    self.run(group, payloads)
            except Exception:  # the caller's calls go on with what they had; the next job runs
                log.exception("matmul(): background job %s of %s failed", keys, self.name)
            finally:
                del payloads
                with self.condition:
                    self.running.difference_update(keys)
                    self.condition.notify_all()


_workers: "weakref.WeakSet[Worker]" = weakref.WeakSet()


@atexit.register
def _close_workers() -> None:
    """At exit, before the interpreter finalizes (module doc): close every worker, then give the
    threads of those that ask for it (``exit_join_s``) ``EXIT_JOIN_S`` in all to finish."""
    workers = list(_workers)
    for worker in workers:
        worker.close()
    deadline = time.monotonic() + EXIT_JOIN_S
    for worker in workers:
        if worker.exit_join_s > 0:
            worker.join(max(min(worker.exit_join_s, deadline - time.monotonic()), 0.0))
