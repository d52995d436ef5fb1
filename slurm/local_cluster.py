"""A real single-node SLURM cluster on localhost: munged, MariaDB + slurmdbd (so `sacct`, the
executor plugin's default status path, works), slurmctld and slurmd, all with their state in one
directory. The cluster tests start and stop it; so can a user, to try `snakemake --profile slurm`:

    make slurm-up        # = python slurm/local_cluster.py up .slurm   (prints the SLURM_CONF to export)
    export SLURM_CONF=$PWD/.slurm/etc/slurm.conf
    snakemake --profile slurm        # every job an sbatch job; watch them in squeue / sacct
    make slurm-down      # = python slurm/local_cluster.py down .slurm

Needs Debian's slurm-wlm, slurmdbd, munge and mariadb-server (`make test` and `make slurm-up`
install them where apt-get is available and they run as root) and root, since the daemons run as
root here. Stopping also removes the configuration cache that a configless slurmd leaves in
/run/slurm/conf: left behind, it points every SLURM client (and so every Snakemake start, through
the executor plugin's `scontrol` probe) at a controller that no longer answers, ~10 s each.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

# where a configless slurmd caches the configuration for the clients on its node
CONF_CACHE = Path("/run/slurm/conf")

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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of this process counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # each daemon leads its own session (start_new_session)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it when it is our child


def remove_conf_cache() -> None:
    """Remove a configless slurmd's configuration cache (/run/slurm/conf, a link into its spool)."""
    if CONF_CACHE.is_symlink() or CONF_CACHE.is_file():
        CONF_CACHE.unlink()
    elif CONF_CACHE.is_dir():
        shutil.rmtree(CONF_CACHE, ignore_errors=True)


def free_ports(names) -> dict[str, int]:
    """One free TCP port on 127.0.0.1 per name (all held open while choosing, so they differ)."""
    socks = []
    try:
        for _ in names:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return {name: s.getsockname()[1] for name, s in zip(names, socks, strict=True)}
    finally:
        for s in socks:
            s.close()


