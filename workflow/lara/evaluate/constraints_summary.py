"""The several-constraints part of ``lara summary``: the vector lambda record, its held-out audit (each constraint
under its decoding scorer and under every judge the decoder never saw, and whether the scorer's improvement carries
to the judge), and its coverage study with both Learn-then-Test bounds. Read from the run's own files."""

from __future__ import annotations

from pathlib import Path


def _vec(v) -> str:
    return "(" + ", ".join(f"{float(x):.4g}" for x in v) + ")" if v is not None else "none"


def _ci(mean: float, ci) -> str:
    return f"{mean:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]"


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


def audit_lines(path: Path, audit: dict) -> list[str]:
    from lara.constraints.audit import edited_verdicts
    from lara.read.files import DataError

    edited = edited_verdicts(audit)
    if edited:
        raise DataError(f"{path}: {edited[0]}: edited after lara audit-constraints wrote it; rerun the audit")
    lines = ["", f"held-out audit ({path}): each constraint's decoding cost (tau's units; a probability constraint's "
                 "rate with its Clopper-Pearson interval) and each judge's mean score"]
    joint = {(j["method"], j["setting"]): j["verdict"].split(" (")[0] for j in audit.get("joint") or []}
    for r in audit["rows"]:
        judges = "".join(f"; {r[f'judge{j}']} {_ci(r[f'judge{j}_mean'], r[f'judge{j}_ci95'])}"
                         for j in range(8) if f"judge{j}" in r)
        lines.append(f"  {r['method']:5} {r['setting']:18} {r['constraint']:10} {_ci(r['mean_cost'], r['ci95'])} vs "
                     f"tau {r['tau']:g}: {r['verdict'].split(' (')[0]}{judges}; joint "
                     f"{joint.get((r['method'], r['setting']), '?')}")
    judged = audit.get("judges")
    if not judged:
        return lines
    lines += ["", "  against lambda = 0 (paired on the test prompts; lower is better): the decoding scorer and each "
                  "judge"]
    lost = []
    for row in judged["paired"]:
        for j in row["judges"]:
            lines.append(f"    {row['method']:5} {row['setting']:18} {row['constraint']:10} scorer "
                         f"{_ci(row['scorer']['mean'], row['scorer']['ci95'])}; {j['judge']} "
                         f"{_ci(j['mean'], j['ci95'])}: {j['verdict']}")
            if j["verdict"] == "does not carry":
                lost.append(f"{row['method']} at {row['setting']} on {row['constraint']} ({j['judge']})")
    if lost:
        lines.append("  The scorer's improvement does NOT carry to the judge for: " + "; ".join(lost))
    if judged.get("note"):
        lines.append(f"  note: {judged['note']}")
    for a in judged["agreement"]:
        said = (f"undefined ({a['undefined']})" if "undefined" in a else
                f"Spearman {_ci(a['spearman'], a['spearman_ci'])}, top decile "
                f"{_ci(a['top_decile'], a['top_decile_ci'])}")
        lines.append(f"  agreement of {a['constraint']}'s scorer and {a['judge']} on {a['n']} responses: {said}")
    return lines


def coverage_lines(path: Path, cov: dict) -> list[str]:
    lines = ["", f"coverage study ({path}): per procedure and calibration size n, over {cov['summary'][0]['repeats']} "
                 "draws: the joint violation rate, the share of draws certified (LTT) and the reward given up",
             f"  {'procedure':9} {'n':>5}  {'violation [95% CI]':>24}  {'certified':>9}  {'reward given up':>15}"]
    for r in cov["summary"]:
        given = "" if r.get("reward_given_up") is None else f"{r['reward_given_up']:15.4f}"
        rate = _ci(r["violation_rate"], [r["violation_lo"], r["violation_hi"]])
        lines.append(f"  {r['procedure']:9} {r['n']:5d}  {rate:>24}  {1 - r['infeasible_rate']:9.3f}  {given:>15}")
    return lines


def constraints_lines(root: Path) -> list[str]:
    """Nothing when the run has no constraints stage; otherwise its record, audit and coverage study."""
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
