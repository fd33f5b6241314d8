"""Host values onto the device without the host waiting for the device's queued work.

On CUDA, a copy from pageable host memory (``tensor.to("cuda")``, ``torch.tensor(..., device="cuda")``,
``device_tensor[i] = host_tensor``) may first synchronize with the stream (CUDA's API
synchronization rules): the host then waits until every kernel already queued has run, which
undoes asynchronous scheduling, where the host prepares step N+1 while the device runs step N.
A copy from pinned memory is queued like a kernel; torch's caching host allocator keeps the pinned
block until the copy that reads it has run. Every host-to-device copy of the sampler's state and
of the engine's step inputs goes through here. On the CPU these are plain tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor's copy on ``device``, queued (on CUDA, staged through pinned memory); a tensor
    already off the host is moved as ``Tensor.to`` moves it."""
    if device.type != "cuda" or host.device.type != "cpu":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def copy_into(destination: torch.Tensor, host: torch.Tensor) -> None:
    """``destination.copy_(host)`` for a host tensor, queued as `to_device` (one transfer, no temporary on the device)."""
    if destination.device.type == "cuda":
        host = host.pin_memory()
    destination.copy_(host, non_blocking=True)


def values_to_device(values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """values: n numbers -> [n] of ``dtype`` on ``device``, queued as `to_device`."""
    return to_device(torch.tensor(values, dtype=dtype), device)
