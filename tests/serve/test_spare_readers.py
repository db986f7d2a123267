"""The relay's connections take reader handles made before they came (serve/spare_readers.py): making
one on a busy controller took up to seconds, on every command's first statement."""

from __future__ import annotations

import threading
import time

from stethoscope.serve.spare_readers import SpareReaders


class Handle:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class SlowMaker:
    """Makes a handle in `seconds`; None (serve stops) after `stop()`."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.made, self.stopped = seconds, [], threading.Event()

    def __call__(self) -> Handle | None:
        time.sleep(self.seconds)
        if self.stopped.is_set():
            return None
        self.made.append(Handle())
        return self.made[-1]


def until(condition, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "not within the limit"
        time.sleep(0.01)


def test_a_connection_takes_a_reader_made_before_it_came_and_another_is_made_behind_it():
    maker = SlowMaker(0.3)
    spares = SpareReaders(maker, keep=2).start()
    until(lambda: len(maker.made) == 2)
    started = time.monotonic()
    taken = spares.take()
    assert time.monotonic() - started < 0.1  # not the 0.3 s of making one
    assert taken in maker.made
    until(lambda: len(maker.made) == 3)  # the spare replaced in the background
    spares.close()
    assert [h.closed for h in maker.made if h is not taken] == [True, True]
    assert not taken.closed  # the connection's own, closed when it ends


def test_with_no_spare_left_a_connection_makes_its_own_and_none_is_made_after_close():
    maker = SlowMaker(0.05)
    spares = SpareReaders(maker, keep=1).start()
    until(lambda: len(maker.made) == 1)
    first, second = spares.take(), spares.take()
    assert first is not second and {first, second} <= set(maker.made)
    spares.close()
    made = len(maker.made)
    time.sleep(0.2)
    assert len(maker.made) == made
    assert all(h.closed for h in maker.made if h not in (first, second))


def refilling() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == "stethoscope-relay-spares")


def test_serve_stopping_ends_the_refills_and_nothing_is_taken_after_close():
    before = refilling()
    maker = SlowMaker(0.05)
    spares = SpareReaders(maker, keep=2).start()
    until(lambda: len(maker.made) == 2)
    maker.stopped.set()
    spares.close(wait=2.0)
    assert spares.take() is None  # a ready spare is not handed out once serve stops
    until(lambda: refilling() == before)
    assert all(h.closed for h in maker.made)
