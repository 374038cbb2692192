"""``builder slurm``: the script's exact text (small golden files), the rendezvous and device
lines per vendor, the pyxis variant's arguments, quoting of user values, refusals; the script
itself runs under bash (syntax) here, and on real daemons in test_slurm_cluster.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import assert_golden

from builder.cli import cli
from builder.cluster import slurm
from builder.config.errors import UserError

GOLDEN = Path(__file__).parent.parent / "golden" / "cluster"


def script(project, target: str, command: list[str], **kw) -> str:
    return slurm.render_script(slurm.make_job(project, target, command, **kw), f"{target}.sbatch")


@pytest.mark.parametrize(("name", "target", "kw"), [
    ("cpu-2nodes", "cpu", {"nodes": 2}),
    ("nvidia-4x8", "nvidia-cu130", {"nodes": 4, "gpus_per_node": 8, "partition": "gpu", "time": "2:00:00"}),
    ("amd-2x4-torchrun", "amd-rocm5.7", {"nodes": 2, "gpus_per_node": 4, "launcher": "torchrun"}),
    ("nvidia-pyxis", "nvidia-cu130", {"nodes": 2, "gpus_per_node": 8, "runtime": "pyxis"}),
    ("nvidia-podman", "nvidia-cu130", {"nodes": 2, "gpus_per_node": 8, "runtime": "podman"}),
    ("amd-podman", "amd-rocm5.7", {"nodes": 2, "gpus_per_node": 4, "runtime": "podman"}),
])
def test_golden_script(cluster_project, name: str, target: str, kw) -> None:
    """Exact script per vendor; regenerate with UPDATE_GOLDEN=1 and review the diff."""
    text = script(cluster_project, target, ["/opt/examples/train.py", "--epochs", "20"], **kw)
    assert_golden(GOLDEN / f"{name}.sbatch", text)
    # bash parses it (the function, the heredoc-free quoting, the pyxis line).
    check = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True, check=False)
    assert check.returncode == 0, check.stderr


def test_rendezvous_and_ranks(cluster_project) -> None:
    text = script(cluster_project, "cpu", ["train.py"], nodes=3)
    assert 'first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    assert "NodeAddr=" in text  # the first node's address, not its name
    assert "WORLD_SIZE=$((SLURM_JOB_NUM_NODES * 1))" in text
    assert "export NODE_RANK=$SLURM_NODEID RANK=$SLURM_PROCID" in text
    assert '--num_machines 3 --num_processes 3 --machine_rank "$NODE_RANK" --main_process_ip "$MASTER_ADDR" ' \
           '--main_process_port "$MASTER_PORT"' in text
    assert "--env ACCELERATE_USE_CPU" in text and "export ACCELERATE_USE_CPU=true" in text
    assert "srun --label --kill-on-bad-exit=1 bash -c run_node && status=0 || status=$?" in text


def test_master_port_search_finds_a_free_port(cluster_project, tmp_path: Path) -> None:
    """The port lines of the script, run by bash with a listener on the first candidate: the next one wins."""
    import socket

    text = script(cluster_project, "cpu", ["train.py"], nodes=2)
    lines = text[text.index("MASTER_PORT=\n"):text.index("WORLD_SIZE=")]
    job_id = 7
    first = 20000 + job_id * 64 % 40000
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", first))
        busy.listen()
        out = subprocess.run(["bash", "-c", lines + 'echo "$MASTER_PORT"'], text=True, capture_output=True,
                             env={**os.environ, "SLURM_JOB_ID": str(job_id), "MASTER_ADDR": "127.0.0.1"},
                             check=False)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == first + 1


def test_nvidia_devices_cdi_or_gpus_all(cluster_project) -> None:
    text = script(cluster_project, "nvidia-cu130", ["train.py"], nodes=2, gpus_per_node=8)
    assert "if cdi_ready nvidia.com/gpu; then\n    devices=(--device nvidia.com/gpu=all)" in text
    assert "devices=(--gpus all)" in text
    assert "#SBATCH --gpus-per-node=8" in text and "--num_processes 16" in text
    assert "--env ACCELERATE_USE_CPU" not in text


def test_cdi_ready_reads_spec_trees(cluster_project, tmp_path: Path) -> None:
    """The script's CDI check against spec files as nvidia-ctk and AMD's toolkit write them (each
    declares the device ``all``, which the script asks for); a spec without ``all`` keeps the classic flags."""
    text = script(cluster_project, "nvidia-cu130", ["train.py"], nodes=2)
    function = text[text.index("cdi_ready() {"):text.index("\n}\n", text.index("cdi_ready() {")) + 3]
    etc = tmp_path / "etc" / "cdi"
    etc.mkdir(parents=True)
    (etc / "nvidia.yaml").write_text("---\ncdiVersion: 0.5.0\ndevices:\n- containerEdits:\n    deviceNodes:\n"
                                     "    - path: /dev/nvidia0\n  name: \"0\"\n- containerEdits: {}\n  name: all\n"
                                     "kind: nvidia.com/gpu\n")
    (etc / "amd.json").write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "amd.com/gpu",
                                              "devices": [{"name": "all", "containerEdits": {}}]}))
    (etc / "intel.yaml").write_text("cdiVersion: 0.6.0\nkind: intel.com/gpu\ndevices:\n- name: card0\n")
    fake_docker = tmp_path / "bin" / "docker"
    fake_docker.parent.mkdir()

    def ready(kind: str, engine_dirs: str) -> bool:
        fake_docker.write_text(f"#!/bin/sh\necho '{engine_dirs}'\n")
        fake_docker.chmod(0o755)
        body = function.replace("/etc/cdi/*", f"{etc}/*")
        run = subprocess.run(["bash", "-c", f"{body}\ncdi_ready {kind}"], check=False,
                             env={**os.environ, "PATH": f"{fake_docker.parent}:{os.environ['PATH']}"})
        return run.returncode == 0

    assert ready("nvidia.com/gpu", "/etc/cdi/var/run/cdi")
    assert ready("amd.com/gpu", "/etc/cdi/var/run/cdi")
    assert not ready("intel.com/gpu", "/etc/cdi/var/run/cdi")  # no "all": intel.com/gpu=all would be refused
    assert not ready("nvidia.com/gpu", "")  # an engine without CDI (Docker 20.10 prints nothing)
    (etc / "nvidia.yaml").unlink()
    assert not ready("nvidia.com/gpu", "/etc/cdi/var/run/cdi")


def test_amd_groups_are_the_nodes_gids(cluster_project) -> None:
    text = script(cluster_project, "amd-rocm5.7", ["train.py"], nodes=2, gpus_per_node=4)
    assert "devices=(--device amd.com/gpu=all)" in text
    assert "devices=(--device /dev/kfd --device /dev/dri)" in text
    assert "$(getent group video | cut -d: -f3) $(getent group render | cut -d: -f3)" in text
    assert "for node in /dev/kfd /dev/dri/renderD*; do" in text
    assert "--ipc host --shm-size 8g" in text


def test_pyxis_arguments(cluster_project) -> None:
    """The NVIDIA-cluster variant, checked by its arguments only (no pyxis here)."""
    text = script(cluster_project, "nvidia-cu130", ["train.py", "--lr", "0.1"], nodes=2, gpus_per_node=8,
                  runtime="pyxis")
    line = text[text.index("\nsrun ") + 1:text.index(" && status=0")].replace("\\\n", " ")
    argv = shlex.split(line.replace('"$SLURM_SUBMIT_DIR', '"/submit'))
    assert argv[:4] == ["srun", "--label", "--kill-on-bad-exit=1",
                        "--container-image=localhost:5000#ml-runtime:nvidia-cu130"]
    assert "--container-entrypoint" in argv and "--no-container-mount-home" in argv
    assert "--container-mounts=/submit:/workspace" in argv and "--container-workdir=/workspace" in argv
    assert argv[-3:-1] == ["sh", "-c"]
    inner = argv[-1]
    assert inner.startswith('export NODE_RANK="$SLURM_NODEID" RANK="$SLURM_PROCID"; t=0; ')
    launch = inner[inner.index("accelerate launch "):inner.index(" & p=$!")]
    assert shlex.split(launch)[-3:] == ["train.py", "--lr", "0.1"]
    assert '> "/workspace/.builder-slurm-$SLURM_JOB_ID/$SLURM_NODEID"' in inner
    assert subprocess.run(["sh", "-n", "-c", inner], check=False).returncode == 0
    assert "docker" not in text


def test_user_values_are_quoted(cluster_project) -> None:
    nasty = "x'; rm -rf / #"
    text = script(cluster_project, "cpu", ["train.py", nasty, "$(id)"], nodes=2, env=[f"NOTE={nasty}", "A=$HOME"])
    assert f"train.py {shlex.quote(nasty)} '$(id)'" in text
    assert f"export NOTE={shlex.quote(nasty)}" in text and "export A='$HOME'" in text


@pytest.mark.parametrize(("kw", "message"), [
    ({"nodes": 0}, "--nodes 0: give 1 to 4096"),
    ({"job_name": "a b"}, "--job-name 'a b': not allowed in an #SBATCH line; use something like cpu-train"),
    ({"partition": "gpu\n#SBATCH --x"}, "--partition 'gpu\\n#SBATCH --x': not allowed in an #SBATCH line"),
    ({"time": "2 hours"}, "--time '2 hours': not allowed in an #SBATCH line; use something like 2:00:00"),
    ({"gpus_per_node": 2}, "--gpus-per-node 2: target cpu is a cpu image"),
    ({"env": ["1X=2"]}, "--env '1X=2': expected KEY=VALUE"),
    ({"launcher": "mpirun"}, "--launcher 'mpirun': use one of accelerate, torchrun"),
])
def test_refusals(cluster_project, kw, message: str) -> None:
    with pytest.raises(UserError) as err:
        slurm.make_job(cluster_project, "cpu", ["train.py"], **kw)
    assert str(err.value).startswith(message)


def test_pyxis_refuses_amd(cluster_project) -> None:
    with pytest.raises(UserError, match="enroot hands out NVIDIA GPUs only"):
        slurm.make_job(cluster_project, "amd-rocm5.7", ["train.py"], runtime="pyxis")


def test_published_digest_is_used(cluster_project) -> None:
    digest = "sha256:" + "ab" * 32
    published = cluster_project.root / "dist" / "published.json"
    published.parent.mkdir()
    published.write_text(json.dumps({"cpu": {"reference": f"localhost:5000/ml-runtime@{digest}"}}))
    job = slurm.make_job(cluster_project, "cpu", ["train.py"], nodes=2)
    assert job.image == f"localhost:5000/ml-runtime@{digest}"
    assert f"export IMAGE=localhost:5000/ml-runtime@{digest}" in slurm.render_script(job)


def test_cli_writes_and_prints_the_sbatch_line(cluster_project, tmp_path: Path) -> None:
    out = tmp_path / "jobs"
    result = CliRunner().invoke(cli, ["slurm", "--matrix", str(cluster_project.matrix_path), "--allow-unpinned",
                                      "-t", "cpu", "--nodes", "2", "--script", str(out), "--",
                                      "/opt/examples/train.py", "--epochs", "3"])
    assert result.exit_code == 0, result.output
    path = out / "cpu-train.sbatch"
    assert result.stdout.strip() == f"sbatch {path}"
    assert os.access(path, os.X_OK) and re.search(r"--epochs 3 &\n", path.read_text())


def test_cli_bad_input_is_one_line_exit_2(cluster_project, tmp_path: Path) -> None:
    from helpers import run_builder

    result = run_builder("slurm", "--matrix", str(cluster_project.matrix_path), "--allow-unpinned", "-t", "cpu",
                         "--time", "soon", "--", "train.py", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == "error: --time 'soon': not allowed in an #SBATCH line; use something like 2:00:00 " \
                            "or 1-12:00:00\n"


_FAKE_SRUN = r"""#!/bin/bash
# Three tasks, as srun --kill-on-bad-exit: the first to fail stops the others (SIGTERM); then
# exits with a stopped rank's 143, as real srun may.
while [[ $1 == --* ]]; do shift; done
pids=()
for n in 0 1 2; do SLURM_NODEID=$n SLURM_PROCID=$n "$@" & pids+=($!); done
while true; do
  wait -n; rc=$?
  if [ "$rc" != 0 ]; then break; fi
