"""``shutdown``: an engine-core process already exiting on its own is waited for, a running one is not."""

from __future__ import annotations

import multiprocessing
import signal
import time
from multiprocessing.synchronize import Event

from openengine_backends.vllm.shutdown import await_exits_under_way, handles


def _serve_until_terminated(ready: Event) -> None:  # a running engine core: SIGTERM handled, as in its busy loop
    signal.signal(signal.SIGTERM, lambda *_: None)
    ready.set()
    time.sleep(30)


def _exit_on_its_own(ready: Event) -> None:  # an engine core past its busy loop: default actions back, cleaning up
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ready.set()
    time.sleep(0.5)


def test_a_process_exiting_on_its_own_is_joined_and_a_running_one_left_to_vllm() -> None:
    context = multiprocessing.get_context("spawn")
    readies = [context.Event(), context.Event()]
    running = context.Process(target=_serve_until_terminated, args=(readies[0],))
    exiting = context.Process(target=_exit_on_its_own, args=(readies[1],))
    running.start()
    exiting.start()
    try:
        assert all(ready.wait(30) for ready in readies)
        assert running.pid is not None and handles(running.pid, signal.SIGTERM)
        assert exiting.pid is not None and not handles(exiting.pid, signal.SIGTERM)
        started = time.monotonic()
        await_exits_under_way([running, exiting], grace_s=10)
        assert exiting.exitcode == 0, "joined: it ended by itself"
        assert running.is_alive() and time.monotonic() - started < 5, "not waited for: vLLM's shutdown stops it"
    finally:
        running.kill()
        running.join()


def test_a_process_that_cannot_be_inspected_counts_as_handling_the_signal() -> None:
    assert handles(2**22 + 1, signal.SIGTERM)  # above the largest pid: no /proc entry, left to vLLM's shutdown
