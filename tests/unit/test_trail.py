"""The provenance trail (``lara trail``) on a small workflow laid out on disk: real files, real
Snakemake metadata records in Snakemake's own layout, a sidecar written by ``write_sidecar``; then
every way the trail can have a hole, each of which must say "broken" or "unknown", never "holds"."""

import json
import subprocess
import sys
import time
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest

from lara import trail

from ..conftest import lara_in_process

FIG = "results/x/figures/f.png"


def _record(root: Path, path: str, rule: str, inputs: list[str], endtime: float | None = None) -> None:
    b64 = urlsafe_b64encode(path.encode()).decode()
    f = root / ".snakemake" / "metadata" / b64
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({"rule": rule, "input": inputs, "params": [f"{rule}-param"],
                             "shellcmd": f"lara {rule} --settings '{{\"seed\": 7, \"x\": 1}}' > log 2>&1",
                             "endtime": time.time() if endtime is None else endtime}))


@pytest.fixture()
def drawn(tmp_path):
    """source data/src.txt -> results/x/a.txt (rule make_a) -> results/x/b.txt (make_b) -> the figure."""
    (tmp_path / "data").mkdir()
    (tmp_path / "results/x/figures").mkdir(parents=True)
    (tmp_path / "data/src.txt").write_text("source")
    (tmp_path / "results/x/a.txt").write_text("a")
    (tmp_path / "results/x/b.txt").write_text("b")
    (tmp_path / FIG).write_bytes(b"png")
    _record(tmp_path, "results/x/a.txt", "make_a", ["data/src.txt"])
    _record(tmp_path, "results/x/b.txt", "make_b", ["results/x/a.txt"])
    trail.write_sidecar([FIG], ["results/x/b.txt"], "figure", {}, tmp_path / trail.sidecar_path(FIG), root=tmp_path)
    return tmp_path


def _check(root):
    """`lara trail FIG` in ``root`` through the CLI's own main function in this process (the test of a trail found
    from elsewhere below runs real processes): its exit status and output."""
    rc, out, err = lara_in_process(["trail", FIG], cwd=root)
    return rc, out + err


def _edit(root, change, redigest=False):
    side = root / trail.sidecar_path(FIG)
    record = json.loads(side.read_text())
    change(record)
    if redigest:  # a careful editor who also recomputes the digest
        record["digest"] = trail.digest(record)
    side.write_text(json.dumps(record))


def test_an_intact_trail_holds(drawn):
    rc, out = _check(drawn)
    assert rc == 0 and "provenance holds: all 4 recorded hashes match" in out


def test_a_file_rewritten_after_its_job_does_not_hold(drawn):
    """results/x/a.txt rewritten (a step rerun by hand) after the job that made it ended, then the figure redrawn:
    every hash matches, but the job's record does not describe the file, so the trail does not hold."""
    _record(drawn, "results/x/a.txt", "make_a", ["data/src.txt"], endtime=time.time() - 3600)
    trail.write_sidecar([FIG], ["results/x/b.txt"], "figure", {}, drawn / trail.sidecar_path(FIG), root=drawn)
    rc, out = _check(drawn)
    assert rc == 1 and "PROVENANCE UNKNOWN" in out
    assert "results/x/a.txt: was written after the job that made it finished" in out
    assert "rule make_a" in out and "source (not made by this workflow)" in out and "seed 7" in out


def test_an_altered_input_is_broken(drawn):
    (drawn / "results/x/a.txt").write_text("A")
    rc, out = _check(drawn)
    assert rc == 1 and "PROVENANCE BROKEN: results/x/a.txt: sha256" in out and "holds" not in out


@pytest.mark.parametrize("redigest", [False, True])
def test_a_removed_entry_is_broken(drawn, redigest):
    _edit(drawn, lambda r: r["trail"].pop(1), redigest)  # results/x/a.txt
    rc, out = _check(drawn)
    assert rc == 1 and "holds" not in out
    if redigest:
        assert "PROVENANCE BROKEN: results/x/a.txt: an input of results/x/b.txt with no entry" in out
    else:
        assert "does not match its digest" in out


@pytest.mark.parametrize("redigest", [False, True])
def test_a_null_hash_is_never_holds(drawn, redigest):
    def null(r):
        r["trail"][0]["sha256"] = None

    _edit(drawn, null, redigest)
    rc, out = _check(drawn)
    assert rc == 1 and "holds" not in out
    if redigest:
        assert "PROVENANCE UNKNOWN: results/x/b.txt: no hash recorded" in out
    else:
        assert "does not match its digest" in out


def test_a_sidecar_without_a_digest_is_unknown(drawn):
    _edit(drawn, lambda r: r.pop("digest"))
    rc, out = _check(drawn)
    assert rc == 1 and "PROVENANCE UNKNOWN: the sidecar carries no digest" in out


