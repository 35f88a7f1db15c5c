"""A one-host SLURM for tests: Debian's munged, slurmctld and slurmd, started as root in a
folder of the test's on free ports, and ended after it; srun then runs real job steps here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from tests.helpers.runs import local_port

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "scancel", "sinfo")
INSTALL = "apt-get install slurmctld slurmd slurm-client munge (as root)"

CONF = """ClusterName=ddptuitest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={dir}/munge.sock
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def missing() -> str | None:
    """Why a real SLURM cannot run here, or None."""
    absent = [name for name in DAEMONS if shutil.which(name) is None]
    if absent:
        return f"no {', '.join(absent)}: {INSTALL}"
    if os.geteuid() != 0:
        return "slurmd runs job steps as root here, and this is not root"
    return None


class OneHostSlurm:
    """start() the daemons, `env` for srun and scancel, stop() them and every job step."""

    def __init__(self, folder: str):
        self.dir = folder
        self.env = dict(os.environ, SLURM_CONF=os.path.join(folder, "slurm.conf"))
        self.daemons: list[subprocess.Popen] = []

    def start(self) -> None:
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        key = os.path.join(self.dir, "munge.key")
        subprocess.run(["mungekey", "-c", "-k", key], check=True, capture_output=True)
        with open(self.env["SLURM_CONF"], "w") as f:
            f.write(CONF.format(dir=self.dir, ctld_port=local_port(), slurmd_port=local_port(),
                                cpus=os.cpu_count()))
        self._daemon(["munged", "-F", "-f", "-S", f"{self.dir}/munge.sock", f"--key-file={key}",
                      f"--log-file={self.dir}/munged.log", f"--pid-file={self.dir}/munged.pid",
                      f"--seed-file={self.dir}/munged.seed"], f"{self.dir}/munge.sock")
        self._daemon(["slurmctld", "-D", "-i"], None)
        self._daemon(["slurmd", "-D", "-N", "localhost"], None)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the node registered and is ready for steps
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True,
                                 text=True).stdout.split()
            if out and out[0] == "idle":
                return
            time.sleep(0.2)
        raise RuntimeError(f"SLURM did not come up: {self.log('slurmctld')[-2000:]}")

    def _daemon(self, argv: list[str], ready: str | None) -> None:
        log = open(os.path.join(self.dir, f"{argv[0]}.out"), "w")
        self.daemons.append(subprocess.Popen(argv, env=self.env, stdout=log, stderr=log))
        while ready and not os.path.exists(ready):
            time.sleep(0.05)

    def log(self, name: str) -> str:
        with open(os.path.join(self.dir, f"{name}.log"), errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        subprocess.run(["scancel", "--user", "root"], env=self.env, capture_output=True)
        for daemon in reversed(self.daemons):  # slurmd ends its steps' slurmstepd first
            daemon.terminate()
            try:
                daemon.wait(15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()