done
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
wait
exit 143
"""
_FAKE_DOCKER = r"""#!/bin/bash
# docker run: node 1's training fails (exit 1) after 0.3 s; the others train until stopped.
case $1 in
  run) while [ "$1" != --name ]; do shift; done
       echo $$ > "$FAKE/$2.pid"
       if [ "$SLURM_NODEID" = 1 ]; then sleep 0.3; exit 1; fi
       trap 'kill $sleeper; exit 143' TERM; sleep 30 & sleeper=$!; wait;;
  stop) kill -TERM "$(cat "$FAKE/${@: -1}.pid")";;
esac
exit 0
"""


def test_a_failed_job_exits_with_the_first_failing_rank_s_status(cluster_project, tmp_path: Path) -> None:
    """srun exits 143 (a rank it stopped); the job must exit 1, the failing training's status."""
    text = script(cluster_project, "cpu", ["train.py"], nodes=3)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"srun": _FAKE_SRUN, "docker": _FAKE_DOCKER,
                       "scontrol": "#!/bin/sh\n[ \"$2\" = hostnames ] && echo node0 || echo NodeAddr=127.0.0.1\n"}.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "job.sbatch").write_text(text)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE": str(tmp_path), "SLURM_JOB_ID": "9",
           "SLURM_JOB_NODELIST": "node[0-2]", "SLURM_JOB_NUM_NODES": "3", "SLURM_SUBMIT_DIR": str(tmp_path)}
    run = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 1, run.stdout + run.stderr
    assert not (tmp_path / ".builder-slurm-9").exists()


