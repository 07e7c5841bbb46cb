"""Stopping a long command cleanly on Ctrl-C (SIGINT) or SIGTERM: one implementation for every
command that trains or writes a dataset.

A signal must never land in the middle of a step or of a save, or the run directory would hold
half of one. Inside :func:`stop_signals` a signal therefore only sets a flag, which the loop reads
at its safe points (between steps, between chunks); there the loop saves what a rerun with
``--resume`` continues from and raises :class:`Interrupted`, whose message is the one line the
user sees. Work whose partial result is thrown away anyway (decoding a chunk that is not written
yet) runs inside :meth:`StopSignals.abortable`, where the first signal raises
``KeyboardInterrupt`` at once instead of making the user wait for the chunk to finish. Every
later signal is only recorded, so a second Ctrl-C cannot cut a save short. The command line
turns :class:`Interrupted` into that line on stderr and exit code 130
(:func:`exits_on_interrupt`).

A signal is routed to one flag per process: a :func:`stop_signals` block inside another (a
training run inside an experiment) shares the outer block's flag, so every loop on the way stops
at its own safe point and none misses a signal the other took. Worker processes that run an
experiment's jobs route the signals to one flag for their whole life
(:func:`worker_stop_signals`), and are started with the signals blocked
(:func:`signals_blocked`) so that a signal cannot kill one with a traceback while it starts.

>>> import signal
>>> with stop_signals() as stop:
...     signal.raise_signal(signal.SIGINT)  # lands mid-step: recorded, nothing raised
...     stop.requested, stop.name
(True, 'SIGINT')
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TypeVar

__all__ = [
    "INTERRUPTED",
    "Interrupted",
    "StopSignals",
    "exits_on_interrupt",
    "signals_blocked",
    "stop_signals",
    "worker_stop_signals",
]

INTERRUPTED = 130  # 128 + SIGINT: what shells report for a command stopped by Ctrl-C
SIGNALS = (signal.SIGINT, signal.SIGTERM)

A = TypeVar("A")


RESUME_HINT = " (rerun with --resume to continue)"


class Interrupted(KeyboardInterrupt):
    """A command stopped at a safe point after SIGINT or SIGTERM. ``what`` says where it stopped
    and what was saved (``"at step 41/120; saved DIR"``), ``resumable`` whether ``--resume``
    continues it; ``str(err)`` is the one line the user sees (``"interrupted " + what``, and the
    hint). A ``KeyboardInterrupt``, so that no ``except Exception`` on the way up swallows it.

    >>> str(Interrupted("at step 3/9; saved ckpt", resumable=True))
    'interrupted at step 3/9; saved ckpt (rerun with --resume to continue)'
    """

    def __init__(self, what: str, *, resumable: bool = False) -> None:
        super().__init__(f"interrupted {what}" + (RESUME_HINT if resumable else ""))
        self.what, self.resumable = what, resumable


class StopSignals:
    """What :func:`stop_signals` hands the loop: whether a signal came, and which."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._abortable = False
        self._raised = False  # the first signal was raised in an abortable region
        self._retrying = False  # it landed in a finalizer and was sent again

    @property
    def requested(self) -> bool:
        """A signal came: stop at the next safe point."""
        return self.signum is not None

    @property
    def name(self) -> str | None:
        """``"SIGINT"`` or ``"SIGTERM"`` (None before any signal)."""
        return None if self.signum is None else signal.Signals(self.signum).name

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: records the first signal; raises only for the first one, and
        only inside :meth:`abortable`. A signal that lands while a finalizer runs (a
        ``__del__``, a ``weakref.finalize`` callback) is not raised there: Python would print
        the exception as "Exception ignored in ..." with its traceback and drop it. The signal
        is sent again a moment later, to be raised once the finalizer has returned."""
        first = self.signum is None
        if first:
            self.signum = signum
        if not (self._abortable and not self._raised and (first or self._retrying)):
            return
        if _in_finalizer(frame):
            self._retrying = True
            retry = threading.Timer(RETRY_S, self._resend, (signum,))
            retry.daemon = True
            retry.start()
            return
        self._raised, self._retrying = True, False
        raise KeyboardInterrupt

    def _resend(self, signum: int) -> None:
        """Send a signal that landed in a finalizer again, unless its region ended meanwhile."""
        if self._retrying:
            os.kill(os.getpid(), signum)

    @contextmanager
    def abortable(self) -> Iterator[None]:
        """A region whose work is discarded when interrupted: the first signal raises
        ``KeyboardInterrupt`` at once (on entry, if one came before). The caller catches it,
        cleans up outside the region and raises :class:`Interrupted`."""
        if self.requested:
            raise KeyboardInterrupt
        self._abortable = True
        try:
            yield
        finally:
            self._abortable = self._retrying = False


RETRY_S = 0.01  # how soon a signal that landed in a finalizer is sent again


def _in_finalizer(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside an object's finalizer, where an exception is printed and
    dropped instead of propagated."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code.co_qualname == "finalize.__call__":
            return True
        frame = frame.f_back
    return False


Handler = Callable[[int, FrameType | None], object] | int
_routed: StopSignals | None = None  # where SIGINT and SIGTERM go now, if to a StopSignals


def _route(stop: StopSignals) -> dict[signal.Signals, Handler]:
    """Install ``stop``'s handler for the signals not ignored; returns the handlers replaced."""
    previous: dict[signal.Signals, Handler] = {}
    for sig in SIGNALS:
        handler = signal.getsignal(sig)
        if handler is not signal.SIG_IGN:
            previous[sig] = signal.SIG_DFL if handler is None else handler
            signal.signal(sig, stop.handle)
    return previous


@contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """Route SIGINT and SIGTERM to a :class:`StopSignals` for the block, restoring the previous
    handlers afterwards. Inside another such block the outer :class:`StopSignals` is shared (a
    signal is routed once, and one that came before the inner block stops it at its first safe
    point). Outside the main thread (which alone may install handlers) and for a signal that is
    ignored (SIGINT of a background job) the handling stays as it was."""
    global _routed
    if _routed is not None:
        yield _routed
        return
    if threading.current_thread() is not threading.main_thread():
        yield StopSignals()
        return
    stop = _routed = StopSignals()
    previous = _route(stop)
    try:
        yield stop
    finally:
        _routed = None
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def signals_blocked() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back in this thread for the block (POSIX; elsewhere a no-op); one
    that comes meanwhile is delivered when the block ends. Processes started inside inherit the
    mask: what :func:`worker_stop_signals` unblocks once its handlers are in place."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def worker_stop_signals() -> None:
    """The initializer of a worker process that runs jobs for a parent: SIGINT and SIGTERM go
    to one :class:`StopSignals` for the rest of the process, which every :func:`stop_signals`
    block of every job shares (a signal that comes between two jobs stops the next one at its
    first safe point), then the signals the parent blocked (:func:`signals_blocked`) are let
    through."""
    global _routed
    _routed = StopSignals()
    _route(_routed)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def exits_on_interrupt(run: Callable[[A], int]) -> Callable[[A], int]:
    """A command's ``run`` that ends an interruption with one line on stderr and exit code 130
    instead of a traceback: :class:`Interrupted`'s message, or, for a Ctrl-C before the run
    installed its handlers (while importing, loading), that nothing was saved."""

    @functools.wraps(run)
    def wrapped(args: A) -> int:
        try:
            return run(args)
        except Interrupted as err:
            message = str(err)
        except KeyboardInterrupt:
            message = "interrupted before the run started; nothing saved"
        print(f"brisk: {message}", file=sys.stderr)
        return INTERRUPTED

    return wrapped
