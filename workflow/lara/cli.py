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
import re
import sys
import time

from lara.steps import COMMANDS, TORCH_COMMANDS

log = logging.getLogger("lara")

# the steps that may reach the Hugging Face hub: the download step; every other step runs offline
ONLINE_COMMANDS = {"fetch"}
# the scheduler's view of a job, logged at its start
JOB_VARIABLES = ("SLURM_JOB_ID", "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "CUDA_VISIBLE_DEVICES")


def command_help(module_name: str) -> str:
    """A step module's ``HELP`` string, read from its source without importing the module (so the
    command list costs no step's imports)."""
    import ast

    from lara.codehash import module_file

    tree = ast.parse(module_file(module_name).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "HELP" for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:  # a HELP built from the module's own names: imported after all
                break
    return importlib.import_module(module_name).HELP


def make_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``only`` (importing just that step's module, so one step starts without paying
    for the imports of the others), or, for the command list, of none (no step module imported)."""
    parser = Parser(
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
        p.set_defaults(_run=module.run, _flags=_flag_names(p))
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


_HANDLER: logging.Handler | None = None  # the handler main() installed (replaced when main runs again in-process)


def _configure_logging(level: str) -> None:
    """This process's log: one handler on stderr, through a filter that redacts credentials (lara.secrets), so no
    key in a URL or header reaches a log line. One process logs at ``level``; under a multi-process launch
    (accelerate sets RANK and WORLD_SIZE) each line names its rank and only rank 0 logs below warnings, so the
    job's log reads like a single process's. Calling main() again in the same process (the fault catalogue does)
    replaces the handler, never stacks a second."""
    from lara.runtime import rank, world_size
    from lara.secrets import RedactingFilter

    global _HANDLER
    root = logging.getLogger()
    if _HANDLER is not None:
        root.removeHandler(_HANDLER)
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    world, me = world_size(), rank()
    if world > 1:
        fmt = f"%(asctime)s [rank {me}/{world}] %(levelname)s %(name)s: %(message)s"
        if me != 0 and logging.getLevelName(level) < logging.WARNING:
            level = "WARNING"
    _HANDLER = logging.StreamHandler(sys.stderr)
    _HANDLER.setFormatter(logging.Formatter(fmt))
    _HANDLER.addFilter(RedactingFilter())
    root.addHandler(_HANDLER)
    root.setLevel(level)


# The outputs that are folders: a model (written whole with atomic_output(directory=True)) and a trainer's
# checkpoint folder; every other output is one file. A step module may say so itself (FOLDER_OUTPUTS).
_TRAINED = ("out", "checkpoints")
FOLDER_OUTPUTS: dict[str, tuple[str, ...]] = {
    **{name: _TRAINED for name in COMMANDS if name.startswith("train-")},
    "make-toy-model": ("out",),
    "import-gguf": ("out",),
}
NOT_PATHS = {"command", "log_level"}  # destinations that never name a file

# A value that reads as a number is a value, never an option: argparse alone takes -1 and -1.5 but reads
# -1e-3, -.5, -1E3 and -inf as unknown options ("expected one argument")
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf(inity)?|nan)$", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """argparse's parser, reading every negative number (``--tau -1e-3``, ``-.5``, ``-1E3``) as a value
    (its subcommands' parsers are of the same class)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER


def _shown(value: str, limit: int = 120) -> str:
    """A path as a message shows it: whole, or its two ends when it is very long."""
    text = str(value) if value != "" else "''"
    return text if len(text) <= limit else f"{text[:60]}…{text[-50:]}"


def _kind(mode: int) -> str | None:
    """What a file that is neither a regular file nor a folder is."""
    import stat

    return next((name for test, name in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                                         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")) if test(mode)),
                None)


def _limits(folder: str) -> tuple[int, int]:
    """NAME_MAX and PATH_MAX of the file system holding ``folder`` (255 and 4096 where it will not say)."""
    limits = []
    for name, default in (("PC_NAME_MAX", 255), ("PC_PATH_MAX", 4096)):
        try:
            limits.append(os.pathconf(folder, name) or default)
        except (OSError, ValueError):
            limits.append(default)
    return limits[0], limits[1]


def _check_output_name(flag: str, value: str, folder: bool) -> None:
    """An output's name, as given, can name an output: not empty, not ``-``, and (for a file) not a folder's."""
    from lara.config import ConfigError

    what = "a folder" if folder else "a file"
    if value == "":
        raise ConfigError(f"{flag} '': an empty path; name {what} (nothing was computed)")
    if value == "-":
        raise ConfigError(f"{flag} -: this step cannot write to standard output; name {what} (nothing was computed)")
    if not folder and (value.endswith(os.sep) or value.endswith(f"{os.sep}.") or value in (".", "..")):
        raise ConfigError(f"{flag} {_shown(value)}: names a folder (it ends in {os.sep!r} or '.'); this step writes "
                          "a file there: give the file's name (nothing was computed)")


def _check_one_output(flag: str, value: str, folder: bool) -> None:
    """One output can be written where it is named: a name, within the file system's limits, a file (or,
    for a folder output, a folder) or nothing there, in a folder this process can write in."""
    import errno
    import stat
    import tempfile

    from lara.config import ConfigError
    from lara.io import TEMPORARY_NAME_BYTES

    what = "a folder" if folder else "a file"
    shown = f"{flag} {_shown(value)}"
    path = os.path.abspath(value)
    here = os.path.dirname(path)  # the nearest folder that is there: the limits are its file system's
    while not os.path.isdir(here) and here != os.path.dirname(here):
        here = os.path.dirname(here)
    name_max, path_max = _limits(here)
    parts = [p for p in path.split(os.sep) if p]
    for i, part in enumerate(parts):
        size = len(os.fsencode(part))
        last = i == len(parts) - 1
        allowed = name_max - TEMPORARY_NAME_BYTES if last else name_max
        if size > allowed:
            extra = f" ({name_max}, less {TEMPORARY_NAME_BYTES} for the temporary name beside it)" if last else ""
            named = "its name" if last else f"the folder name {_shown(part, 60)}"
            raise ConfigError(f"{shown}: {named} is {size} bytes, more than the {allowed} this file system allows"
                              f"{extra}; shorten it (nothing was computed)")
    longest = len(os.fsencode(os.path.join(os.path.dirname(path), "." + os.path.basename(path)))) + \
        TEMPORARY_NAME_BYTES - 1
    if longest + 1 > path_max:
        raise ConfigError(f"{shown}: the full path is {longest} bytes with its temporary name, more than the "
                          f"{path_max - 1} this system allows (PATH_MAX); write it nearer the root "
                          "(nothing was computed)")
    # every folder above it: a folder, or nothing yet (made when written), never a file or a broken link
    up = os.path.dirname(path)
    while not os.path.lexists(up):
        up = os.path.dirname(up)
    try:
        os.stat(up)
    except OSError as exc:
        problem = ("a symbolic link loop" if exc.errno == errno.ELOOP else
                   f"a symbolic link to nothing ({os.readlink(up)})" if os.path.islink(up) else exc.strerror)
        raise ConfigError(f"{shown}: {_shown(up)} is {problem}, not a folder (nothing was computed)") from None
    if not os.path.isdir(up):
        raise ConfigError(f"{shown}: {_shown(up)} is a file, not a folder (nothing was computed)")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None  # nothing there yet (or a link to nothing, which the write replaces)
    except OSError as exc:
        problem = "a symbolic link loop" if exc.errno == errno.ELOOP else exc.strerror
        raise ConfigError(f"{shown}: is {problem} (nothing was computed)") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode) and not folder:
            raise ConfigError(f"{shown}: is a folder; this step writes a file there (nothing was computed)")
        if stat.S_ISREG(st.st_mode) and folder:
            raise ConfigError(f"{shown}: is a file; this step writes a folder there (nothing was computed; the "
                              "file is left as it was)")
        kind = _kind(st.st_mode)
        if kind is not None:
            raise ConfigError(f"{shown}: is {kind}, not a regular file; this step writes {what} there and would "
                              "replace it (nothing was computed)")
    try:
        with tempfile.TemporaryFile(dir=up, prefix=".lara-write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot write in {_shown(up)} ({exc.strerror or exc}); nothing was "
                          "computed") from None


def _same(a: str, b: str) -> bool:
    """Whether two paths name the same file or folder: the same (device, inode) where both are there (a hard
    link, a symbolic link, ./ and ../ included), else the same place once links are resolved."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` lies inside the folder ``folder`` (links resolved)."""
    p, f = os.path.realpath(path), os.path.realpath(folder)
    return p != f and os.path.commonpath([p, f]) == f


def output_flags(args) -> tuple[dict[str, str], set[str]]:
    """The outputs a step will write, flag destination -> path (the flags its module lists in ``OUTPUTS``,
    default ``--out``, and its folder outputs), and which of them are folders."""
    module = sys.modules[args._run.__module__]
    folders = set(getattr(module, "FOLDER_OUTPUTS", FOLDER_OUTPUTS.get(args.command, ())))
    dests = dict.fromkeys((*getattr(module, "OUTPUTS", ("out",)), *sorted(folders)))
    outputs = {d: getattr(args, d) for d in dests if isinstance(getattr(args, d, None), (str, os.PathLike))}
    return {d: os.fspath(v) for d, v in outputs.items()}, folders & set(outputs)


def input_paths(args, outputs) -> list[tuple[str, str]]:
    """Every other flag's value that names a file or folder that is there, (destination, path): what the step
    may read (a list flag gives each of its paths)."""
    return [(dest, os.fspath(v)) for dest, value in vars(args).items()
            if not (dest.startswith("_") or dest in outputs or dest in NOT_PATHS)
            for v in (value if isinstance(value, (list, tuple)) else [value])
            if isinstance(v, (str, os.PathLike)) and os.fspath(v) not in ("", "-") and os.path.exists(v)]


def _flag_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """How a step's command line names each destination: its long option (``--tau`` for ``setting_tau``), or,
    for a positional argument, its name."""
    names = {}
    for action in parser._actions:
        longest = max(action.option_strings, key=len, default=None)
        names[action.dest] = longest or (action.metavar if isinstance(action.metavar, str) else action.dest)
    return names


def _flag(dest: str, args=None) -> str:
    return getattr(args, "_flags", {}).get(dest) or f"--{dest.replace('_', '-')}"


def check_outputs(args) -> None:
    """Every output a step will write can be written there and hurts no input, checked before any computation,
    each refusal naming the flag: a file output that names a folder (or a folder output a file), a pipe or a
    device, an empty path or ``-``, a name or path longer than the file system allows, a folder nobody can
    write in, an output that is one of the step's inputs (the same file after links, ``./`` and hard links), lies
    inside an input folder, or is another output, and a folder output that holds an input."""
    from lara.config import ConfigError

    outputs, folders = output_flags(args)
    for dest, value in outputs.items():
        _check_output_name(_flag(dest, args), value, dest in folders)
    inputs = input_paths(args, outputs)
    seen: list[str] = []
    for dest, value in outputs.items():
        shown = f"{_flag(dest, args)} {_shown(value)}"
        for other in seen:
            if _same(value, outputs[other]):
                raise ConfigError(f"{shown}: is also the output {_flag(other, args)}; one file cannot hold both "
                                  "(nothing was computed)")
        for other in outputs:
            if other != dest and other in folders and _inside(value, outputs[other]):
                raise ConfigError(f"{shown}: is inside the output folder {_flag(other, args)} "
                                  f"{_shown(outputs[other])}; writing one would change the other (nothing was "
                                  "computed)")
        seen.append(dest)
        for idest, ipath in inputs:
            given = f"{_flag(idest, args)} {_shown(ipath)}"
            if _same(value, ipath):
                raise ConfigError(f"{shown}: is also the input {_flag(idest, args)} (nothing was computed; the "
                                  "input is left as it was)")
            if os.path.isdir(ipath) and _inside(value, ipath):
                raise ConfigError(f"{shown}: is inside the input folder {given}; writing it would change that input "
                                  "(nothing was computed)")
            if dest in folders and _inside(ipath, value):
                raise ConfigError(f"{shown}: holds the input {given}, and this step replaces that folder (nothing "
                                  "was computed; the input is left as it was)")
    for dest, value in outputs.items():
        _check_one_output(_flag(dest, args), value, dest in folders)


def _write_failed(args, exc) -> str:
    """A failed write (lara.io.WriteError) as one line naming the output's flag, where it is one."""
    try:
        outputs, _ = output_flags(args)
    except (AttributeError, KeyError):
        outputs = {}
    for dest, value in outputs.items():
        if _same(str(exc.path), value) or _inside(str(exc.path), value):
            return f"{_flag(dest, args)} {_shown(value)}: {exc.explain()}"
    return f"{_shown(str(exc.path))}: {exc.explain()}"


def reads_settings(module_name: str) -> bool:
    """Whether a step reads its settings (lara.settings.read_settings, which then checks its inputs: a bad setting is
    named before a bad input), read off its source."""
    from lara.codehash import module_file

    text = module_file(module_name).read_text()
    return "read_settings(" in text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = _command_in(argv)
    if command is not None and command not in ONLINE_COMMANDS:
        # every step but `lara fetch` reads the Hugging Face cache only (lara.hub); set before any step imports
        # huggingface_hub, transformers or datasets, which read these once
        os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    args = make_parser(command).parse_args(argv)
    _configure_logging(args.log_level)
    from lara.config import ConfigError
    from lara.hub import HubError
    from lara.io import BEFORE_WRITE, DISK_ERRNOS, WriteError
    from lara.provenance import code_version
    from lara.read.files import DataError, forget

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
    forget()  # every input of this command is read afresh, once
    try:
        check_outputs(args)
        from lara.read.contracts import ensure

        args._after_settings = ensure
        BEFORE_WRITE[:] = [lambda: ensure(args)]  # at the latest before its first output
        if not reads_settings(COMMANDS[args.command]):
            ensure(args)  # a step without settings: its inputs through the one reader, against its contract row
        args._run(args)  # a step with settings: read_settings checks them, then its inputs (ensure), before it computes
    except (ConfigError, DataError, HubError) as exc:
        log.error("lara %s failed: %s", args.command, exc)
        return 2
    except WriteError as exc:  # a full disk, a quota, a file size limit, a read-only folder: the old output kept
        log.error("lara %s failed: %s", args.command, _write_failed(args, exc))
        return 2
    except OSError as exc:
        if exc.errno not in DISK_ERRNOS:
            raise
        where = _shown(os.fsdecode(exc.filename)) if exc.filename is not None else "a file this step writes"
        words = os.strerror(exc.errno)
        log.error("lara %s failed: %s: %s while writing (outputs are written whole or not at all)", args.command,
                  where, words[:1].lower() + words[1:])
        return 2
    finally:
        BEFORE_WRITE.clear()
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
