"""``python -m deployments.stop`` (``make stop``): stop every Spout that ``make run`` started on this machine.

Each running launcher gets SIGTERM and stops its own processes (`deployments.launch`); whatever
still carries a launcher's mark after `STOP_TIMEOUT_S` (a launcher that hangs, or what a killed
one left) is ended here. Other Ray clusters on the machine are not touched.
"""

from __future__ import annotations

import psutil

from deployments.launch import DRAIN_TIMEOUT_S, DRIVER_GRACE_S
from deployments.processes import TERM_GRACE_S, describe, end_processes, find_launches

STOP_TIMEOUT_S = DRAIN_TIMEOUT_S + DRIVER_GRACE_S + TERM_GRACE_S + 10.0
"""A launcher's default drain, its wait for the driver and for what is left, and a margin (60 s)."""


def stop_launchers(pids: list[int]) -> None:
    """SIGTERM each launcher and wait up to `STOP_TIMEOUT_S` for them to finish stopping."""
    launchers = []
    for pid in pids:
        try:
            launchers.append(psutil.Process(pid))
            launchers[-1].terminate()
        except psutil.Error:
            pass
    psutil.wait_procs(launchers, timeout=STOP_TIMEOUT_S)


def main() -> None:
    launches = find_launches()
    stop_launchers([launch.launcher_pid for launch in launches if launch.launcher_alive])
    left = end_processes([p for launch in find_launches() for p in launch.processes])
    if left:
        raise SystemExit(f"could not end {', '.join(describe(p) for p in left)}: end them with `kill -9`")
    print(f"Stopped {len(launches)} Spout launch(es); no process of theirs is left" if launches else "No Spout is running here", flush=True)


if __name__ == "__main__":
    main()
