"""Benchmark: the whole toy DAG end to end (goal <= 10 min on 2 cores) and `snakemake -n` on the
finished run (goal <= 3 s, also with the SLURM clients installed and no controller running), in a
fresh copy of the workflow. Snakemake is called as `.venv/bin/snakemake` would be: the venv's bin
is not put on PATH (the workflow finds its own `lara`).

    python benchmarks/workflow_timing.py [--keep DIR | --finished DIR] [--cores N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keep", default=None, help="run in this directory and keep it")
    p.add_argument("--finished", default=None, help="time only `snakemake -n` on this finished run")
    p.add_argument("--cores", default="2")
    args = p.parse_args()
    bindir = str(Path(sys.executable).parent)
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if d != bindir)
    env = dict(os.environ, PATH=path, HF_HUB_OFFLINE="1")
    snakemake = [str(Path(bindir) / "snakemake"), "--cores", args.cores]
    print(f"{os.cpu_count()} CPUs; snakemake {snakemake[0]} (its bin not on PATH)")
    if args.finished:
        work = Path(args.finished)
    else:
        work = Path(args.keep or tempfile.mkdtemp(prefix="lara-bench-"))
        work.mkdir(parents=True, exist_ok=True)
        for name in ("Snakefile", "rules", "config", "envs", "slurm", "report"):
            src = REPO / name
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, work / name)
        t0 = time.perf_counter()
        subprocess.run(snakemake + ["-q"], cwd=work, env=env, check=True)
        full = time.perf_counter() - t0
        print(f"toy DAG end to end: {full:.1f} s ({full / 60:.2f} min; goal <= 10 min) in {work}")
    print(slurm_state(env))
    dry = []
    for _ in range(3):
        t0 = time.perf_counter()
        out = subprocess.run(snakemake + ["-n"], cwd=work, env=env, check=True, capture_output=True, text=True)
        dry.append(time.perf_counter() - t0)
        assert "Nothing to be done" in out.stdout + out.stderr
    print(f"snakemake -n on the finished run: {min(dry):.2f} s best of 3 ({', '.join(f'{d:.2f}' for d in dry)}; "
          "goal <= 3 s)")
    if not (args.keep or args.finished):
        shutil.rmtree(work)


def slurm_state(env: dict) -> str:
    """Whether the SLURM clients are installed and a controller answers (the executor plugin probes
    `scontrol show config` whenever Snakemake starts)."""
    if shutil.which("sinfo", path=env["PATH"]) is None:
        return "SLURM clients: not installed"
    t0 = time.perf_counter()
    probe = subprocess.run(["scontrol", "show", "config"], env=env, capture_output=True, timeout=60)
    return (f"SLURM clients: installed; controller {'reachable' if probe.returncode == 0 else 'not reachable'} "
            f"(`scontrol show config` {time.perf_counter() - t0:.2f} s); client config cache /run/slurm/conf "
            f"{'present' if Path('/run/slurm/conf').exists() else 'absent'}")


if __name__ == "__main__":
    main()
