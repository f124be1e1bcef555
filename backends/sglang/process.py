"""What SGLang does to the process that hosts it, kept in the gateway's hands.

SGLang's ``Engine`` assumes it owns its process (SGLang 0.5.23, paths under ``sglang/srt/``):

* ``entrypoints/engine.py`` sets ``log_level="error"`` unless given, and ``utils/common.py``
  ``configure_logger`` calls ``logging.basicConfig(..., force=True)``: the root logger's handlers
  (the gateway's text or JSON format) are replaced and its level raised, so every INFO line of the
  gateway would vanish once an engine started.
* Its children and watchdogs report a failure by signalling SIGQUIT to the process
  (``utils/watchdog.py`` ``SubprocessWatchdog`` when a scheduler or detokenizer exits with an error;
  ``managers/scheduler.py`` on an exception), and the handler it installs on the event loop
  (``managers/tokenizer_manager.py`` ``running_phase_sigquit_handler``) kills the whole process tree,
  the gateway included. Without a handler SIGQUIT's default action kills the process as well.

* ``managers/tokenizer_manager.py`` ``auto_create_handle_loop`` runs two tasks on the gateway's loop,
  each under ``print_exception_wrapper``, which on an exception calls the manager's
  ``dump_requests_before_crash`` and then ``kill_process_tree(os.getpid(), include_parent=True)``: an
  error in SGLang's output loop (``handle_loop``) would kill the gateway. The other task,
  ``sigterm_watchdog``, waits for ``gracefully_exit`` (set by SGLang's SIGTERM handler), drains, kills
  SGLang's processes and ends with ``sys.exit(0)`` (a ``SystemExit`` out of the gateway's loop) unless a
  server stop hook is set. That same call replaces the loop's SIGTERM handler with SGLang's.

* Its scheduler and detokenizer processes inherit the gateway's stderr and write their own text lines
  there (``configure_logger`` in each process: "Prefill batch...", tracebacks), which breaks
  ``--log-format json``.

``kept_logging`` undoes the first around the engine's start; ``SigquitGuard`` owns SIGQUIT while an
SGLang engine runs, so a failed child turns the engine NOT_READY (its in-flight requests end with a
retryable error) instead of killing the gateway; ``contain_exits`` does the same for the third;
``ChildLines`` gives SGLang's processes a pipe for stderr and re-emits their lines through the
gateway's logging (logger ``sglang.processes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def gateway_log_level() -> str:
    """The level the operator chose for the gateway, as SGLang's ``log_level`` names it."""
    return logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()


@contextlib.contextmanager
def kept_logging() -> Iterator[None]:
    """Restore the root logger's handlers and level once SGLang's ``configure_logger`` replaced them."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)


class ChildLines:
    """SGLang's child processes' stderr, re-emitted line by line through the gateway's logging.

    Around SGLang's start (``capture``) the process's fd 2 is a pipe, which the processes SGLang spawns
    then inherit for good; the gateway's stderr is its own again afterwards. A thread reads the pipe until
    the last child closed it. Lines that arrive while fd 2 is still the pipe are held until it is not, so
    that no re-emitted line goes round the pipe again (anything the gateway itself wrote in that window
    is re-emitted too, as such a line). They are logged at the gateway's level at start, which SGLang's
    processes log at (``gateway_log_level``): no line they print is filtered out here.
    """

    def __init__(self) -> None:
        self._log = logging.getLogger("sglang.processes")
        self._lock = threading.Lock()
        self._held: list[str] | None = []
        self._level = logging.INFO

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Let the processes started inside write their stderr into the pipe."""
        self._level = max(logging.getLogger().getEffectiveLevel(), logging.DEBUG)
        try:
            saved = os.dup(2)
        except OSError:  # no stderr to keep clean (closed by whoever started the gateway)
            yield
            return
        read_end, write_end = os.pipe()
        sys.stderr.flush()
        os.dup2(write_end, 2)
        os.close(write_end)
        threading.Thread(target=self._relay, args=(read_end,), name="sglang-stderr", daemon=True).start()
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            with self._lock:
                held, self._held = self._held or [], None
            for line in held:
                self._emit(line)

    def _relay(self, read_end: int) -> None:
        with open(read_end, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                with self._lock:
                    if self._held is not None:
                        self._held.append(line)
                        continue
                self._emit(line)

    def _emit(self, line: str) -> None:
        text = line.rstrip()
        if text:
            self._log.log(self._level, "%s", text)


class SigquitGuard:
    """The gateway's SIGQUIT handler while an SGLang engine runs: a failure is recorded, never fatal.

    ``install`` runs before SGLang starts (its children may fail while it loads) and again once its
    tokenizer manager replaced the handler with its own (``auto_create_handle_loop``). Signal handlers
    belong to the main thread: elsewhere (a test harness's thread) nothing is installed and SGLang keeps
    its own behaviour, which is logged.
    """

    def __init__(self, on_failure: Callable[[str], None]) -> None:
        self._on_failure = on_failure
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> None:
        """Handle SIGQUIT on the running loop (replacing SGLang's handler)."""
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGQUIT, self._on_sigquit)
        except (RuntimeError, ValueError):  # not the main thread: signals cannot be handled here
            log.warning("SGLang's SIGQUIT handling stays in place: the gateway's loop is not in the main thread")
            return
        self._loop = loop

    def remove(self) -> None:
        """Give SIGQUIT its default action back (SGLang's processes are gone)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_signal_handler(signal.SIGQUIT)
        self._loop = None

    def _on_sigquit(self) -> None:
        self._on_failure("an SGLang subprocess failed (SIGQUIT from SGLang's watchdog or one of its processes)")


class ContainedExit(Exception):
    """Raised in place of SGLang's crash exit: it ends SGLang's failed task, never the gateway's process."""


def contain_exits(manager: Any, on_failure: Callable[[str], None]) -> None:
    """Turn each way SGLang's tokenizer manager ends its process into ``on_failure`` (set before
    ``auto_create_handle_loop`` starts the tasks that take them).

    ``print_exception_wrapper`` calls the manager's ``dump_requests_before_crash`` before killing the
    process tree: the manager's own is replaced by one that reports the failure and raises, so the
    wrapper's task ends there. SGLang's SIGTERM watchdog ends with its server stop hook in place of
    ``sys.exit(0)``; it only runs if SGLang's own SIGTERM handler did (the gateway's is put back).
    """

    def crashed() -> None:
        on_failure("SGLang's tokenizer manager failed (its traceback is logged above)")
        raise ContainedExit("SGLang's crash exit, contained: the gateway's process keeps running")

    manager.dump_requests_before_crash = crashed
    manager.set_server_stop_hook(lambda: on_failure("SGLang's SIGTERM watchdog stopped its processes"))


def process_alive(pid: int) -> bool:
    """A child process that still runs: listed in ``/proc`` and not a zombie (SGLang runs on Linux only)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


__all__ = [
    "ChildLines",
    "ContainedExit",
    "SigquitGuard",
    "contain_exits",
    "gateway_log_level",
    "kept_logging",
    "process_alive",
]
