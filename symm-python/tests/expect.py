"""``expect``: the check every scenario makes of a refused call, framework-neutral (the torch
scenarios and ``scenarios_platform.py`` share it)."""

from __future__ import annotations

from typing import Any, Callable

import symm


def expect(cls: type, fn: Callable[[], Any], *needles: str, rank: Any = None, also: type = Exception) -> Exception:
    """Runs ``fn``; asserts it raises ``cls`` whose message contains every needle (and the
    rank, when given), which carries the class's stable code, and which is also an instance of
    ``also`` (the builtin class callers catch)."""
    try:
        fn()
    except cls as e:
        text = str(e)
        for n in needles:
            assert n in text, f"{cls.__name__} message lacks {n!r}: {text}"
        if rank is not None:
            assert f"rank {rank}" in text, f"message does not name rank {rank}: {text}"
            assert e.rank == rank, (e.rank, rank)
        assert isinstance(e, symm.SymmError)
        assert e.code == type(e).code or type(e) is symm.SymmError, (e.code, type(e).code)
        assert isinstance(e, also), (type(e).__mro__, also)
        return e
    except Exception as e:  # noqa: BLE001 - reported as the wrong class
        raise AssertionError(f"expected {cls.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"expected {cls.__name__}, nothing was raised")
