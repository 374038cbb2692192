"""No traceback, ever: the engine's and registries' faults as one line and the exit code of their class.

The engine is a fake one on loopback (answers the ping, then drops every other request: an
engine that went away mid-run), or a closed port; the registry a loopback server whose token
endpoint refuses (an expired login) or fails.
"""

from __future__ import annotations

import json
import socketserver
import threading
import urllib.error
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import docker
import pytest
import requests.exceptions
from helpers import run_builder

from builder import cli
from builder.oci import faults, registry
from devtools.support import free_port


class _DroppingEngine(socketserver.StreamRequestHandler):
    """Answers /_ping and /version like an engine; closes the connection on anything else."""

    def handle(self) -> None:
        while line := self.rfile.readline():
            path = line.split()[1].decode() if len(line.split()) > 1 else ""
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            if path.endswith("/_ping"):
                body, kind = b"OK", "text/plain"
            elif path.endswith("/version"):
                body, kind = json.dumps({"ApiVersion": "1.45", "Version": "26.1.5"}).encode(), "application/json"
            else:
                return  # the engine went away
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                             % (kind.encode(), len(body), body))


@pytest.fixture
def dropping_engine() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _DroppingEngine)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"tcp://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_engine_at_a_closed_port_is_named_with_the_engine_exit_code(monkeypatch):
    address = f"tcp://127.0.0.1:{free_port()}"
    monkeypatch.setenv("DOCKER_HOST", address)
    client = docker.DockerClient(base_url=address, version="1.41", timeout=5)
    with pytest.raises(requests.exceptions.ConnectionError) as caught:
        client.api.inspect_image("x")
    fault = faults.describe(caught.value)
    assert fault.code == faults.EXIT_ENGINE and f"Docker engine at {address}" in fault.line
    assert "\n" not in fault.line


def test_push_names_the_engine_not_a_missing_image(project, dropping_engine):
    proc = run_builder("push", "-t", "cpu", "--platform", "linux/amd64", cwd=project,
                       env={"DOCKER_HOST": dropping_engine}, timeout=120)
    assert "Traceback" not in proc.stderr
    assert "no local image" not in proc.stderr
    assert f"cpu: Docker engine at {dropping_engine} failed (ConnectionError" in proc.stderr, proc.stderr
    assert proc.returncode == 1


@pytest.mark.parametrize(("exc", "code", "names"), [
    (requests.exceptions.ReadTimeout("read timed out"), faults.EXIT_ENGINE, "Docker engine at"),
    (requests.exceptions.ConnectionError("refused"), faults.EXIT_ENGINE, "Docker engine at"),
    (urllib.error.HTTPError("https://r.example/token", 401, "Unauthorized", None, None),  # type: ignore[arg-type]
     faults.EXIT_REGISTRY, "registry r.example answered HTTP 401"),
    (urllib.error.URLError("Connection refused"), faults.EXIT_REGISTRY, "registry unreachable"),
    (RuntimeError("bug"), faults.EXIT_FAULT, "internal error (RuntimeError: bug)"),
])
def test_main_maps_each_class_to_one_line_and_its_code(monkeypatch, capsys, exc, code, names):
    monkeypatch.delenv("BUILDER_TRACEBACK", raising=False)
    monkeypatch.setattr(cli.cli, "main", mock.Mock(side_effect=exc))
    assert cli._run() == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and names in err, err


def test_an_engine_fault_names_the_engine_the_command_connected(monkeypatch, capsys):
    """The engine describes itself: a command on podman ends with podman's name and check, not Docker's."""
    from builder.cli.options import Session
    from builder.oci.docker import DockerAPI
    from builder.oci.podman import PodmanEngine

    podman = PodmanEngine(DockerAPI(docker.DockerClient(base_url="unix:///nonexistent", version="1.41")),
                          "unix:///run/podman/podman.sock")

    def main(**kwargs: object) -> None:
        session = kwargs["obj"]
        assert isinstance(session, Session)
        session.engine = podman
        raise requests.exceptions.ReadTimeout("read timed out")

    monkeypatch.delenv("BUILDER_TRACEBACK", raising=False)
    monkeypatch.setattr(cli.cli, "main", main)
    assert cli._run() == faults.EXIT_ENGINE
    err = capsys.readouterr().err
    assert "podman at unix:///run/podman/podman.sock timed out" in err and "`podman info`" in err, err
    assert "Docker" not in err and "DOCKER_HOST" not in err


class _Registry(BaseHTTPRequestHandler):
    token_status = 401

    def do_GET(self) -> None:
        if self.path.startswith("/token"):
            self.send_response(self.token_status)
            self.end_headers()
            return
        assert isinstance(self.server, socketserver.TCPServer)
        port = self.server.server_address[1]
        self.send_response(401)
        self.send_header("WWW-Authenticate", f'Bearer realm="http://127.0.0.1:{port}/token",service="r"')
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(("status", "fix"), [(401, "log in again"), (500, "retry later")])
def test_a_token_endpoint_that_refuses_is_one_line_naming_the_registry(status, fix):
    handler = type("H", (_Registry,), {"token_status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(registry.RegistryFault) as caught:
            registry.manifest_digest(f"{host}/ml-runtime:cpu", {"username": "u", "password": "expired"})
    finally:
        server.shutdown()
        server.server_close()
    fault = faults.describe(caught.value)
    assert fault.code == faults.EXIT_REGISTRY
    assert f"registry {host}: its token endpoint" in fault.line and f"HTTP {status}" in fault.line and fix in fault.line


@pytest.mark.parametrize("status", [401, 500])
def test_a_refused_cache_source_is_its_cause_not_never_published(status):
    from builder.config.errors import TargetFailed
    from builder.images import lookup

    handler = type("H", (_Registry,), {"token_status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(TargetFailed, match=rf"cache source {host}/ml-runtime:cpu failed.*HTTP {status}"):
            lookup.registry_cache_source(f"{host}/ml-runtime:cpu")
    finally:
        server.shutdown()
        server.server_close()


def test_a_cache_source_never_published_builds_cold(tmp_path, monkeypatch):
    from builder.images import lookup
    from devtools.support import docker_config, docker_login, registry_login, start_registry, stop

    user, password, htpasswd = registry_login(tmp_path / "registry")
    host, proc = start_registry(tmp_path / "registry", htpasswd)
    config = docker_config(tmp_path / "docker-config")
    docker_login(config, host, user, password)  # a loopback registry the builder reads must take a login it holds
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    try:
        assert lookup.registry_cache_source(f"{host}/ml-runtime:cpu") == []
    finally:
        stop(proc)
