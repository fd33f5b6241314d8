"""Where a call's time goes: a few calls under torch's profiler (`profile_calls`), summed per call.

`profile_decode` profiles an engine's decode steps: it starts ``batch`` greedy requests, steps past their prefill, then profiles
``steps`` decode steps and reports, per step: the wall time; on CUDA the device's busy time (its
kernels and copies) and the top device kernels; the host's top operators by their own time; and
the CUDA runtime calls (``cudaLaunchKernel``, ``cudaGraphLaunch``, ``cudaMemcpyAsync``,
``cudaStreamSynchronize``, ``cudaEventSynchronize``...) with their host time, which shows whether
a step's host waits for the device (a synchronizing copy or read) or is the bottleneck itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from engine.core import EngineCore
from sampling.params import SamplingParams

TOP = 12
NAME_CHARS = 90


@dataclass(frozen=True)
class ProfiledCall:
    """One kernel, operator or runtime call: its time and count summed over the profiled calls, divided by them."""

    name: str
    ms_per_call: float
    count_per_call: float


@dataclass(frozen=True)
class CallsProfile:
    """Some calls of one function under torch's profiler, per call."""

    calls: int
    wall_ms_per_call: float
    device_busy_ms_per_call: float | None
    """The device's kernels and copies (None on the CPU)."""
    top_device: list[ProfiledCall]
    top_host_ops: list[ProfiledCall]
    runtime_calls: list[ProfiledCall]

    def as_row(self) -> dict[str, object]:
        return asdict(self)


def profile_calls(call: Callable[[], object], calls: int, cuda: bool) -> CallsProfile:
    """Run ``call`` ``calls`` times under torch's profiler (CUDA activity too when ``cuda``)."""
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as profiler:
        started = time.perf_counter()
        for _ in range(calls):
            call()
        wall_s = time.perf_counter() - started
        if cuda:
            torch.cuda.synchronize()
    events = profiler.key_averages()
    device = [e for e in events if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0]
    host = [e for e in events if e.device_type == DeviceType.CPU and e.self_cpu_time_total > 0]

    def ranked(chosen: list, microseconds: str) -> list[ProfiledCall]:
        top = sorted(chosen, key=lambda e: getattr(e, microseconds), reverse=True)[:TOP]
        return [ProfiledCall(e.key[:NAME_CHARS], round(getattr(e, microseconds) / 1000 / calls, 4), round(e.count / calls, 2)) for e in top]

    return CallsProfile(
        calls=calls,
        wall_ms_per_call=round(1000 * wall_s / calls, 3),
        device_busy_ms_per_call=round(sum(e.self_device_time_total for e in device) / 1000 / calls, 4) if cuda else None,
        top_device=ranked(device, "self_device_time_total"),
        top_host_ops=ranked([e for e in host if not e.key.startswith("cuda")], "self_cpu_time_total"),
        runtime_calls=ranked([e for e in host if e.key.startswith("cuda")], "self_cpu_time_total"),
    )


def profile_decode(engine: EngineCore, batch: int, prompt_len: int, steps: int) -> CallsProfile:
    """Profile ``steps`` decode steps of ``batch`` greedy requests of ``prompt_len`` tokens on ``engine`` (left idle)."""
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    for index in range(batch):
        engine.add_request(f"profile{index}", [(11 * index + 5 * position) % 30000 + 100 for position in range(prompt_len)], params)
    while not engine.step():  # the prefill (async scheduling returns it a step later)
        pass
    for _ in range(2):
        engine.step()
    try:
        return profile_calls(engine.step, steps, engine.runner.device.type == "cuda")
    finally:  # the engine is left idle, profiled or not
        while engine.has_unfinished_requests():
            engine.step()


def profile_row(profile: Callable[[], CallsProfile]) -> dict[str, object]:
    """``profile()``'s row, or the error it raised: a profiler that fails (CUPTI refused on a device) costs
    its own row, not the measurements taken before it."""
    try:
        return profile().as_row()
    except RuntimeError as error:
        return {"error": f"{type(error).__name__}: {error}"[:500]}


def profile_lines(row: dict[str, object], shown: int = 6) -> list[str]:
    """A printed summary of a `profile_row` (or a row that extends one)."""
    if "error" in row:
        return [f"    profiling failed: {row['error']}"]
    lines = [f"    {row['wall_ms_per_call']} ms a call, device busy {row['device_busy_ms_per_call']} ms"]
    for kind in ("top_device", "runtime_calls", "top_host_ops"):
        lines += [f"    {kind:13} {c['ms_per_call']:8.3f} ms {c['count_per_call']:7.1f}x  {c['name']}" for c in row[kind][:shown]]
    return lines
