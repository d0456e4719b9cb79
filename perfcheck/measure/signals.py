"""SIGINT/SIGTERM during a run: the step in flight finishes, every file is written, meta.json says
``interrupted``, then ``RunInterrupted`` is raised (a second signal raises it at once). A mixin of the
recording session (``measure.session.Recorder``), whose state it reads and sets."""
from __future__ import annotations

import os
import signal
import threading


#: Signals that end a run gracefully: the step in flight finishes, every file is written, meta.json says
#: ``interrupted``, then ``RunInterrupted`` is raised (a second signal raises it at once).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):
    """Raised by ``PerfCheck.step()`` (or at once, on a second signal) after SIGINT/SIGTERM: the run
    directory was written and marked ``interrupted``. A KeyboardInterrupt, so it ends the training loop
    as Ctrl-C does; the CLI prints it as one line."""

    def __init__(self, signum: int, where: str = ""):
        self.signum = int(signum)
        self.signame = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.signame}{where}")


class StopSignals:
    """The recording session's signal handling: installed at ``start()``, restored at ``stop()``."""

    def _catch_signals(self):
        """While running, SIGINT/SIGTERM end the run at the next step boundary (``_stop_interrupted``),
        not mid-step: the step in flight is finished and recorded, every file written. Installed only
        from the main thread (Python's rule) and only over the default handlers: a handler of the
        user's (or a framework's) is left alone."""
        self._signalled, self._stopping, self._saved_handlers, self._delivered = None, False, {}, False
        if threading.current_thread() is not threading.main_thread():
            return
        defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is defaults[sig]:
                self._saved_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        if self._signalled is not None and not self._stopping:  # a second signal: the step is not ending
            self._signalled = signum
            raise RunInterrupted(signum, " (second signal, mid-step)")
        self._signalled = signum

    def _stop_interrupted(self):
        """Stop (writing every file, meta.json ``interrupted``), then raise ``RunInterrupted``."""
        self._delivered = True
        self.stop()
        self._raise_interrupted()

    def _deliver_signal(self):
        """A signal no ``RunInterrupted`` answered (``stop()`` called before the next ``step()``) is sent
        again once the files are written and the handlers restored, so it is never swallowed: SIGTERM then
        ends the process as it would have, SIGINT raises KeyboardInterrupt from ``stop()``."""
        if self._signalled is not None and not self._delivered:
            self._delivered = True
            os.kill(os.getpid(), self._signalled)

    def _raise_interrupted(self):
        last = self._step_rows[-1]["step"] if self._step_rows else None
        where = (f" after step {last}" if last is not None else " before the first step ended") + (
            f"; every file written to {self.out_dir} (perfcheck report {self.out_dir})" if self.out_dir is not None else "")
        raise RunInterrupted(self._signalled, where)

    def _restore_signals(self):
        for sig, handler in getattr(self, "_saved_handlers", {}).items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, handler)
        self._saved_handlers = {}

    @property
    def interrupted(self) -> str | None:
        """The signal's name ('SIGINT', 'SIGTERM') when one ended the run, else None."""
        sig = getattr(self, "_signalled", None)
        return None if sig is None else signal.Signals(sig).name
