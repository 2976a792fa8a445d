"""Diagnostics: the core's log lines in ``logging``, statistics, flight-recorder dumps.

Log lines of the native core go to the logger ``symm`` (``logging.getLogger("symm")``) once
symm starts (``symm.init``, explicit or implicit). Which lines the core produces is its own
level: ``SYMM_LOG_LEVEL`` (``error`` by default; ``off``, ``warn``, ``info``, ``debug``,
``trace``) or ``symm.set_log_level``; the logger's handlers and level filter them further as
usual (``trace`` lines have level 5, below ``logging.DEBUG``).
"""

from __future__ import annotations

import atexit
import logging
from typing import Any, Callable, Dict, List, Union

from . import _symm

#: The logger the core's lines go to.
logger = logging.getLogger("symm")

#: The core's ``trace`` level in ``logging``.
TRACE = 5
logging.addLevelName(TRACE, "TRACE")


def install_logging() -> None:
    """Routes the core's log lines into the ``symm`` logger (idempotent)."""
    _symm.install_log_sink()


# Before the interpreter shuts down (and after every exit hook registered later): lines go to
# stderr from then on.
atexit.register(_symm.remove_log_sink)


def set_log_level(level: Union[str, int, None]) -> None:
    """Sets which lines the core logs, for the whole process: ``"off"``, ``"error"`` (the
    default, also from ``SYMM_LOG_LEVEL``), ``"warn"``, ``"info"``, ``"debug"``, ``"trace"``, or a
    ``logging`` level (``logging.INFO``; None: off)."""
    if level is None:
        level = "off"
    elif isinstance(level, int) and not isinstance(level, bool):
        if level >= logging.CRITICAL + 1:
            level = "off"
        elif level > logging.WARNING:
            level = "error"
        elif level > logging.INFO:
            level = "warn"
        elif level > logging.DEBUG:
            level = "info"
        elif level > TRACE:
            level = "debug"
        else:
            level = "trace"
    _symm.set_log_level(level)


def get_log_level() -> str:
    """The core's log level in effect (``"off"`` when nothing is logged)."""
    return _symm.log_level()


def _on_comm(call: Callable[[Any], Any], otherwise: Any) -> Any:
    """``call(communicator)``, or ``otherwise`` before symm starts (which this does not start)."""
    from . import _api

    st = _api._state
    return otherwise if st is None else call(st.comm)


def stats() -> List[Dict[str, Any]]:
    """Per-operation statistics of this rank since start (or ``reset_stats``): one dict per
    operation called at least once, with ``op`` (``"allreduce"``, ``"barrier"``, ...), ``calls``
    (failed ones included), ``bytes`` (payload: elements x dtype size of the caller's buffer;
    reduce_scatter and allgather: of the input, alltoall: of everything sent), ``time``
    (seconds spent in the calls), ``time_ns`` and ``errors``. The counters cover every group
    of this rank. Collectives and send/recv are timed only with ``SYMM_TIMING=1`` (their
    ``time`` is 0 otherwise: two clock readings were a third of a small call's software); the
    other operations always are. Empty before symm starts (this call does not start it)."""
    return _on_comm(_symm.stats, [])


def reset_stats() -> None:
    """Sets this rank's statistics back to zero."""
    _on_comm(_symm.reset_stats, None)


def dump() -> str:
    """The node-wide flight-recorder dump: the last operations (``SYMM_FLIGHT_RECORDER_ENTRIES``,
    default 64) of every rank on this node, with group, sequence number, size, state and
    times (untimed collectives, without ``SYMM_TIMING=1``: the moment they blocked). Local: no
    other rank takes part, so it works while the others hang."""
    return _on_comm(_symm.dump, "symm: not initialised in this process (no flight recorder)\n")


def flight_records() -> List[Dict[str, Any]]:
    """The flight recorder as data: one dict per rank of the node (``rank``, ``pid``, ``total``
    operations recorded, ``unreadable``, ``records``), this rank first; each record has
    ``index``, ``op``, ``group`` (global ranks, or None), ``group_id``, ``group_size``,
    ``seq``, ``count``, ``dtype``, ``state`` (``started``/``completed``/``failed``),
    ``timed``, ``start_ns`` and ``end_ns`` (CLOCK_MONOTONIC). A record is untimed (``timed``
    False) for collectives and send/recv without ``SYMM_TIMING=1``: its ``start_ns`` is then
    the moment the call blocked (0 if it never did) and its ``end_ns`` 0. Empty before symm
    starts.

    Raises:
        Unsupported: the recorder is off (``SYMM_FLIGHT_RECORDER_ENTRIES=0``).
    """
    return _on_comm(_symm.flight_records, [])


def install_dump_on_signal() -> None:
    """Makes SIGUSR1 print the flight-recorder dump of every communicator of this process to
    stderr (from a background thread; the handler itself only writes a byte to a pipe), as
    ``SYMM_DUMP_ON_SIGNAL=1`` does at start. Idempotent. ``kill -USR1 <pid>`` on a hung rank
    then shows what every rank of its node was doing."""
    _symm.install_dump_on_signal()
