"""The ``lara`` console command: one subcommand per workflow step.

Each step module exposes ``HELP``, ``add_arguments(parser)`` and ``run(args)``; heavy
libraries are imported inside the functions that need them, so ``lara --help`` is fast.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import sys
import time

from lara.steps import COMMANDS, TORCH_COMMANDS

log = logging.getLogger("lara")

# the scheduler's view of a job, logged at its start
# the steps that may reach the Hugging Face hub: the download step; every other step runs offline
ONLINE_COMMANDS = {"fetch"}

JOB_VARIABLES = ("SLURM_JOB_ID", "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "CUDA_VISIBLE_DEVICES")


def command_help(module_name: str) -> str:
    """A step module's ``HELP`` string, read from its source without importing the module (so the
    command list costs no step's imports)."""
    import ast

    from lara.codehash import module_file

    tree = ast.parse(module_file(module_name).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "HELP" for t in node.targets):
            return ast.literal_eval(node.value)
    return importlib.import_module(module_name).HELP


def make_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``only`` (importing just that step's module, so one step starts without paying
    for the imports of the others), or, for the command list, of none (no step module imported)."""
    parser = argparse.ArgumentParser(
        prog="lara", description="LARA: Lagrangian Reward Augmentation for safe inference-time "
        "alignment. Each subcommand is one step of the Snakemake workflow.")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        if name != only:  # the command list: each step's help, no step imported
            sub.add_parser(name, help=command_help(module_name))
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def _command_in(argv: list[str]) -> str | None:
    """The subcommand named on the command line, if it is the first positional argument."""
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        opt = rest.pop(0)
        if opt == "--log-level" and rest:
            rest.pop(0)
        elif opt in ("-h", "--help"):
            return None
    return rest[0] if rest and rest[0] in COMMANDS else None


def _log_format(level: str) -> dict:
    """Logging for this process: one process logs at ``level``; under a multi-process launch
    (accelerate sets RANK and WORLD_SIZE) each line names its rank and only rank 0 logs below
    warnings, so the job's log reads like a single process's."""
    from lara.runtime import rank, world_size

    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    world, me = world_size(), rank()
    if world > 1:
        fmt = f"%(asctime)s [rank {me}/{world}] %(levelname)s %(name)s: %(message)s"
        if me != 0 and logging.getLevelName(level) < logging.WARNING:
            level = "WARNING"
    return {"level": level, "stream": sys.stderr, "format": fmt}


_HANDLER: logging.Handler | None = None  # the handler main() installed (replaced when main runs again in-process)


def _configure_logging(level: str) -> None:
    """This process's log: one handler on stderr, in the format of :func:`_log_format`, through a filter
    that redacts credentials (lara.secrets), so no key in a URL or header reaches a log line. Calling
    main() again in the same process (the fault catalogue does) replaces it, never stacks a second."""
    from lara.secrets import RedactingFilter

    global _HANDLER
    root = logging.getLogger()
    if _HANDLER is not None:
        root.removeHandler(_HANDLER)
    spec = _log_format(level)
    _HANDLER = logging.StreamHandler(spec["stream"])
    _HANDLER.setFormatter(logging.Formatter(spec["format"]))
    _HANDLER.addFilter(RedactingFilter())
    root.addHandler(_HANDLER)
    root.setLevel(spec["level"])


FILE_SUFFIXES = (".parquet", ".json", ".jsonl", ".csv", ".tsv", ".png", ".pdf", ".sqlite")  # outputs that are files


def check_outputs(args) -> None:
    """Every output a step will write (the flags its module lists in ``OUTPUTS``, default ``--out``) can be
    written there, checked before any computation: a file output that names a folder, or a folder
    nobody can write in, is refused naming the flag, not found out after hours by a traceback."""
    import tempfile
    from pathlib import Path

    from lara.config import ConfigError

    module = sys.modules[args._run.__module__]
    for dest in getattr(module, "OUTPUTS", ("out",)):
        value = getattr(args, dest, None)
        if value is None:
            continue
        flag, path = f"--{dest.replace('_', '-')}", Path(value)
        if path.suffix.lower() in FILE_SUFFIXES and path.is_dir():  # (a model folder may be called Qwen2.5-3B)
            raise ConfigError(f"{flag} {value}: is a folder; this step writes a file there (nothing was computed)")
        here = path.absolute().parent
        while not here.exists():
            here = here.parent
        if not here.is_dir():
            raise ConfigError(f"{flag} {value}: {here} is a file, not a folder (nothing was computed)")
        try:
            with tempfile.TemporaryFile(dir=here, prefix=".lara-write-check-"):
                pass
        except OSError as exc:
            raise ConfigError(f"{flag} {value}: cannot write in {here} ({exc.strerror or exc}); nothing was "
                              "computed") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = _command_in(argv)
    if command is not None and command not in ONLINE_COMMANDS:
        # every step but `lara fetch` reads the Hugging Face cache only (lara.hub); set before any step imports
        # huggingface_hub, transformers or datasets, which read these once
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    args = make_parser(command).parse_args(argv)
    _configure_logging(args.log_level)
    from lara.config import ConfigError
    from lara.data.tables import DataError
    from lara.hub import HubError
    from lara.provenance import code_version

    settings = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    log.info("lara %s %s", args.command, settings)
    log.info("code version %s", code_version())
    placed = {k: os.environ[k] for k in JOB_VARIABLES if k in os.environ}
    if placed:  # what the scheduler gave this job (a SLURM job: its id, CPUs, GPUs)
        log.info("job environment: %s", " ".join(f"{k}={v}" for k, v in placed.items()))
    if args.command in TORCH_COMMANDS:
        from lara.runtime import configure_torch

        configure_torch()
    start = time.perf_counter()
    try:
        check_outputs(args)
        args._run(args)
    except (ConfigError, DataError, HubError) as exc:
        log.error("lara %s failed: %s", args.command, exc)
        return 2
    log.info("lara %s done in %.1f s", args.command, time.perf_counter() - start)
    return 0


def entry() -> None:
    """The `lara` command (and `python -m lara`): main(), then an exit that skips the interpreter's last
    garbage collection over the millions of objects torch and transformers create at import. That pass
    alone costs ~1.5 s of CPU per process (measured: 1.9 s -> 0.4 s from the end of a script that imports
    torch and transformers to its exit), about 90 s over the toy DAG's torch jobs. Nothing is lost: every
    output is closed and renamed into place before main() returns, and logging is shut down first."""
    code = main()
    logging.shutdown()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
