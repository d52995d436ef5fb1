"""The audit of the decoded outputs (``lara audit-constraints``) that ``lara figure --kind constraints_sweep`` draws,
read and checked against the vector record and the held-out test prompts' scored Best-of-N candidates
(:func:`lara.evaluate.figures.vector.read_vector_inputs`)."""

from __future__ import annotations

import numpy as np


def _close(a, b) -> bool:
    try:
        return len(a) == len(b) and bool(np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float),
                                                     rtol=1e-9, atol=1e-12))
    except (TypeError, ValueError):
        return False


def _audit_belongs(audit: dict, where: str, lambda_json: str, record: dict, prompts) -> dict:
    """The audit's identity against the record (its digest, constraints, taus, lambda*) and the candidates'
    prompts; its rows (the dict ones)."""
    from lara import identity
    from lara.read.files import DataError

    names = list(record["names"])
    made = audit.get(identity.KEY) or {}
    rows = [r for r in audit.get("rows") or [] if isinstance(r, dict)]
    problems = []
    if made.get("kind") not in (None, "audit_constraints"):
        problems.append(f"kind {made['kind']!r}, expected audit_constraints")
    digest = identity.file_digest(lambda_json)
    if made.get("lambda_record") not in (None, digest):
        problems.append(f"it was made with another lambda record (digest {made['lambda_record']}, {lambda_json}: "
                        f"{digest})")
    listed = [c.get("name") for c in audit.get("constraints") or [] if isinstance(c, dict)] or None
    in_rows = sorted({str(r.get("constraint")) for r in rows}) or None
    for what, got, want in (("identity names", made.get("names"), names), ("constraints", listed, names),
                            ("rows", in_rows, sorted(names))):
        if got is not None and list(got) != want:
            problems.append(f"its {what} name the constraints {list(got)}, the record's are {names}")
    for what, got, want in (("tau", made.get("tau"), record["tau"]),
                            ("lambda_star", audit.get("lambda_star"), record["lambda_star"])):
        if got is not None and want is not None and not _close(got, want):
            problems.append(f"its {what} is {got}, the record's {want}")
    if problems:
        raise DataError(f"{where}: does not belong to --lambda-json {lambda_json}: {'; '.join(problems)}")
    audited = (made.get("prompts") or {}).get("digest")
    if audited is not None and audited != prompts.digest:
        raise DataError(f"{where}: audited on other test prompts ({(made.get('prompts') or {}).get('n')} prompts, "
                        f"digest {audited}) than --scores covers ({prompts.n}, digest {prompts.digest}): the figure "
                        "would set one pool's audit beside another pool's candidates")
    return rows


def _audited_outputs(rows: list[dict], where: str, m: int, n_prompts: int) -> dict:
    """The audit's rows grouped by output (method, setting): each row's finite numbers and lambda checked, one row
    per constraint, on ``n_prompts`` test prompts."""
    import json

    from lara.read.files import DataError

    outputs: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (str(r.get("method")), str(r.get("setting")))
        at = f"{where}: row {key[0]}/{key[1]}/{r.get('constraint')}"
        values = [r.get("mean_cost"), *(r.get("ci95") or []), r.get("mean_reward"), *(r.get("reward_ci95") or [])]
        if len(values) != 6 or not all(isinstance(v, int | float) and np.isfinite(v) for v in values):
            raise DataError(f"{at} lacks a finite mean cost, mean reward or 95% interval")
        try:
            lam = r.get("lambda")
            lam = [float(x) for x in (json.loads(lam) if isinstance(lam, str) else lam)]
        except (TypeError, ValueError):
            lam = None
        if lam is None or len(lam) != m or not all(np.isfinite(x) and x >= 0 for x in lam):
            raise DataError(f"{at}: lambda {r.get('lambda')!r} is not {m} finite numbers >= 0")
        out = outputs.setdefault(key, {"method": key[0], "setting": key[1], "lambda": lam, "rows": {}})
        if not _close(out["lambda"], lam) or r["constraint"] in out["rows"]:
            raise DataError(f"{at}: the output is given twice (another row for this constraint or another lambda)")
        if r.get("n_prompts") is not None and int(r["n_prompts"]) != n_prompts:
            raise DataError(f"{at}: audited on {int(r['n_prompts'])} test prompts, but --scores covers {n_prompts} "
                            "(another test pool)")
        out["rows"][r["constraint"]] = r
    if not outputs:
        raise DataError(f"{where}: no audited output (rows); nothing to draw")
    return outputs


def read_sweep_audit(path: str, lambda_json: str, record: dict, prompts) -> dict:
    """audit.json (``lara audit-constraints``) for the vector record: made with ``lambda_json`` (its identity's
    ``lambda_record``, :func:`lara.identity.file_digest`), for the record's constraints (identity, ``constraints``
    and rows) and taus, its lambda* the record's, on the candidates' prompts (``prompts``, a
    :class:`lara.identity.PromptSet`, against the digest its identity names); every output one row per constraint
    with a finite mean and 95 % interval of cost and reward, audited on as many test prompts as the candidates
    cover, at the record's own lambda of its setting. The outputs in the audit's order, their rows in the
    constraints' order, and the joint verdicts."""
    from lara import identity
    from lara.constraints.decode import SETTINGS, resolve_vector
    from lara.read.files import DataError, json_file

    where = f"--audit {path}"
    audit = json_file(path, where, mapping=False)  # any other top level is refused below, as not an audit
    if not isinstance(audit, dict):
        raise DataError(f"{where}: not a constraint audit (a JSON object of lara audit-constraints)")
    names, m = list(record["names"]), len(record["names"])
    rows = _audit_belongs(audit, where, lambda_json, record, prompts)
    outputs = _audited_outputs(rows, where, m, prompts.n)
    for (method, which), out in outputs.items():
        if which in SETTINGS:
            want = resolve_vector(which, record, m, lambda_json)
            if not _close(out["lambda"], want):
                raise DataError(f"{where}: {method}/{which} was audited at lambda {out['lambda']}, the record's "
                                f"{which} is {want}: decoded with another record")
        out["rows"] = [out["rows"][name] for name in names]
    joint = {(str(j.get("method")), str(j.get("setting"))): j for j in audit.get("joint") or [] if isinstance(j, dict)}
    made = audit.get(identity.KEY) or {}
    return {"outputs": list(outputs.values()), "joint": joint, "procedure": audit.get("procedure"),
            "lambda_record": made.get("lambda_record")}
