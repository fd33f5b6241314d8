"""`deployments.private_folder`: every file of a launch in its private folder, and Ray's token
authentication on with a token of the launch's own that no environment holds. (A launched server
refusing a Ray client without the token: `test_launched_front.py`.)"""

from __future__ import annotations

import os
import stat

from deployments.private_folder import haproxy_files, private_environment, ray_token


def test_haproxys_files_are_in_the_private_folder(tmp_path):
    files = haproxy_files(str(tmp_path))
    assert {"RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "RAY_SERVE_HAPROXY_SOCKET_PATH", "RAY_SERVE_HAPROXY_SERVER_STATE_BASE"} <= set(files)
    assert all(path.startswith(str(tmp_path)) for path in files.values())


def test_each_launch_has_a_token_of_its_own_only_its_user_reads(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    env_a, env_b = ray_token(str(first)), ray_token(str(second))
    assert env_a["RAY_AUTH_MODE"] == "token"
    token_a, token_b = (open(env["RAY_AUTH_TOKEN_PATH"]).read() for env in (env_a, env_b))
    assert len(token_a) == 64 and int(token_a, 16) and token_a != token_b
    assert stat.S_IMODE(os.stat(env_a["RAY_AUTH_TOKEN_PATH"]).st_mode) == 0o600


def test_the_environment_names_the_token_and_holds_it_nowhere(tmp_path):
    environ = {"PATH": "/bin", "RAY_AUTH_TOKEN": "the operator's", "RAY_AUTH_MODE": "disabled", "RAY_SERVE_HAPROXY_BINARY_PATH": "/usr/sbin/haproxy"}
    env = private_environment(str(tmp_path), environ)
    token = open(env["RAY_AUTH_TOKEN_PATH"]).read()
    assert env["RAY_AUTH_MODE"] == "token" and "RAY_AUTH_TOKEN" not in env
    assert token not in "".join(env.values())
    assert env["RAY_SERVE_HAPROXY_BINARY_PATH"] == str(tmp_path / "haproxy")
    assert "/usr/sbin/haproxy" in (tmp_path / "haproxy").read_text()  # the operator's binary, behind the rewrite
    assert env["PATH"] == "/bin"
