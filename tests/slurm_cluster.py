"""A real single-node SLURM cluster on localhost for the cluster tests: munged, MariaDB +
slurmdbd (so the executor plugin's default `sacct` status path is exercised), slurmctld and
slurmd, all with their state in one temporary directory, started and stopped by the tests.

Needs Debian's slurm-wlm, slurmdbd, munge and mariadb-server (`make test` installs them where
apt-get is available and it runs as root) and root, since the daemons run as root here.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd", "sacctmgr", "sbatch")


def available() -> str | None:
    """None when a cluster can be started here, else the reason why not."""
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root"
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]
    return f"missing SLURM/munge/MariaDB programs: {', '.join(missing)}" if missing else None


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin") / name)


def _wait(check, what: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise RuntimeError(f"timed out waiting for {what}")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class LocalSlurm:
    def __init__(self, root: Path, cpus: int = 2, memory_mb: int = 20000):
        self.root = Path(root)
        self.cpus, self.memory_mb = cpus, memory_mb
        self.procs: list[subprocess.Popen] = []
        self.conf = self.root / "etc" / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    # -- configuration ---------------------------------------------------------------------
    def _write_configs(self) -> None:
        r = self.root
        for d in ("etc", "state", "spool", "log", "munge", "mysql", "run"):
            (r / d).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(f"""\
ClusterName=lara
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobCompType=jobcomp/none
SlurmctldParameters=enable_configless
NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""")
        dbd = r / "etc" / "slurmdbd.conf"
        dbd.write_text(f"""\
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
LogFile={r}/log/slurmdbd.log
PidFile={r}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3307
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
""")
        dbd.chmod(0o600)

    # -- start / stop ----------------------------------------------------------------------
    def _spawn(self, args: list[str], log: str) -> subprocess.Popen:
        fh = open(self.root / "log" / log, "ab")
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self) -> LocalSlurm:
        r = self.root
        self._write_configs()
        # munged on its default socket (/run/munge), which every SLURM client and daemon uses
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn([_which("munged"), "--foreground", "--force", f"--key-file={key}",
                     f"--pid-file={r}/run/munged.pid",
                     f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/seed"], "munged.out")
        _wait(lambda: Path("/run/munge/munge.socket.2").exists(), "munged")
        # MariaDB for slurmdbd, on its own port and data directory
        subprocess.run([_which("mariadb-install-db"), f"--datadir={r}/mysql", "--user=root",
                        "--auth-root-authentication-method=normal"], check=True, capture_output=True)
        self._spawn([_which("mariadbd"), f"--datadir={r}/mysql", "--user=root", "--port=3307",
                     "--bind-address=127.0.0.1", f"--socket={r}/run/mysql.sock", f"--pid-file={r}/run/mysql.pid",
                     "--skip-grant-tables=0"], "mariadb.out")
        _wait(lambda: _port_open(3307), "MariaDB")
        sql = ("CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';"
               "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;")
        subprocess.run(["mariadb", f"--socket={r}/run/mysql.sock", "-uroot", "-e", sql], check=True,
                       capture_output=True)
        # slurmdbd reads slurmdbd.conf next to $SLURM_CONF
        self._spawn([_which("slurmdbd"), "-D"], "slurmdbd.out")
        _wait(lambda: _port_open(6819), "slurmdbd")
        subprocess.run(["sacctmgr", "-i", "add", "cluster", "lara"], env=self.env, capture_output=True)
        subprocess.run(["sacctmgr", "-i", "add", "account", "lara-test", "Cluster=lara"], env=self.env,
                       capture_output=True)
        subprocess.run(["sacctmgr", "-i", "add", "user", "root", "Account=lara-test", "DefaultAccount=lara-test"],
                       env=self.env, capture_output=True)
        self._spawn([_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        _wait(lambda: _port_open(6817), "slurmctld")
        # configless slurmd: it fetches slurm.conf from slurmctld and points its jobs' SLURM_CONF at
        # its cached copy, so `srun` inside a batch job finds the cluster
        self._spawn([_which("slurmd"), "-D", "-N", "localhost", "--conf-server", "localhost:6817"], "slurmd.out")

        def node_idle():
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True).stdout
            return "idle" in out

        _wait(node_idle, "the node to become idle", timeout=90)
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted((self.root / "log").glob("*")))