@pytest.mark.parametrize("content, message", [
    ('{"figure": [', "does not parse as JSON"),
    ('{"figure": [], "trail": []}', "missing inputs"),
    ("[1, 2]", "missing figure, inputs, trail"),
    ('{"figure": [{"sha256": null}], "inputs": [], "trail": []}', "entries without a path"),
])
def test_a_corrupt_sidecar_is_a_clear_error(drawn, content, message):
    side = drawn / trail.sidecar_path(FIG)
    side.write_text(content)
    rc, out = _check(drawn)
    assert rc == 2 and str(trail.sidecar_path(FIG)) in out and message in out and "Traceback" not in out


def test_missing_snakemake_metadata_makes_the_origin_unknown(drawn):
    import shutil

    shutil.rmtree(drawn / ".snakemake")
    side = drawn / trail.sidecar_path(FIG)
    trail.write_sidecar([FIG], ["results/x/b.txt"], "figure", {}, side, root=drawn)
    rc, out = _check(drawn)
    assert rc == 1 and "PROVENANCE UNKNOWN: results/x/b.txt: no Snakemake record" in out
    assert "origin unknown" in out and "holds" not in out


def test_a_sidecar_swapped_for_another_figures_is_broken(drawn):
    """`lara trail f.png` verifies f.png itself: another figure's sidecar beside it does not vouch for it."""
    other = "results/x/figures/g.png"
    (drawn / other).write_bytes(b"another png")
    trail.write_sidecar([other], ["results/x/b.txt"], "figure", {}, drawn / trail.sidecar_path(other), root=drawn)
    (drawn / trail.sidecar_path(FIG)).write_bytes((drawn / trail.sidecar_path(other)).read_bytes())
    rc, out = _check(drawn)
    assert rc == 1 and "this sidecar is the provenance of g.png, not of f.png" in out and "holds" not in out


def test_a_figure_that_is_not_the_recorded_one_is_broken(drawn):
    (drawn / FIG).write_bytes(b"redrawn by hand")
    rc, out = _check(drawn)
    assert rc == 1 and "this is not the figure the sidecar vouches for" in out


@pytest.mark.parametrize("field, change", [
    ("shows", lambda r: r["shows"].update(lambda_star=0.5, tau=1.0)),
    ("code", lambda r: r["code"].update(git_commit="0" * 40)),
    ("params", lambda r: r["params"].update(x="y")),
    ("seeds", lambda r: r["seeds"].update({"results/x/b.txt": 99})),
    ("rule", lambda r: r.update(rule="another_rule")),
    ("software", lambda r: r["software"].update(torch="0.0")),
])
def test_every_field_a_reader_relies_on_is_under_the_digest(drawn, field, change):
    side = drawn / trail.sidecar_path(FIG)
    trail.write_sidecar([FIG], ["results/x/b.txt"], "figure", {"a": 1}, side, root=drawn,
                        shows={"lambda_star": 0.1, "tau": -0.5})
    assert _check(drawn)[0] == 0
    _edit(drawn, change)
    rc, out = _check(drawn)
    assert rc == 1 and "PROVENANCE BROKEN: the sidecar does not match its digest" in out, field


def test_an_older_sidecar_with_a_partial_digest_is_unknown(drawn):
    def legacy(record):
        record.pop("digest_covers")
        record["digest"] = trail.digest(record, legacy=True)

    _edit(drawn, legacy)
    rc, out = _check(drawn)
    assert rc == 1 and "PROVENANCE UNKNOWN: an older sidecar: its digest covers the figure, inputs and trail" in out


def test_the_trail_is_found_from_the_sidecar_wherever_lara_trail_runs(drawn, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    proc = subprocess.run([sys.executable, "-m", "lara", "trail", str(drawn / FIG)], cwd=elsewhere,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "provenance holds" in proc.stdout, proc.stdout + proc.stderr
    moved = elsewhere / "f.png"  # a figure and sidecar taken out of their workflow: say --root
    moved.write_bytes((drawn / FIG).read_bytes())
    (elsewhere / "f.provenance.json").write_bytes((drawn / trail.sidecar_path(FIG)).read_bytes())
    proc = subprocess.run([sys.executable, "-m", "lara", "trail", "f.png"], cwd=elsewhere, capture_output=True,
                          text=True)
    assert proc.returncode == 1 and "pass --root WORKFLOW_DIR" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "lara", "trail", "f.png", "--root", str(drawn)], cwd=elsewhere,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_the_printed_trail_names_each_param(drawn):
    """Snakemake records a job's params as the reprs of their values, without names; the trail names them by
    the form every rule gives them (a step's code hash, its settings JSON, extra options)."""
    meta = drawn / ".snakemake" / "metadata" / urlsafe_b64encode(b"results/x/b.txt").decode()
    record = json.loads(meta.read_text())
    record["params"] = ["'fe2596fd0b315caf'", repr('{"seed": 7, "tau": -0.5}'), "'--max-prompts 5'", "3"]
    meta.write_text(json.dumps(record))
    trail.write_sidecar([FIG], ["results/x/b.txt"], "figure", {}, drawn / trail.sidecar_path(FIG), root=drawn)
    rc, out = _check(drawn)
    assert rc == 0, out
    assert "code: fe2596fd0b315caf (hash of the step's source)" in out
    assert 'settings: {"seed": 7, "tau": -0.5}' in out and "options: --max-prompts 5" in out and "param: 3" in out