_FAKE_PODMAN = r"""#!/bin/bash
# podman run: records its arguments, one per line, and exits 0 (the training "succeeds").
case $1 in
  run) printf '%s\n' "$@" > "$FAKE/podman-run.args";;
esac
exit 0
"""


def run_job(text: str, tmp_path: Path, cdi: Path, uid: int = 0) -> subprocess.CompletedProcess[str]:
    """The script under bash with a one-node srun, scontrol and a recording ``podman`` (no engine here), its
    CDI folders at *cdi*, and ``id -u`` answering *uid* (a rootless user's job, or root's)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fakes = {"srun": '#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nSLURM_NODEID=0 SLURM_PROCID=0 exec "$@"\n',
             "scontrol": "#!/bin/sh\n[ \"$2\" = hostnames ] && echo node0 || echo NodeAddr=127.0.0.1\n",
             "podman": _FAKE_PODMAN, "hostname": "#!/bin/sh\necho node0\n",
             "id": f'#!/bin/sh\ncase "$1" in -u) echo {uid};; -g) echo {uid};; *) exec /usr/bin/id "$@";; esac\n'}
    for name, body in fakes.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "job.sbatch").write_text(text.replace("/etc/cdi/* /var/run/cdi/*", f"{cdi}/*"))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE": str(tmp_path), "SLURM_JOB_ID": "9",
           "SLURM_JOB_NODELIST": "node0", "SLURM_JOB_NUM_NODES": "1", "SLURM_SUBMIT_DIR": str(tmp_path)}
    return subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_podman_nodes_name_nvidia_gpus_by_cdi_or_stop_with_the_fix(cluster_project, tmp_path: Path) -> None:
    """``--runtime podman``: each node runs ``podman run`` (its stop and rm too), NVIDIA's GPUs by their CDI name
    where a spec declares ``all`` (podman reads the specs always: no ``docker info`` asked); a node without a spec
    stops the job with one line saying how to make it (podman has no ``--gpus``: a no-op before 5.0). A rootless
    job keeps the user's IDs (``--userns keep-id``)."""
    text = script(cluster_project, "nvidia-cu130", ["train.py"], nodes=1, gpus_per_node=8, runtime="podman")
    assert "docker" not in text and "--gpus all" not in text
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    stopped = run_job(text, tmp_path, cdi)
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert ("node0: podman gives nvidia GPUs by CDI name only, and no CDI spec for nvidia.com/gpu in /etc/cdi or "
            "/var/run/cdi declares the device all; make it (as root): nvidia-ctk cdi generate "
            "--output=/var/run/cdi/nvidia.yaml") in stopped.stderr.splitlines(), stopped.stderr
    assert not (tmp_path / "podman-run.args").exists()
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n"
                                     "  containerEdits: {}\n")
    ran = run_job(text, tmp_path, cdi, uid=1000)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    argv = (tmp_path / "podman-run.args").read_text().splitlines()
    pairs = [argv[i:i + 2] for i in range(len(argv))]
    assert ["--device", "nvidia.com/gpu=all"] in pairs and ["--network", "host"] in pairs
    assert ["--userns", "keep-id"] in pairs and ["--user", "1000:1000"] in pairs


def test_podman_amd_nodes_keep_the_user_s_groups_when_rootless(cluster_project, tmp_path: Path) -> None:
    """AMD's nodes on podman: rootless, the user's own groups (``--group-add keep-groups``: a host GID would name a
    subordinate one in podman's user namespace); as root, the host's GIDs as with docker."""
    text = script(cluster_project, "amd-rocm5.7", ["train.py"], nodes=1, gpus_per_node=4, runtime="podman")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    for uid, keep in ((1000, True), (0, False)):
        ran = run_job(text, tmp_path, cdi, uid=uid)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        argv = (tmp_path / "podman-run.args").read_text().splitlines()
        pairs = [argv[i:i + 2] for i in range(len(argv))]
        assert ["--device", "/dev/kfd"] in pairs and ["--device", "/dev/dri"] in pairs
        assert (["--group-add", "keep-groups"] in pairs) is keep
        assert ("--userns" in argv) is keep
