"""A real Slurm cluster on this host, for the tests: munged, slurmctld and two slurmd (``-N n1``,
``-N n2``), each node with its own ``Port=`` and ``NodeAddr=127.0.0.1`` in a minimal slurm.conf.

Everything lives in one folder (key, sockets, state, spool, logs); the daemons run in the
foreground as children of the test process and :meth:`SlurmCluster.stop` ends them (jobs
first). Clients find the cluster through ``SLURM_CONF`` (:attr:`SlurmCluster.env`).

Example:
    >>> cluster = SlurmCluster.start(tmp_path / "slurm")
    >>> subprocess.run(["sinfo"], env={**os.environ, **cluster.env})
    >>> cluster.stop()
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from devtools.support import free_port, stop

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "sinfo")
NODES = ("n1", "n2")
#: On every container a builder slurm job starts (the job ID).
SLURM_LABEL = "io.ml-image-builder.slurm.job"


def missing_tools() -> list[str]:
    return [tool for tool in DAEMONS if shutil.which(tool) is None]


def slurm_conf(folder: Path, host: str, ctld_port: int, node_ports: dict[str, int]) -> str:
    """A minimal slurm.conf on loopback: no cgroups, no accounting, two 1-CPU nodes in one partition."""
    nodes = "\n".join(
        f"NodeName={name} NodeAddr=127.0.0.1 Port={port} CPUs=1 RealMemory=1000 State=UNKNOWN"
        for name, port in node_ports.items()
    )
    return f"""\
ClusterName=buildertest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge/munge.socket
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/run/slurmctld.pid
SlurmdPidFile={folder}/run/slurmd.%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=30
{nodes}
PartitionName=debug Nodes={','.join(node_ports)} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    folder: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: int = 30) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted((self.folder / "log").glob("*")))

    def _spawn(self, *argv: str) -> None:
        out = open(self.folder / "log" / f"{Path(argv[0]).name}{len(self.procs)}.out", "w")  # noqa: SIM115
        self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                           env={**os.environ, **self.env}, start_new_session=True))
        out.close()

    @classmethod
    def start(cls, folder: Path, timeout: float = 60) -> SlurmCluster:
        """Key, config, munged, slurmctld, both slurmd; return once both nodes are idle."""
        cluster = cls(folder)
        for sub in ("munge", "state", "run", "log", *(f"spool/{n}" for n in NODES)):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        (folder / "munge").chmod(0o755)  # the socket's folder: clients need to reach it
        key = folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        ports = {n: free_port() for n in NODES}
        cluster.conf.write_text(slurm_conf(folder, socket.gethostname().split(".")[0], free_port(), ports))
        try:
            munge = folder / "munge"
            cluster._spawn("munged", "--foreground", "--force", f"--key-file={key}",
                           f"--socket={munge}/munge.socket", f"--pid-file={munge}/munged.pid",
                           f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed")
            cluster._wait_for(lambda: (munge / "munge.socket").exists(), "munged's socket", timeout)
            cluster._spawn("slurmctld", "-D", "-f", str(cluster.conf))
            cluster._wait_for(lambda: cluster.run("scontrol", "ping").stdout.count("UP") > 0, "slurmctld", timeout)
            for node in NODES:
                cluster._spawn("slurmd", "-D", "-N", node, "-f", str(cluster.conf))
            cluster._wait_for(cluster._idle, "both nodes idle", timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _idle(self) -> bool:
        states = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split("\n")
        return sorted(line.strip() for line in states if line.strip()) == [f"{n} idle" for n in NODES]

    def _wait_for(self, ready, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [cast(tuple[str, ...], p.args)[0] for p in self.procs if p.poll() is not None]  # _spawn's argv
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}\n{self.logs()}")
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout} s waiting for {what}\n{self.logs()}")

    def stop(self) -> None:
        """Cancel every job, wait for them to end, then stop the daemons (slurmd, slurmctld, munged)."""
        if any(p.poll() is None for p in self.procs[1:]):
            self.run("scancel", "--full", "--user", str(os.getuid()))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.run("squeue", "-h").stdout.strip():
                time.sleep(1)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                stop(proc, timeout=20)
        self.procs.clear()
