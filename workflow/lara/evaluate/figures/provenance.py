"""What a figure shows, for its provenance sidecar and its PNG/PDF metadata: read from its inputs and the records of
the jobs that made them (never from the configuration)."""

from __future__ import annotations

import pandas as pd


def _sampled_and_scored(records: dict[str, dict], scores_suffix: str, several: bool = False) -> dict:
    """Policy, N and scorers behind a scored sample table (``{pool}/scores.parquet``; ``several``: one cost model
    per constraint, the constraints stage's tables)."""
    scored = next((rec for path, rec in records.items() if path.endswith(scores_suffix)), {})
    sampled = records.get(scored.get("input"), {})
    costs = {"cost_models": scored.get("costs") or {}} if several else {"cost_model": scored.get("cost", "unknown")}
    return {"policy": sampled.get("model", "unknown"), "n": sampled.get("n"),
            "reward_model": scored.get("reward", "unknown"), **costs}


def describe(kind: str, trail: list[dict], lam: dict | None = None, summary: pd.DataFrame | None = None) -> dict:
    """What a figure shows, read from its inputs and the records of the jobs that made them (never
    from the configuration): the policy and scorers behind the data, N, tau, lambda-hat, lambda*."""
    records = {e["path"]: e["lara"] for e in trail if isinstance(e.get("lara"), dict)}  # the steps' own, by path
    shows: dict = {"kind": kind}
    if lam is not None:
        shows |= {"tau": lam["tau"], "lambda_hat": round(lam["lambda_hat"], 4),
                  "lambda_star": round(lam["lambda_star"], 4), "calibration_mode": lam.get("mode"),
                  "beta": lam.get("beta"), "calibration_prompts": lam.get("n_prompts"),
                  "bootstrap_replicates": lam.get("bootstrap", {}).get("replicates"),
                  "quantile": lam.get("bootstrap", {}).get("quantile")}
        shows["calibrated_on"] = _sampled_and_scored(records, "/calibration/scores.parquet")
    if kind == "lambda_sweep":
        shows["best_of_n"] = _sampled_and_scored(records, "/bon/scores.parquet")
    if kind in ("constraints", "constraints_sweep"):
        pool = "calibration_scores.parquet" if kind == "constraints" else "bon_scores.parquet"
        shows["constraint_scores"] = _sampled_and_scored(records, pool, several=True)
    if summary is not None:
        shows["rows"] = [f"{m}/{s}" for m, s in zip(summary["method"], summary["setting"], strict=True)]
        scorers = {(rec.get("reward"), rec.get("cost")) for path, rec in records.items()
                   if "/eval/" in path and path.endswith("/scores.parquet")}
        shows["evaluation"] = [{"reward_model": r, "cost_model": c} for r, c in sorted(scorers, key=str)]
        judges = {rec.get("judge") for path, rec in records.items() if path.endswith("/judge.parquet")}
        shows["judge"] = sorted(str(j) for j in judges if j) or None
    return shows


def summary_line(shows: dict) -> str:
    """One sentence of what a figure shows, for its PNG/PDF metadata."""
    parts = [f"{shows['kind']}"]
    for key in ("best_of_n", "calibrated_on"):
        if key in shows:
            d = shows[key]
            parts.append(f"{key.replace('_', ' ')}: policy {d['policy']} (N = {d['n']}), "
                         f"scorers {d['reward_model']} / {d['cost_model']}")
    if "constraints" in shows:
        cons = ", ".join(f"{c['name']} (tau = {c['tau']:g})" for c in shows["constraints"])
        if shows["kind"] == "constraints_sweep":
            marks = ", ".join(f"{k} {p['lambda']} (s = {p['s']}): held-out cost {p['cost']}"
                              for k, p in shows["marks"].items())
            audited = ", ".join(f"{a['method']}/{a['setting']} joint {a['joint']}" for a in shows["audited"])
            parts.append(f"Best-of-{shows['n']} along the ray d = {shows['direction']} for {cons} on "
                         f"{shows['test_prompts']} test prompts: {marks}; audited {audited}; deployed "
                         f"{shows['deployed']}")
            scored = "candidates: policy {policy} (N = {n})"
        else:
            procs = ", ".join(f"{k} {p['lambda']}" for k, p in shows["procedures"].items())
            parts.append(f"Best-of-{shows['n']} with a vector lambda for {cons} on {shows['calibration_prompts']} "
                         f"calibration prompts ({shows['view']}): {procs}; deployed {shows['deployed']}")
            scored = "scored: policy {policy} (K = {n})"
        d = shows.get("constraint_scores")
        if d:
            costs = ", ".join(f"{k} {v}" for k, v in d["cost_models"].items())
            parts.append(f"{scored.format(**d)}, reward {d['reward_model']}, costs {costs}")
    if "scenarios" in shows:
        parts.append(f"after deployment (tau = {shows['tau']:g}): scenarios {', '.join(shows['scenarios'])}; "
                     f"arms {', '.join(shows['arms'])}")
    if "lambda_hat" in shows:
        parts.append(f"tau = {shows['tau']:g}, lambda-hat = {shows['lambda_hat']}, lambda* = {shows['lambda_star']}"
                     f" ({shows['calibration_mode']} calibration)")
    for ev in shows.get("evaluation", []):
        parts.append(f"evaluated by {ev['reward_model']} / {ev['cost_model']}")
    return "; ".join(parts)
