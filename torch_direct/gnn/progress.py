"""Progress bars for long work (data sets, epochs, benchmarks): tqdm when installed, else a
plain line on stderr redrawn at most twice a second. The one progress helper of the package."""

from __future__ import annotations

import sys
import time


class _Plain:
    """A minimal stand-in for tqdm: one line, redrawn at most twice a second."""

    def __init__(self, total: int, desc: str, disable: bool):
        self.total, self.desc, self.disable = total, desc, disable
        self.n = 0
        self._start = self._last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if not self.disable and (now - self._last >= 0.5 or self.n >= self.total):
            self._last = now
            pct = 100.0 * self.n / self.total if self.total else 100.0
            sys.stderr.write(f"\r{self.desc}: {pct:5.1f}% ({self.n}/{self.total}) {now - self._start:.1f}s")
            sys.stderr.flush()

    def close(self) -> None:
        if not self.disable and self.n:
            sys.stderr.write("\n")
            sys.stderr.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def progress(total: int, desc: str, enabled: bool = True):
    """A context-managed bar with ``update(n)``; silent when ``enabled`` is false."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _Plain(total, desc, not enabled)
    return tqdm(total=total, desc=desc, disable=not enabled, leave=False)


def track(it, total: int, desc: str, enabled: bool = True):
    """Iterate over ``it`` (``total`` items) with a :func:`progress` bar."""
    with progress(total, desc, enabled) as bar:
        for x in it:
            yield x
            bar.update(1)
