"""Every job of the toy DAG against its contract row, on the finished toy run's own files: the one reader accepts
every input a real run hands a step (each sealed table and record reads back as written, every kind, role, column
and agreement holds), so the contract table refuses only what is wrong."""

from __future__ import annotations

import shlex

import pytest

from ..conftest import run_snakemake


def lara_commands(text: str) -> list[list[str]]:
    """The ``lara`` argv of every job in a dry run's printed shell commands (a launcher prefix dropped)."""
    out = []
    for line in text.splitlines():
        if "Shell command: " not in line:
            continue
        argv = shlex.split(line.split("Shell command: ", 1)[1].split(" > logs", 1)[0])
        at = [i for i, a in enumerate(argv) if a == "lara" or a.endswith("/lara")]
        if at:
            out.append(argv[at[0] + 1:])
    return out


@pytest.mark.workflow
def test_every_job_of_the_toy_dag_meets_its_contract_on_the_runs_files(toy_run, monkeypatch):
    from lara.cli import make_parser
    from lara.read import files
    from lara.read.contracts import CONTRACTS, check

    proc = run_snakemake(toy_run, "-n", "-p", "--forceall")
    jobs = lara_commands(proc.stdout + proc.stderr)
    assert len(jobs) >= 140, "the toy DAG has ~151 jobs"
    assert {argv[0] for argv in jobs} <= set(CONTRACTS)
    monkeypatch.chdir(toy_run)
    refused, read = [], 0
    for argv in jobs:
        files.forget()
        try:
            read += len(check(argv[0], make_parser(argv[0]).parse_args(argv)))
        except Exception as exc:  # noqa: BLE001  (every refusal is listed)
            refused.append(f"lara {argv[0]}: {exc}")
    assert not refused, "\n".join(refused)
    assert read >= 200, f"only {read} inputs read: the contract rows should cover the DAG's table and JSON inputs"
