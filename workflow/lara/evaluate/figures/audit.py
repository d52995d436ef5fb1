"""The evaluation's constraint audit (``lara aggregate``'s constraint_audit.json) as the decoders and taus figures
read it."""

from __future__ import annotations


def read_audit(path: str, lambda_json: str | None = None) -> dict:
    """constraint_audit.json with at least one decoder row, every number in them finite, made with ``lambda_json``
    (lara.identity.audit_disagreements)."""
    import math

    from lara.calibrate.record import read_lambda
    from lara.identity import audit_disagreements
    from lara.read.files import DataError, json_file

    audit = json_file(path)
    problems = audit_disagreements(audit, read_lambda(lambda_json)) if lambda_json else []
    if problems:
        raise DataError(f"--audit {path}: does not belong to --lambda-json {lambda_json}: {'; '.join(problems)}")
    rows = [r for r in audit.get("decoders") or [] if r.get("setting") != "policy"]
    if not rows:
        raise DataError(f"{path}: no decoder scored by the decoding models (decoders); nothing to draw")
    for r in rows:
        values = [r.get("lambda"), r.get("mean_cost"), r.get("mean_reward"), *r.get("ci95", []),
                  *r.get("reward_ci95", [])]
        if len(values) != 7 or not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
            raise DataError(f"{path}: decoder row {r.get('method')}/{r.get('setting')} lacks a finite lambda, "
                            "mean or interval")
    return audit
