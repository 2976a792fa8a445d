"""Platforms: the deep-learning frameworks symm runs under.

``get_platform()`` returns the platform in use: the one given to ``set_platform``, else the one
named by ``SYMM_PLATFORM`` (``"torch"`` or ``"mindspore"``), else the framework whose
distributed runtime the process started (MindSpore when ``mindspore.communication.init()`` ran
and ``torch.distributed`` is not initialised; torch otherwise). The public API is the same on
every platform.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable, Dict, Optional

from .base import Desc, FastPath, Platform

__all__ = ["Desc", "FastPath", "Platform", "get_platform", "set_platform", "available_platforms"]


def _torch() -> Platform:
    from .. import library  # noqa: F401 - torch.ops.symm, and how torch.compile traces symm's calls
    from .torch import TorchPlatform

    return TorchPlatform()


def _mindspore() -> Platform:
    from .mindspore import MindSporePlatform

    return MindSporePlatform()


_FACTORIES: Dict[str, Callable[[], Platform]] = {"torch": _torch, "mindspore": _mindspore}
_lock = threading.Lock()
_current: Optional[Platform] = None


def available_platforms() -> list:
    """Names accepted by ``SYMM_PLATFORM``."""
    return sorted(_FACTORIES)


def set_platform(platform: Platform) -> None:
    """Uses ``platform`` from now on (before symm is initialised)."""
    global _current
    if not isinstance(platform, Platform):
        raise TypeError(f"platform = {platform!r}: expected a symm.platform.Platform")
    with _lock:
        _current = platform


def get_platform() -> Platform:
    """The platform in use (created on first call)."""
    global _current
    with _lock:
        if _current is None:
            name = os.environ.get("SYMM_PLATFORM", "").strip().lower() or _imported()
            factory = _FACTORIES.get(name)
            if factory is None:
                from .._symm import Unsupported

                raise Unsupported(
                    f"SYMM_PLATFORM = {name!r}: unknown platform; available: {', '.join(available_platforms())}"
                )
            _current = factory()
        return _current


def _imported() -> str:
    """The platform of the framework whose distributed runtime this process started: MindSpore's
    when ``mindspore.communication`` is initialised and ``torch.distributed`` is not (``import
    symm`` imports torch wherever it is installed), else torch's."""
    ms_comm = sys.modules.get("mindspore.communication")
    if ms_comm is None or not ms_comm.GlobalComm.INITED:
        return "torch"
    dist = sys.modules.get("torch.distributed")
    torch_started = dist is not None and dist.is_available() and dist.is_initialized()
    return "torch" if torch_started else "mindspore"
