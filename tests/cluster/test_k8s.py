"""``builder k8s``: every manifest validated against the Kubernetes schemas (``kubernetes-validate``,
strict, for ``K8S_VERSION``; no cluster here), golden files, and the rendezvous, resources,
security and image choices per vendor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from helpers import assert_golden

from builder.cli import cli
from builder.cluster import k8s
from builder.config.errors import UserError

GOLDEN = Path(__file__).parent.parent / "golden" / "cluster"
CASES: list[tuple[str, dict[str, Any]]] = [
    ("cpu", {}),
    ("cpu", {"nodes": 3}),
    ("nvidia-cu130", {}),
    ("nvidia-cu130", {"nodes": 4, "gpus": 8, "namespace": "ml", "env": ["NCCL_DEBUG=INFO"]}),
    ("nvidia-cu118", {"nodes": 2, "launcher": "torchrun"}),
    ("amd-rocm5.7", {"nodes": 2, "gpus": 8}),
    ("intel-oneapi", {"gpus": 2}),
    ("intel-oneapi", {"nodes": 2, "gpu_resource_name": "gpu.intel.com/xe"}),
]


def validate(docs: list[dict]) -> None:
    for doc in docs:
        kubernetes_validate.validate(doc, k8s.K8S_VERSION, strict=True)


def pod(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]


@pytest.mark.parametrize(("target", "kw"), CASES)
def test_every_manifest_validates(cluster_project, target: str, kw) -> None:
    docs = k8s.manifests(cluster_project, target, ["/opt/examples/train.py", "--epochs", "5"], **kw)
    validate(docs)
    # And so does the YAML the command prints, read back.
    validate(list(yaml.safe_load_all(k8s.dump(docs))))


def test_an_invalid_manifest_is_refused_by_the_validator(cluster_project) -> None:
    """The validation bites: a wrong type in the Job is reported."""
    docs = k8s.manifests(cluster_project, "cpu")
    docs[0]["spec"]["completions"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(docs)


@pytest.mark.parametrize(("name", "target", "kw"), [
    ("k8s-cpu-1node", "cpu", {}),
    ("k8s-nvidia-2x8", "nvidia-cu130", {"nodes": 2, "gpus": 8}),
])
def test_golden_manifests(cluster_project, name: str, target: str, kw) -> None:
    """Exact YAML; regenerate with UPDATE_GOLDEN=1 and review the diff."""
    text = k8s.dump(k8s.manifests(cluster_project, target, **kw))
    assert_golden(GOLDEN / f"{name}.yaml", text)


def test_one_node_is_a_plain_job(cluster_project) -> None:
    docs = k8s.manifests(cluster_project, "nvidia-cu130")
    assert [d["kind"] for d in docs] == ["Job"]
    spec = docs[0]["spec"]
    assert "completionMode" not in spec and spec["backoffLimit"] == 0
    env = {e["name"]: e.get("value") for e in pod(docs)["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["NODE_RANK"] == "0" and env["WORLD_SIZE"] == "1"


def test_n_nodes_indexed_job_and_headless_service(cluster_project) -> None:
    docs = k8s.manifests(cluster_project, "nvidia-cu130", nodes=4, gpus=8)
    service, job = docs
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == job["spec"]["template"]["metadata"]["labels"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    spec = job["spec"]["template"]["spec"]
    assert spec["subdomain"] == service["metadata"]["name"] == "nvidia-cu130-train"
    container = spec["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["MASTER_ADDR"]["value"] == "nvidia-cu130-train-0.nvidia-cu130-train"
    assert env["WORLD_SIZE"]["value"] == "32"
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    args = container["args"]
    assert args[args.index("--machine_rank") + 1] == "$(NODE_RANK)"
    assert args[args.index("--main_process_ip") + 1] == "$(MASTER_ADDR)"
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 8}}


@pytest.mark.parametrize(("target", "override", "resource"), [
    ("nvidia-cu118", None, "nvidia.com/gpu"),
    ("amd-rocm5.7", None, "amd.com/gpu"),
    ("intel-oneapi", None, "gpu.intel.com/i915"),
    ("intel-oneapi", "gpu.intel.com/xe", "gpu.intel.com/xe"),
])
def test_vendor_resource_by_flag(cluster_project, target: str, override, resource: str) -> None:
    docs = k8s.manifests(cluster_project, target, gpu_resource_name=override)
    assert pod(docs)["containers"][0]["resources"]["limits"] == {resource: 1}


def test_vendor_resource_by_matrix(cluster_project) -> None:
    from builder.config.project import load_project

    path = cluster_project.matrix_path
    doc = yaml.safe_load(path.read_text())
    next(t for t in doc["targets"] if t["name"] == "intel-oneapi")["k8s_resource"] = "gpu.intel.com/xe"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    project = load_project(path, allow_unpinned=True)
    assert pod(k8s.manifests(project, "intel-oneapi"))["containers"][0]["resources"]["limits"] == \
        {"gpu.intel.com/xe": 1}
    # The flag still wins over the matrix.
    assert pod(k8s.manifests(project, "intel-oneapi", gpu_resource_name="gpu.intel.com/i915"))[
        "containers"][0]["resources"]["limits"] == {"gpu.intel.com/i915": 1}


def test_matrix_refuses_another_vendors_resource(cluster_project) -> None:
    from builder.config.project import load_project

    path = cluster_project.matrix_path
    doc = yaml.safe_load(path.read_text())
    doc["targets"][0]["k8s_resource"] = "nvidia.com/gpu"  # the cpu target
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(UserError, match="k8s_resource: nvidia.com/gpu is not a resource of backend cpu"):
        load_project(path, allow_unpinned=True)


def test_security_shm_grace_everywhere(cluster_project) -> None:
    for target, kw in CASES:
        spec = pod(k8s.manifests(cluster_project, target, **kw))
        assert spec["securityContext"]["runAsUser"] == 1001 and spec["securityContext"]["runAsNonRoot"] is True
        assert spec["terminationGracePeriodSeconds"] == k8s.GRACE_S
        shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
    cpu = pod(k8s.manifests(cluster_project, "cpu", grace=30))
    assert cpu["terminationGracePeriodSeconds"] == 30
    assert next(v for v in cpu["volumes"])["emptyDir"]["sizeLimit"] == "2Gi"
    assert "resources" not in cpu["containers"][0]
    assert {"name": "ACCELERATE_USE_CPU", "value": "true"} in cpu["containers"][0]["env"]


def test_image_by_digest_when_published(cluster_project) -> None:
    assert pod(k8s.manifests(cluster_project, "cpu"))["containers"][0]["image"] == "localhost:5000/ml-runtime:cpu"
    digest = "sha256:" + "cd" * 32
    published = cluster_project.root / "dist" / "published.json"
    published.parent.mkdir()
    published.write_text(json.dumps({"nvidia-cu130": {"reference": f"localhost:5000/ml-runtime@{digest}",
                                                      "platforms": {"linux/amd64": "sha256:1", "linux/arm64": "x"}}}))
    docs = k8s.manifests(cluster_project, "nvidia-cu130", nodes=2)
    validate(docs)
    assert pod(docs)["containers"][0]["image"] == f"localhost:5000/ml-runtime@{digest}"


def test_user_words_keep_a_literal_dollar_paren(cluster_project) -> None:
    args = pod(k8s.manifests(cluster_project, "cpu", ["train.py", "--tag", "$(HOME)"]))["containers"][0]["args"]
    assert args[-3:] == ["train.py", "--tag", "$$(HOME)"]  # Kubernetes turns $$( into a literal $(


@pytest.mark.parametrize(("kw", "message"), [
    ({"gpus": 2}, "--gpus 2: target cpu is a cpu image"),
    ({"gpu_resource_name": "amd.com/gpu"}, "--gpu-resource amd.com/gpu: target cpu is a cpu image"),
    ({"name": "Bad_Name"}, "--name 'Bad_Name': use lowercase letters"),
    ({"nodes": 0}, "--nodes 0: give 1 to 1000"),
    ({"namespace": "No"}, "--namespace 'No': not a namespace name"),
])
def test_refusals(cluster_project, kw, message: str) -> None:
    with pytest.raises(UserError) as err:
        k8s.manifests(cluster_project, "cpu", **kw)
    assert str(err.value).startswith(message)


def test_amd_target_refuses_an_nvidia_resource(cluster_project) -> None:
    with pytest.raises(UserError, match="--gpu-resource nvidia.com/gpu: not a resource of vendor amd; use amd.com/gpu"):
        k8s.manifests(cluster_project, "amd-rocm5.7", gpu_resource_name="nvidia.com/gpu")


def test_cli_prints_valid_yaml(cluster_project) -> None:
    result = CliRunner().invoke(cli, ["k8s", "--matrix", str(cluster_project.matrix_path), "--allow-unpinned",
                                      "-t", "amd-rocm5.7", "--nodes", "2", "--gpus", "4"])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    validate(docs)
    assert [d["kind"] for d in docs] == ["Service", "Job"]
    assert pod(docs)["containers"][0]["args"][-1] == "/opt/examples/train.py"


@pytest.mark.parametrize("target", ["nvidia-cu130", "amd-rocm5.7", "intel-oneapi"])
def test_a_pod_asks_the_device_plugin_whatever_the_engine(cluster_project, monkeypatch: pytest.MonkeyPatch,
                                                          target: str) -> None:
    """On Kubernetes the kubelet's runtime and the vendor's device plugin hand a pod its GPUs, by the resource in
    its limits: no engine's flags (``--gpus``, a CDI name, ``--userns``) and the same manifests whichever engine
    builder uses here."""
    texts = set()
    for engine in ("docker", "podman"):
        monkeypatch.setenv("BUILDER_ENGINE", engine)
        texts.add(k8s.dump(k8s.manifests(cluster_project, target, k8s.DEFAULT_COMMAND, nodes=2, gpus=4)))
    (text,) = texts
    resource = k8s.DEFAULT_RESOURCES[cluster_project.target(target).vendor]
    assert pod(list(yaml.safe_load_all(text)))["containers"][0]["resources"]["limits"][resource] == 4
    for word in ("docker", "podman", "--gpus", "=all", "keep-id", "/dev/"):
        assert word not in text.replace("/dev/shm", ""), word
