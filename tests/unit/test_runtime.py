"""lara.runtime.configure_torch: what every torch step turns on, in a fresh interpreter (as a job starts)."""

import json
import subprocess
import sys

PROBE = """
import json, sys
from lara.runtime import configure_torch
state = configure_torch()
import torch
print(json.dumps({"state": state, "deterministic": torch.are_deterministic_algorithms_enabled(),
                  "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
                  "threads": torch.get_num_threads(), "inductor": "torch._inductor.config" in sys.modules,
                  "nan_fill": torch.utils.deterministic.fill_uninitialized_memory}))
"""


def test_deterministic_warn_only_with_the_jobs_threads_and_no_compiler_imported():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                         env={"OMP_NUM_THREADS": "1", "PATH": ""}).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["deterministic"] and got["warn_only"] and got["threads"] == 1 == got["state"]["threads"]
    # the public switch would import torch._inductor.config (dynamo, sympy): ~2 s of CPU in every job
    assert not got["inductor"]
    # deterministic mode's NaN fill of every torch.empty is off: TRL's scratch tile made it half of SFT's time
    assert got["nan_fill"] is False
