"""Start-up cost of the `lara` command: what every one of the ~74 toy jobs pays before any work.

    python benchmarks/startup.py [--repeats 5]

Prints the median wall time of fresh processes, each against the floor the interpreter allows:

* ``python -c pass`` (the interpreter alone) and ``python -c "import numpy, pandas"`` (the
  libraries a table step cannot avoid);
* ``lara --help`` (target <= 0.5 s: no step module imported);
* ``lara calibrate`` on a 10-row scores file (target <= 1.5 s cold: parse, read, solve, bootstrap,
  write lambda.json);
* the code hashes of every rule (``lara.codehash``, what the Snakefile computes at parse time), with the parse
  cache empty (every module parsed: the old cost, and a first start) and with it filled (every later start).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wall(cmd: list[str], repeats: int, cache: Path | None = None, cold: bool = False) -> float:
    """The median wall time of ``cmd``; ``cache``: its parse cache folder (XDG_CACHE_HOME), emptied before each run
    when ``cold``."""
    env = None if cache is None else os.environ | {"XDG_CACHE_HOME": str(cache)}
    times = []
    for _ in range(repeats):
        if cold and cache is not None:
            shutil.rmtree(cache, ignore_errors=True)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        scores = Path(tmp) / "scores.parquet"
        subprocess.run([py, "-c", f"""
import numpy as np, pandas as pd
rng = np.random.default_rng(0)
pd.DataFrame({{"prompt_id": [f"p{{i // 2}}" for i in range(10)], "sample_id": [i % 2 for i in range(10)],
              "reward": rng.normal(size=10), "cost": rng.normal(size=10)}}).to_parquet({str(scores)!r})
"""], check=True)
        rows = [
            ("python -c pass (floor)", [py, "-c", "pass"], None),
            ("import numpy, pandas (floor of a table step)", [py, "-c", "import numpy, pandas"], None),
            ("lara --help", [py, "-m", "lara", "--help"], 0.5),
            ("lara calibrate, 10 rows, 1000 replicates", [py, "-m", "lara", "--log-level", "WARNING", "calibrate",
                                                        "--scores", str(scores), "--tau", "0", "--bootstrap",
                                                        "1000", "--out", str(Path(tmp) / "lambda.json")], 1.5),
        ]
        hashes = [py, "-c", "from lara.steps import COMMANDS; from lara.codehash import step_code; "
                            "[step_code(c) for c in COMMANDS]"]
        cache = Path(tmp) / "cache"
        rows += [("code hashes of every command, cache empty", hashes, None, True),
                 ("code hashes of every command, cache filled", hashes, None, False)]
        print(f"{'what':46s} {'median s':>9s} {'target s':>9s}")
        for name, cmd, target, *cold in rows:
            t = wall(cmd, args.repeats, cache, bool(cold and cold[0]))
            verdict = "" if target is None else ("  ok" if t <= target else "  OVER")
            print(f"{name:46s} {t:9.3f} {target if target else '':>9}{verdict}")


if __name__ == "__main__":
    main()
