"""A CUDA context current on the launching thread, before a tilus program's first launch there.

A tilus program's host code encodes its TMA descriptors with the CUDA driver
(``cuTensorMapEncodeTiled``) before it makes any runtime call, and the driver needs a context
current on the calling thread. A thread that has made no CUDA runtime call of its own has none:
autograd's backward thread, a server's worker threads. torch's device guard does not help on
device 0, since it calls ``cudaSetDevice`` only when the device changes and a fresh thread's device
already reads 0. The encode then fails (tilus does not check its result), and the kernel runs with
a garbage descriptor: "an illegal instruction was encountered", and the process's CUDA context is
lost. Without this module, ``linear``'s backward loses it whenever its dX runs one of the series'
kernels.

So every launch path of the project calls ``make_current_once(device)`` first: it checks once per
thread, and where the thread has no current context, makes the device's primary context (the one
torch and the runtime use) current. The native entry calls it on a thread's first launch too.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Optional, Union

import torch

_thread = threading.local()


def make_current_once(device: Union[torch.device, int, None]) -> None:
    """Make ``device``'s primary context current on this thread if the thread has none (checked on
    the thread's first launch only: afterwards one attribute read)."""
    if getattr(_thread, "checked", False):
        return
    make_current(device)


def make_current(device: Union[torch.device, int, None]) -> None:
    """Where this thread has no current CUDA context, make ``device``'s primary context current."""
    driver = _driver()
    if driver is not None:
        context = ctypes.c_void_p()
        if driver.cuCtxGetCurrent(ctypes.byref(context)) == 0 and not context.value:
            index = _index(device)
            handle = ctypes.c_int()
            # retained and not released: the runtime holds the primary context for the process anyway
            if driver.cuDeviceGet(ctypes.byref(handle), index) == 0:
                if driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle) == 0:
                    driver.cuCtxSetCurrent(context)
    _thread.checked = True


def launch_index(device: torch.device) -> Optional[int]:
    """``device``'s index for ``launch_on``: None off a GPU (the tests' stand-in kernels)."""
    return device.index if device.type == "cuda" else None


def launch_on(index: Optional[int], launch, *args) -> None:
    """``launch(*args)`` with GPU ``index`` current (the thread's context made current first): at once
    where it is current already, the common case, which a device guard's two switches would only
    slow down; ``index`` None: as things are (a launch on the CPU, the tests' stand-ins)."""
    if index is None:
        launch(*args)
        return
    make_current_once(index)
    if index == torch._C._cuda_getDevice():  # without current_device()'s initialization check
        launch(*args)
    else:
        with torch.cuda.device(index):
            launch(*args)


def on_device(device: Union[torch.device, int]):
    """``torch.cuda.device(device)`` for a launch: the thread's context made current first."""
    make_current_once(device)
    return torch.cuda.device(device)


def _index(device: Union[torch.device, int, None]) -> int:
    if isinstance(device, int):
        return device
    if device is None or torch.device(device).index is None:
        return torch.cuda.current_device()
    return torch.device(device).index


@functools.cache
def _driver() -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:  # no driver: nothing launches here
        return None
