"""`deployments.haproxy_front` without Ray: the config Ray 2.60's template writes, made private
(stats page and exporter on loopback), and the script the launcher installs in its private folder
exec'ing the real HAProxy on the copy. (`test_life_cycle.py` checks the addresses a real launch
listens on.)"""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from deployments.haproxy_front import COPY_SUFFIX, FORWARD_LINES, LOCAL_HOST, ConfigError, install, rewrite

# The sections of a config Ray 2.60 renders that the rewrite touches (indents as the template has them).
RAY_CONFIG = """global
    stats socket /tmp/x/admin.sock mode 666 level admin expose-fd listeners
defaults
    mode http
frontend prometheus
    bind :9101
    mode http
    http-request use-service prometheus-exporter if { path /metrics }
    no log
frontend http_frontend
    bind 127.0.0.1:8000
    acl routes path -i /-/routes
backend spout
    server r1 127.0.0.1:40001 check
listen stats
  bind *:8404
  stats enable
  stats uri /stats
"""


def test_the_stats_page_and_exporter_bind_loopback_and_nothing_else_changes():
    rewritten = rewrite(RAY_CONFIG).splitlines()
    assert "    bind 127.0.0.1:9101" in rewritten
    assert "  bind 127.0.0.1:8404" in rewritten
    assert "    bind 127.0.0.1:8000" in rewritten
    added = [line for line in rewritten if line not in RAY_CONFIG.splitlines() and "bind" not in line]
    assert added == list(FORWARD_LINES)
    assert [line for line in rewritten if "bind" not in line and line not in FORWARD_LINES] == [line for line in RAY_CONFIG.splitlines() if "bind" not in line]


def test_the_serving_frontend_replaces_the_clients_forwarded_for_with_its_own():
    rewritten = rewrite(RAY_CONFIG).splitlines()
    at = rewritten.index("frontend http_frontend")
    assert rewritten[at + 1 : at + 4] == ["    bind 127.0.0.1:8000", "    http-request del-header x-forwarded-for", "    option forwardfor"]


@pytest.mark.parametrize("section", ["listen stats", "frontend prometheus", "frontend http_frontend"])
def test_a_config_without_a_section_the_rewrite_expects_is_refused(section):
    config = RAY_CONFIG.replace(section, "listen other")
    with pytest.raises(ConfigError, match=section):
        rewrite(config)


FAKE_HAPROXY = """#!/bin/sh
# prints its arguments, then the config its -f names
echo "$@"
while [ "$1" != "-f" ]; do shift; done
cat "$2"
"""


def fake_haproxy(tmp_path):
    binary = tmp_path / "real-haproxy"
    binary.write_text(FAKE_HAPROXY)
    binary.chmod(0o700)
    return str(binary)


def test_the_installed_script_runs_the_real_haproxy_on_a_private_copy(tmp_path):
    """It runs as Ray's HAProxy binary, with the standard library only (``python -I -S``)."""
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    (folder / "haproxy.cfg").write_text(RAY_CONFIG)
    env = install(str(folder), fake_haproxy(tmp_path))
    script = env["RAY_SERVE_HAPROXY_BINARY_PATH"]
    assert os.path.dirname(script) == str(folder) and stat.S_IMODE(os.stat(script).st_mode) == 0o700
    config = str(folder / "haproxy.cfg")
    done = subprocess.run([script, "-db", "-f", config, "-sf", "123"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    args, *printed = done.stdout.splitlines()
    assert args == f"-db -f {config}{COPY_SUFFIX} -sf 123"
    assert "\n".join(printed) + "\n" == rewrite(RAY_CONFIG)
    assert f"bind {LOCAL_HOST}:8404" in "\n".join(printed)
    assert stat.S_IMODE(os.stat(config + COPY_SUFFIX).st_mode) == 0o600
    assert (folder / "haproxy.cfg").read_text() == RAY_CONFIG  # Ray's own file as Ray wrote it


def test_a_config_it_cannot_make_private_stops_haproxy_with_the_reason(tmp_path):
    (tmp_path / "haproxy.cfg").write_text(RAY_CONFIG.replace("listen stats", "listen other"))
    script = install(str(tmp_path), fake_haproxy(tmp_path))["RAY_SERVE_HAPROXY_BINARY_PATH"]
    done = subprocess.run([script, "-db", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and done.stdout == ""
    assert "'listen stats'" in done.stderr and "cannot make it private" in done.stderr
