"""runtime/ is a standalone, pure-Python distribution that also works when simply copied."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def test_pyproject_metadata():
    project = tomllib.loads((RUNTIME / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert (project["name"], project["version"]) == ("ml-runtime", "0.1.0")
    # torch deliberately undeclared; pydantic validates the two files (the images' common layer has it)
    assert project["dependencies"] == ["pyyaml", "packaging", "pydantic>=2.7,<3"]
    assert project["scripts"] == {"runtime-check": "ml_runtime.cli:main", "runtime-checker": "ml_runtime.cli:checker_main"}


def test_package_is_pure_python_with_its_default_spec():
    package = RUNTIME / "ml_runtime"
    files = sorted(str(p.relative_to(package)) for p in package.rglob("*") if "__pycache__" not in p.parts)
    assert "default-spec.yaml" in files and "cli.py" in files and "__main__.py" in files
    assert all(name.endswith((".py", ".yaml", ".json")) or (package / name).is_dir() for name in files)
    # every folder is a package the wheel ships (runtime/pyproject.toml lists them)
    listed = tomllib.loads((RUNTIME / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    folders = sorted(["ml_runtime"] + [f"ml_runtime.{n}" for n in files if (package / n).is_dir()])
    assert sorted(listed["packages"]) == folders
    assert all((package / n / "__init__.py").is_file() for n in files if (package / n).is_dir())


def test_copied_package_works_without_installation(tmp_path):
    site = tmp_path / "site-packages"
    shutil.copytree(RUNTIME / "ml_runtime", site / "ml_runtime", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "RUNTIME_WORKSPACE": str(tmp_path / "none")}
    # What an image's hand-written console script does:
    script = "import sys\nfrom ml_runtime.cli import main\nsys.exit(main())\n"
    result = subprocess.run(
        [sys.executable, "-c", script, "check", "--mode", "off"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    code = "import ml_runtime.contract.spec as s; print(s.DEFAULT_SPEC_PATH)"
    shown = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert shown.stdout.strip() == str((site / "ml_runtime" / "default-spec.yaml").resolve())
    result = subprocess.run(
        [sys.executable, "-m", "ml_runtime", "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.stdout.strip() == "runtime-check 0.1.0"


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="building needs setuptools")
def test_wheel_build_contains_the_spec_and_the_console_script(tmp_path):
    source = tmp_path / "runtime"  # build from a copy: an in-tree build leaves build/ and egg-info behind
    shutil.copytree(RUNTIME, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = tmp_path.glob("ml_runtime-0.1.0-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ml_runtime/default-spec.yaml" in names and "ml_runtime/cli.py" in names
    assert "ml_runtime/driver-floors.json" in names  # the host_driver check's table
    assert "ml_runtime/devices/facts.py" in names and "ml_runtime/policy/__init__.py" in names
    entry_points = zipfile.ZipFile(wheel).read("ml_runtime-0.1.0.dist-info/entry_points.txt").decode()
    assert "runtime-check = ml_runtime.cli:main" in entry_points
    metadata = zipfile.ZipFile(wheel).read("ml_runtime-0.1.0.dist-info/METADATA").decode()
    requires = sorted(
        line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    )
    assert [r.split("<")[0].split(">")[0] for r in requires] == ["packaging", "pydantic", "pyyaml"]
    # Installing the wheel needs no build backend (the image has no setuptools).
    target = tmp_path / "target"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    assert (target / "ml_runtime" / "default-spec.yaml").is_file()
    assert (target / "bin" / "runtime-check").is_file()
