"""Benchmark: the whole toy DAG end to end (goal <= 10 min on 2 cores) and `snakemake -n` on the
finished run (goal <= 3 s), in a fresh copy of the workflow.

    python benchmarks/workflow_timing.py [--keep DIR]
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
    p.add_argument("--cores", default="2")
    args = p.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="lara-bench-"))
    for name in ("Snakefile", "rules", "config", "envs", "slurm", "report"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, work / name)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", HF_HUB_OFFLINE="1")
    snakemake = [sys.executable, "-m", "snakemake", "--cores", args.cores]
    t0 = time.perf_counter()
    subprocess.run(snakemake + ["-q"], cwd=work, env=env, check=True)
    full = time.perf_counter() - t0
    print(f"toy DAG end to end: {full:.1f} s ({full / 60:.2f} min; goal <= 10 min) in {work}")
    dry = []
    for _ in range(3):
        t0 = time.perf_counter()
        out = subprocess.run(snakemake + ["-n"], cwd=work, env=env, check=True, capture_output=True, text=True)
        dry.append(time.perf_counter() - t0)
        assert "Nothing to be done" in out.stdout + out.stderr
    print(f"snakemake -n on the finished run: {min(dry):.2f} s best of 3 ({', '.join(f'{d:.2f}' for d in dry)}; "
          "goal <= 3 s)")
    if not args.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