def listening(ports) -> dict[int, set[str]]:
    """The local addresses a TCP socket listens on for each of ``ports`` (from /proc/net/tcp{,6})."""
    found: dict[int, set[str]] = {port: set() for port in ports}
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, port = local.split(":")
                if state != "0A" or int(port, 16) not in found:
                    continue
                raw = bytes.fromhex(addr)
                # the kernel writes each 32-bit word in host (little-endian) order
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found[int(port, 16)].add(socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, words))
    return found


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class LocalSlurm:
    def __init__(self, root: Path, cpus: int = 2, memory_mb: int = 20000, gpus: int = 4):
        self.root = Path(root).resolve()
        self.cpus, self.memory_mb, self.gpus = cpus, memory_mb, gpus
        self.conf = self.root / "etc" / "slurm.conf"
        self.pids = self.root / "run" / "daemons.pids"  # every daemon started, so `down` can stop them
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.ports: dict[str, int] = {}

    # -- configuration ---------------------------------------------------------------------
    def _write_configs(self) -> None:
        r, p = self.root, self.ports
        for d in ("etc", "state", "spool", "log", "munge", "mysql", "run", "dev"):
            (r / d).mkdir(parents=True, exist_ok=True)
        # GPUs as generic resources, backed by placeholder character devices (NVIDIA's major number; no
        # driver behind them, nothing opens them): SLURM schedules and accounts them, and sets
        # CUDA_VISIBLE_DEVICES in each job to the ones it was given
        try:
            for i in range(self.gpus):
                dev = r / "dev" / f"nvidia{i}"
                if not dev.is_char_device():
                    dev.unlink(missing_ok=True)
                    os.mknod(dev, 0o600 | stat.S_IFCHR, os.makedev(195, i))
        except OSError as exc:  # a container without CAP_MKNOD: a node without GPUs
            print(f"no placeholder GPU devices ({exc}): the node declares no GPUs", file=sys.stderr)
            self.gpus = 0
        gres = f"Name=gpu Type=fake File={r}/dev/nvidia[0-{self.gpus - 1}]" if self.gpus else ""
        (r / "etc" / "gres.conf").write_text(f"AutoDetect=off\n{gres}\n")
        node_gres = f" Gres=gpu:fake:{self.gpus}" if self.gpus else ""
        self.conf.write_text(f"""\
ClusterName=lara
GresTypes=gpu
SlurmctldHost=localhost
SlurmctldPort={p['slurmctld']}
SlurmdPort={p['slurmd']}
# bind to 127.0.0.1 (what localhost resolves to), never to every interface
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
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
AccountingStoragePort={p['slurmdbd']}
JobCompType=jobcomp/none
AccountingStoreFlags=job_comment
SlurmctldParameters=enable_configless
AccountingStorageTRES=gres/gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb}{node_gres} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=localhost Default=NO MaxTime=INFINITE State=UP
""")
        dbd = r / "etc" / "slurmdbd.conf"
        dbd.write_text(f"""\
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={p['slurmdbd']}
CommunicationParameters=NoInAddrAny
SlurmUser=root
LogFile={r}/log/slurmdbd.log
PidFile={r}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={p['mariadb']}
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
""")
        dbd.chmod(0o600)

    # -- start / stop ----------------------------------------------------------------------
    def _spawn(self, args: list[str], log: str) -> subprocess.Popen:
        with open(self.root / "log" / log, "ab") as fh:
            proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        with open(self.pids, "a") as fh:
            fh.write(f"{proc.pid}\n")
        return proc

    def running(self) -> bool:
        return self.pids.exists() and any(_alive(pid) for pid in self._pids())

    def _pids(self) -> list[int]:
        return [int(line) for line in self.pids.read_text().split()] if self.pids.exists() else []

    def start(self, reap_with: int | None = None) -> LocalSlurm:
        """Start the daemons on free ports of 127.0.0.1. With ``reap_with`` (a process id, e.g. the
        test process's), a reaper process stops every daemon as soon as that process is gone, so
        even a killed test run leaves nothing behind."""
        r = self.root
        if self.running():
            raise RuntimeError(f"a local SLURM cluster is already running from {r} (stop it first)")
        self.ports = free_ports(("slurmctld", "slurmd", "slurmdbd", "mariadb"))
        self._write_configs()
        self.pids.unlink(missing_ok=True)
        self.pids.parent.mkdir(parents=True, exist_ok=True)
        self.pids.touch()
        if reap_with is not None:
            with open(r / "log" / "reaper.out", "ab") as fh:
                subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "reap", str(r), "--owner",
                                  str(reap_with)], stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
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
        self._spawn([_which("mariadbd"), f"--datadir={r}/mysql", "--user=root", f"--port={self.ports['mariadb']}",
                     "--bind-address=127.0.0.1", f"--socket={r}/run/mysql.sock", f"--pid-file={r}/run/mysql.pid",
                     "--skip-grant-tables=0"], "mariadb.out")
        _wait(lambda: _port_open(self.ports["mariadb"]), "MariaDB")
        sql = ("CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';"
               "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;")
        subprocess.run(["mariadb", f"--socket={r}/run/mysql.sock", "-uroot", "-e", sql], check=True,
                       capture_output=True)
        # slurmdbd reads slurmdbd.conf next to $SLURM_CONF
        self._spawn([_which("slurmdbd"), "-D"], "slurmdbd.out")
        _wait(lambda: _port_open(self.ports["slurmdbd"]), "slurmdbd")
        subprocess.run(["sacctmgr", "-i", "add", "cluster", "lara"], env=self.env, capture_output=True)
        subprocess.run(["sacctmgr", "-i", "add", "account", "lara-test", "Cluster=lara"], env=self.env,
                       capture_output=True)
        subprocess.run(["sacctmgr", "-i", "add", "user", "root", "Account=lara-test", "DefaultAccount=lara-test"],
                       env=self.env, capture_output=True)
        self._spawn([_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        _wait(lambda: _port_open(self.ports["slurmctld"]), "slurmctld")
        # configless slurmd: it fetches slurm.conf from slurmctld and points its jobs' SLURM_CONF at
        # its cached copy, so `srun` inside a batch job finds the cluster
        self._spawn([_which("slurmd"), "-D", "-N", "localhost", "--conf-server",
                     f"localhost:{self.ports['slurmctld']}"], "slurmd.out")

        def node_idle():
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True).stdout
            return "idle" in out

        _wait(node_idle, "the node to become idle", timeout=90)
        return self

    def stop(self) -> None:
        """Stop every daemon this cluster started (newest first) and remove the slurmd's
        configuration cache, so no client keeps looking for this controller."""
        pids = self._pids()[::-1]
        for pid in pids:
            _signal_group(pid, signal.SIGTERM)
        deadline = time.time() + 20
        while time.time() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.2)
        for pid in pids:
            _signal_group(pid, signal.SIGKILL)
        self.pids.unlink(missing_ok=True)
        remove_conf_cache()

    def reap(self, owner: int, poll: float = 0.5) -> None:
        """Wait while ``owner`` lives and the cluster is up; when the owner dies first, stop the cluster."""
        while self.pids.exists():
            if not _alive(owner):
                print(f"owner {owner} is gone: stopping the local SLURM cluster in {self.root}", flush=True)
                self.stop()
                return
            time.sleep(poll)

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted((self.root / "log").glob("*")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start or stop a single-node SLURM cluster on localhost.")
    parser.add_argument("action", choices=("up", "down", "status", "reap"))
    parser.add_argument("root", nargs="?", default=".slurm", help="state directory (default: .slurm)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="CPUs of the node")
    parser.add_argument("--memory-mb", type=int, default=20000, help="memory of the node in MiB")
    parser.add_argument("--owner", type=int, help="reap: the process whose death stops the cluster")
    args = parser.parse_args(argv)
    cluster = LocalSlurm(Path(args.root), cpus=args.cpus, memory_mb=args.memory_mb)
    if args.action == "reap":
        cluster.reap(args.owner)
        return 0
    if args.action == "up":
        reason = available()
        if reason:
            print(f"cannot start a local SLURM cluster: {reason}", file=sys.stderr)
            return 1
        try:
            cluster.start()
        except Exception as exc:
            print(f"local SLURM cluster failed to start: {exc}\n{cluster.logs()}", file=sys.stderr)
            cluster.stop()
            return 1
        print(f"local SLURM cluster up ({args.cpus} CPUs, {args.memory_mb} MiB; state in {cluster.root}).\n"
              f"Point the SLURM clients at it:\n  export SLURM_CONF={cluster.conf}\n"
              f"then e.g. `snakemake --profile slurm`, `squeue`, `sacct`; stop it with `make slurm-down`.")
    elif args.action == "down":
        was_running = cluster.running()
        cluster.stop()
        what = "local SLURM cluster stopped" if was_running else "no local SLURM cluster was running"
        print(f"{what} (state in {cluster.root}); unset SLURM_CONF in shells that exported it")
    else:
        print("running" if cluster.running() else "not running")
        return 0 if cluster.running() else 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
