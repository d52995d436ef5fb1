"""Per-process numerics: how many threads a job uses and which CPU kernels run, fixed by the job
and its configuration rather than by the machine it lands on.

Float results of the same code differ between CPUs because the libraries pick kernels by what the
CPU supports (AVX-512 or AVX2 code paths sum in different orders and use different exp/log
approximations) and because reductions split work by thread count. The workflow therefore

* gives every job exactly the threads its rule declares (Snakemake exports ``OMP_NUM_THREADS`` /
  ``MKL_NUM_THREADS`` … = the rule's ``threads``; :func:`configure_torch` makes torch use them), and
* with ``numerics.cpu_kernels: avx2`` exports :func:`cpu_kernel_environment` to every job, pinning
  PyTorch's vectorised kernels, MKL, oneDNN, OpenBLAS and NumPy's SIMD dispatch to the AVX2 code
  paths that every x86-64 CPU since about 2015 has. Two such machines then run the same kernels; an
  ARM machine (or a GPU) still computes differently, which docs/reproducibility.md states.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

# variables whose value decides which CPU code paths run (recorded in provenance)
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE",
                    "NPY_DISABLE_CPU_FEATURES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG")


def _numpy_avx512_features() -> list[str]:
    """NumPy's dispatched features above AVX2 on this NumPy (their names changed in 2.4)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__ as dispatch
    except ImportError:  # NumPy < 2.0 has its dispatch list elsewhere; leave it alone
        return []
    return [f for f in dispatch if "AVX512" in f or f == "X86_V4"]


def world_size() -> int:
    """Processes of this job (``accelerate launch --num_processes N`` sets WORLD_SIZE), 1 when run alone."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def rank() -> int:
    """This process's rank in a multi-process launch (RANK), 0 when run alone."""
    return int(os.environ.get("RANK", "0") or 0)


def cpu_kernel_environment(cpu_kernels: str) -> dict[str, str]:
    """Environment variables that pin the CPU kernels (``avx2``), or none (``native``)."""
    if cpu_kernels == "native":
        return {}
    if cpu_kernels != "avx2":
        raise ValueError(f"numerics.cpu_kernels: unknown value {cpu_kernels!r} (known: native, avx2)")
    env = {
        "ATEN_CPU_CAPABILITY": "avx2",  # PyTorch's vectorised CPU kernels
        "MKL_CBWR": "AVX2,STRICT",  # MKL's conditional numerical reproducibility
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "OPENBLAS_CORETYPE": "Haswell",  # NumPy/SciPy's OpenBLAS
    }
    features = _numpy_avx512_features()
    if features:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(features)
    return env


def deterministic_algorithms(torch) -> None:
    """``torch.use_deterministic_algorithms(True, warn_only=True)`` without its one side effect that costs: it
    imports ``torch._inductor.config`` (TorchDynamo, SymPy, FSDP: about 2 s of CPU per process, measured 2.2 s)
    only to set the compiler's own flag, and no lara step compiles. The eager flag is set through the call
    that the public function makes; where that is missing (another torch), or inductor is already imported
    (its flag then costs nothing), the public function.

    Deterministic mode also fills every ``torch.empty`` with NaN (``fill_uninitialized_memory``), a debugging
    aid for kernels that read memory they never wrote; it does not make a correct kernel more deterministic. It
    is turned off: TRL's fused log-probability head allocates a 4096 x 32768 scratch tile per forward and
    backward whatever the vocabulary, and the NaN fill of those pages took over half of a toy SFT run's time
    (40 steps: 34.2 s with it, 15.5 s without, the same losses)."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        setter(True, warn_only=True)
    import torch.utils.deterministic

    torch.utils.deterministic.fill_uninitialized_memory = False
    if not (torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()):
        raise RuntimeError("torch did not turn on deterministic algorithms (warn-only)")


def configure_torch() -> dict:
    """Deterministic algorithms (warn-only, so an op without a deterministic kernel still runs) and
    exactly the threads the job was given (``OMP_NUM_THREADS``, set by Snakemake from the rule's
    ``threads``). Call before the first CUDA operation. Returns what it set, for the log."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed by deterministic cuBLAS
    import torch

    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    deterministic_algorithms(torch)
    torch.backends.cudnn.benchmark = False
    if torch.cuda.is_available():  # float32 parts (a float32 run, float32 heads) may use TF32 tensor cores
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    state = {"threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
             "deterministic": True}
    log.info("torch: %(threads)d thread(s), CPU kernels %(cpu_capability)s, deterministic algorithms", state)
    return state


def numerics_record() -> dict:
    """What decided this process's numerics, for provenance records."""
    record = {k: os.environ[k] for k in KERNEL_VARIABLES if k in os.environ}
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        record["torch_threads"] = torch.get_num_threads()
        record["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return record
