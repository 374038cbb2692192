"""The disk row: the builder's stores over CYCLES cycles of "the index gains a release of a shared
dependency, cpu gets one more package that needs it, build", then ``builder gc``."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import yaml

from bench import run, say, second_engine
from bench.project import Project, builder, builder_build, locked_wheels, stores, tools_wheels, wheelhouse
from devtools.support import edit_matrix, host_platform

CYCLES = 10


def _index_wheel(root: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A pure wheel *name*==*version* (needing *requires*) on the PEP 503 index at *root*, its page rewritten."""
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda text: base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    files[f"{info}/RECORD"] = "".join(f"{k},sha256={digest(v)},{len(v)}\n" for k, v in files.items()) + \
        f"{info}/RECORD,,\n"
    page = root / name.replace("_", "-")
    page.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(page / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    links = "".join(f'<a href="{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n'
                    for w in sorted(page.glob("*.whl")))
    (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


def _du(paths: list[Path]) -> int:
    """Bytes on disk under *paths* (``du``: each hard-linked file once)."""
    existing = [str(p) for p in paths if p.exists()]
    if not existing:
        return 0
    proc = subprocess.run(["du", "-s", "-B1", "-c", *existing], capture_output=True, text=True, check=False)
    return int(proc.stdout.strip().splitlines()[-1].split()[0])


def _where(data_root: Path) -> dict[str, int]:
    """Bytes under each folder of the engine's data root two levels down (containerd's content store and
    snapshotter, BuildKit's records, dockerd's own): where a cycle's growth lands."""
    folders = [d for top in sorted(data_root.iterdir()) if top.is_dir()
               for d in ([top] if top.name != "containerd" else sorted(p for p in top.rglob("*") if p.is_dir()
                                                                        and len(p.relative_to(top).parts) == 2))]
    return {str(d.relative_to(data_root)): _du([d]) for d in folders}


def extra_index_urls() -> list[str]:
    """The host's pip ``extra-index-url``, as ``pip config list`` shows it (files and PIP_* variables,
    later lines overriding earlier ones as in pip)."""
    proc = run([sys.executable, "-m", "pip", "config", "list"], cwd=Path.cwd())
    urls = ""
    for line in proc.stdout.splitlines():
        key, sep, raw = line.partition("=")
        section, _, name = key.rpartition(".")
        if sep and name == "extra-index-url" and section in ("global", "install", "download", ":env:"):
            urls = raw.strip().strip("'\"")
    return urls.split()


def disk(project: Project, tmp: Path, cycles: int = CYCLES) -> dict[str, Any]:
    """The stores' disk over CYCLES cycles of "index gains a release -> one more cpu package -> build"
    (``builder build -t cpu``, smoke on, as users run it: each build gets its content tag), against after the first build, then after
    ``builder gc``. An empty second dockerd (its data root is the engine's stores, alone), a wheelhouse of
    this run's own (hard links to the user's for cpu's locked wheels), an index on loopback behind the
    host's pip sources; the relock after each change is the builder's own. ``builder gc`` runs as users
    run it (``--keep-days`` 7: nothing here is that old, so only what no clone can want goes)."""
    root = project.root
    house, index = tmp / "disk-house", tmp / "disk-index" / "simple"
    house.mkdir()
    cpu = project.target("cpu").on(host_platform())
    shared = wheelhouse(root)
    for pin in locked_wheels(project, cpu) + tools_wheels(project, cpu.platform):
        if (shared / pin.filename).exists():
            os.link(shared / pin.filename, house / pin.filename)
    _index_wheel(index, "mlbench_dep", "1.0")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(index.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    # A pip config file of its own, read last: PIP_EXTRA_INDEX_URL would lose to the host's files.
    (tmp / "disk-pip.conf").write_text(f"[global]\nextra-index-url = {' '.join([*extra_index_urls(), url])}\n")
    env = {"BUILDER_WHEELHOUSE": str(house), "XDG_CACHE_HOME": str(tmp / "disk-state"),
           "PIP_CONFIG_FILE": str(tmp / "disk-pip.conf")}
    out: dict[str, Any] = {"cycles": cycles, "samples_bytes": [], "stores": []}
    try:
        with second_engine(tmp / "disk-engine") as host:
            env["DOCKER_HOST"] = host
            data_root = next((tmp / "disk-engine").glob("dockerd-*")) / "root"

            def measure(label: str) -> int:
                held = {name: store["held"] for name, store in stores(root, env).items()}
                total = _du([house, data_root, tmp / "disk-state"])
                where = _where(data_root)
                out["stores"].append({"after": label, "disk_bytes": total, **held, "data_root": where})
                say(f"disk after {label}: {total / 1e9:.3f} GB ({', '.join(f'{k} {v / 1e9:.3f} GB' for k, v in held.items())})")
                say("  data root: " + ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in where.items() if v > 1e6))
                return total

            packages: list[str] = []
            for cycle in range(cycles + 1):
                if cycle:
                    _index_wheel(index, "mlbench_dep", f"1.{cycle}")  # the index gains a release
                    _index_wheel(index, f"mlbench_pkg{cycle}", "1.0", ("mlbench_dep>=1.0",))
                    packages.append(f"mlbench_pkg{cycle}==1.0")
                    doc = yaml.safe_load((root / "matrix.yaml").read_text())
                    for t in doc["targets"]:
                        if t["name"] == "cpu":
                            t["packages"] = [*t.get("packages", []), packages[-1]]
                    edit_matrix(root, targets=doc["targets"])
                seconds, outcome = builder_build(root, "cpu", "--platform", cpu.platform, env=env, smoke=True)
                if outcome.get("error"):
                    raise SystemExit(f"bench: disk cycle {cycle}: {outcome['error']}")
                say(f"disk cycle {cycle}: {outcome['result']} in {seconds} s")
                out["samples_bytes"].append(measure("the first build" if cycle == 0 else f"cycle {cycle}"))
            first, last = out["samples_bytes"][0], out["samples_bytes"][-1]
            gc_run = builder(root, "gc", env=env)
            out["gc_output"] = gc_run.stdout.splitlines()
            after = measure("builder gc")
            noop = builder_build(root, "cpu", "--platform", cpu.platform, env=env, smoke=True)[1]
            out.update(first_bytes=first, cycles_bytes=last, gc_bytes=after, ratio=round(last / first, 3),
                       ratio_after_gc=round(after / first, 3), noop_after_gc=noop["result"])
    finally:
        server.shutdown()
    return out
