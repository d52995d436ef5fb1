"""The several-constraints part of ``lara summary``: the vector lambda record, its held-out audit (each constraint
under its decoding scorer and under every judge the decoder never saw, and whether the scorer's improvement carries
to the judge), and its coverage study with both Learn-then-Test bounds. Read from the run's own files."""

from __future__ import annotations

from pathlib import Path


def _vec(v) -> str:
    return "(" + ", ".join(f"{float(x):.4g}" for x in v) + ")" if v is not None else "none"


def record_lines(path: Path, record: dict) -> list[str]:
    cons = record["constraints"]
    what = ", ".join(f"{c['name']}: " + (f"P({c['cost']} > {c['threshold']:g}) <= {c['tau']:g}"
                                         if c.get("kind") == "probability" else f"E[{c['cost']}] <= {c['tau']:g}")
                     for c in cons)
    guarantee = record.get("guarantee") or {}
    lines = [f"several constraints ({path}): {what}; Best-of-{record['decoder']['n']}",
             f"  lambda-hat = {_vec(record['lambda_hat'])}, lambda* = {_vec(record['lambda_star'])} (deployed: "
             f"{guarantee.get('procedure')})"]
    for name in ("ltt", "ltt_wsr"):
        p = (record.get("procedures") or {}).get(name)
        if p:
            state = "certified" if p.get("feasible") else "NOT certified"
            lines.append(f"  {name:8} lambda {_vec(p['lambda'])}: {state}; {p.get('statement', '')}")
    return lines


def coverage_lines(path: Path, cov: dict) -> list[str]:
    lines = ["", f"coverage study ({path}): per procedure and calibration size n, over {cov['summary'][0]['repeats']} "
                 "draws: the joint violation rate, the share of draws certified (LTT) and the reward given up",
             f"  {'procedure':9} {'n':>5}  {'violation [95% CI]':>24}  {'certified':>9}  {'reward given up':>15}"]
    for r in cov["summary"]:
        given = "" if r.get("reward_given_up") is None else f"{r['reward_given_up']:15.4f}"
        rate = f"{r['violation_rate']:.4f} [{r['violation_lo']:.4f}, {r['violation_hi']:.4f}]"
        lines.append(f"  {r['procedure']:9} {r['n']:5d}  {rate:>24}  {1 - r['infeasible_rate']:9.3f}  {given:>15}")
    return lines


def constraints_lines(root: Path) -> list[str]:
    """Nothing when the run has no constraints stage; otherwise its record, audit and coverage study."""
    from lara.constraints.audit import audit_lines
    from lara.read.files import json_file

    folder = root / "constraints"
    if not (folder / "lambda.json").exists():
        return []
    lines = [""] + record_lines(folder / "lambda.json", json_file(folder / "lambda.json", mapping=False))
    if (folder / "audit.json").exists():
        lines += audit_lines(folder / "audit.json", json_file(folder / "audit.json", mapping=False))
    if (folder / "coverage.json").exists():
        lines += coverage_lines(folder / "coverage.json", json_file(folder / "coverage.json", mapping=False))
    return lines
