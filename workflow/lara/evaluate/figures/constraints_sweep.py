"""``lara figure --kind constraints_sweep``: Fig. 1 per constraint for the vector lambda, on the held-out test
prompts, every audited output (``lara audit-constraints``) at the s of its lambda; what it draws in full:
:func:`constraints_sweep`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lara.evaluate.figures.common import MARKERS, Drawn, FigureSettings, key, log, panels
from lara.evaluate.figures.vector import RAY_POINTS, RayView, on_ray, plot_end, r4, read_vector_inputs, search_max, vec
from lara.stats import VERDICTS

SWEEP_MARKERS = MARKERS | {"soft": "X", "bootstrap": "P", "ltt": "s"}  # an audited setting's marker
METHOD_NAMES = {"bon": "Best-of-N", "args": "ARGS"}


def held_out(scores, lams) -> tuple[np.ndarray, np.ndarray]:
    """The Best-of-N decoder on the test candidates at each vector lambda of ``lams`` (L, m): the mean over the
    prompts of the reward (L,) and cost vector (L, m) of the candidate ``lara decode-vector --method bon`` picks
    (:func:`lara.constraints.decode.select_vector`)."""
    from lara.constraints.decode import select_vector

    rows = np.arange(scores.n_prompts)
    reward, costs = [], []
    for lam in np.atleast_2d(np.asarray(lams, dtype=float)):
        pick = select_vector(scores.reward, scores.costs, lam)
        reward.append(scores.reward[rows, pick].mean())
        costs.append(scores.costs[rows, pick].mean(axis=0))
    return np.asarray(reward), np.asarray(costs).reshape(-1, scores.costs.shape[2])


def _along(lam, d: np.ndarray) -> tuple[float, bool]:
    """A lambda's place along the ray s d: s = max(lambda) / max(d), and whether lambda is s d."""
    lam = np.asarray(lam, dtype=float)
    s = float(lam.max() / d.max())
    return s, on_ray(lam, s, d)


@dataclass(frozen=True)
class SweepView(RayView):
    """What the constraints_sweep figure draws, computed once: the record (:class:`~.vector.RayView`), the held-out
    Best-of-N decoder along the ray (the curve: s, mean reward, mean cost vector), lambda-hat and lambda* (s, on the
    ray or not, the decoder there), the audited outputs at their s, and the checks that tie them together."""

    curve: dict
    marks: dict[str, dict]
    audited: list[dict]
    checks: dict


def sweep_view(record: dict, scores, audit: dict) -> SweepView:
    """The record's ray on the test candidates. The curve is the decoder's own pick (:func:`held_out`) at every s
    of a grid of RAY_POINTS on [0, s_max], every breakpoint of the exact path (:func:`lara.calibrate.vector.
    ray_path`: the expected Best-of-N cost with n = N, which with exactly N candidates per prompt is the pick's)
    and every marked s on the ray, so the step curve is exact between them; s_max is twice the larger s of
    lambda-hat and a feasible lambda*, capped at calibration.lambda_search_max (an uncertified LTT sits at the cap).
    Checks: the pick against the exact path at its breakpoints, and each audited Best-of-N output's mean cost
    against the pick at its lambda (equal when the audit's cost scorers are the candidates')."""
    from lara.calibrate.vector import meets, ray_path

    fields = RayView.fields(record, scores.n_prompts)
    tau, n, d, deployed = fields["tau"], fields["n"], fields["direction"], fields["deployed"]
    marks = {}
    for mark, field in (("hat", "lambda_hat"), ("star", "lambda_star")):
        if record.get(field) is not None:
            (s, on), (r, c) = _along(record[field], d), held_out(scores, record[field])
            marks[mark] = {"lambda": np.asarray(record[field], dtype=float), "s": s, "on_ray": on,
                           "reward": float(r[0]), "cost": c[0], "meets_tau": bool(meets(c[0], tau))}
    audited = []
    for out in audit["outputs"]:
        s, on = _along(out["lambda"], d)
        rows = out["rows"]
        audited.append({"method": out["method"], "setting": out["setting"], "lambda": np.asarray(out["lambda"]),
                        "s": s, "on_ray": on, "cost": np.array([r["mean_cost"] for r in rows]),
                        "ci95": np.array([r["ci95"] for r in rows], dtype=float),
                        "verdicts": [r["verdict"] for r in rows], "reward": float(rows[0]["mean_reward"]),
                        "reward_ci95": [float(x) for x in rows[0]["reward_ci95"]],
                        "joint": audit["joint"].get((out["method"], out["setting"])) or {},
                        "judges": judge_points(rows),
                        "exact": any(r.get("interval") == "clopper_pearson" for r in rows)})
    cap = search_max(record, [p["lambda"] for p in (record.get("procedures") or {}).values()
                               if p.get("lambda") is not None]) / float(d.max())
    feasible_star = bool(((record.get("procedures") or {}).get(deployed) or {}).get("feasible", True))
    wanted = [marks[k]["s"] for k in marks if k == "hat" or feasible_star]
    s_top = plot_end(cap, wanted)
    path = ray_path(scores.reward, scores.costs, scores.mask, d, n, s_top)
    on_ray = [p["s"] for p in (*marks.values(), *audited) if p["on_ray"] and p["s"] <= s_top]
    s = np.union1d(np.union1d(np.linspace(0.0, s_top, RAY_POINTS), path.s), on_ray)
    reward, costs = held_out(scores, s[:, None] * d[None, :])
    exact_gap = float(np.abs(costs[np.searchsorted(s, path.s)] - path.mean).max())
    gaps = [float(np.abs(a["cost"] - held_out(scores, a["lambda"])[1][0]).max())
            for a in audited if a["method"] == "bon"]
    checks = {"pick_vs_exact_path": exact_gap, "bon_audit_vs_pick": max(gaps) if gaps else None}
    if exact_gap > 1e-9:
        log.warning("the decoder's pick differs from the exact expected Best-of-%d path by %.3g (ties?)", n, exact_gap)
    return SweepView(**fields, curve={"s": s, "reward": reward, "costs": costs, "s_max": s_top,
                                      "breakpoints": len(path.s) - 1}, marks=marks, audited=audited, checks=checks)


def judge_points(rows: list[dict]) -> dict[str, dict]:
    """An audited output's judge scores (``evaluation.judges``), one panel each: ``judge`` when every constraint
    gave the judge the same responses and got the same mean (a judge that ignores the role), else ``judge (name)``
    per constraint; each with its mean and 95 % interval."""
    out: dict[str, dict] = {}
    j = 0
    while f"judge{j}" in rows[0]:
        spec = str(rows[0][f"judge{j}"])
        per = [(r["constraint"], float(r[f"judge{j}_mean"]), [float(x) for x in r[f"judge{j}_ci95"]]) for r in rows]
        if all(np.isclose(m, per[0][1], rtol=1e-12, atol=1e-15) for _, m, _ in per):
            out[spec] = {"mean": per[0][1], "ci95": per[0][2]}
        else:
            out |= {f"{spec} ({name})": {"mean": m, "ci95": ci} for name, m, ci in per}
        j += 1
    return out


def _short(verdict: str | None) -> str:
    return str(verdict).split(" (", 1)[0] if verdict else "not audited"


def _sweep_handles(view: SweepView, colour: dict, lines: dict) -> list:
    """The legend of :func:`constraints_sweep`: the curve, tau, lambda-hat and lambda*, every audited output."""
    m, s_top = len(view.names), view.curve["s_max"]
    handles = [key(color="0.3", lw=1.6, label=f"Best-of-{view.n} on the test candidates: the pick at each s (exact)"),
               key(color="black", ls="--", lw=1.0, label="$\\tau$")]
    for mark, title in (("hat", "$\\hat\\lambda$"), ("star", "$\\lambda^*$")):
        if mark in view.marks:
            p = view.marks[mark]
            extra = f", {view.deployed}: deployed" if mark == "star" and view.deployed else ""
            where = "off the ray, " if not p["on_ray"] else ""
            at = f"{where}s = {p['s']:.3g}{extra}" if m > 1 else extra[2:]
            value = vec(p["lambda"]) if m > 1 else f"{p['lambda'][0]:.3g}"
            handles.append(key(**lines[mark], label=f"{title} = {value}" + (f" ({at})" if at else "")))
    for a in view.audited:
        where = "" if a["on_ray"] else ", off the ray"
        where += f", s = {a['s']:.3g} beyond the plot" if a["s"] > s_top * (1 + 1e-9) else ""
        handles.append(key(color=colour[a["method"]], marker=SWEEP_MARKERS.get(a["setting"], "o"), ls="",
                           label=f"{METHOD_NAMES.get(a['method'], a['method'])} {a['setting']}: $\\lambda$ = "
                                 f"{vec(a['lambda'])}{where}; joint {_short(a['joint'].get('verdict'))}"))
    handles += [key(color="0.3", marker="o", ls="", label="audited: meets $\\tau$ (one-sided 95%; reward panel: "
                                                          "every $\\tau$ at once)"),
                key(color="0.3", marker="o", ls="", mfc="white", label="audited: not shown to meet")]
    return handles


def constraints_sweep(view: SweepView, opts: FigureSettings):
    """Fig. 1 per constraint for the vector lambda, on the held-out test prompts: one panel per constraint of the
    Best-of-N decoder's mean cost along the ray lambda = s d (the candidate it picks at each s, exact between the
    drawn points), its tau dashed, and one of its mean reward; lambda-hat and the deployed lambda* as vertical
    lines; every audited output (Best-of-N and ARGS at each setting) at the s of its lambda with its bootstrap
    95 % interval, filled where the audit's verdict is met (the reward panel: the joint verdict), marked off the
    ray where its lambda is not s d."""
    import textwrap

    import matplotlib.pyplot as plt
    from matplotlib.transforms import ScaledTranslation

    m = len(view.names)
    c = view.curve
    s, s_top = c["s"], c["s_max"]
    methods = list(dict.fromkeys(a["method"] for a in view.audited))
    judges = list(dict.fromkeys(k for a in view.audited for k in a["judges"]))
    width = m + 1 + len(judges)
    pal, fig, axes = panels(opts, 1, width, figsize=(max(opts.width, 2.8 * width), opts.height + 1.8), sharex=True)
    colour = {meth: pal[(m + 1 + i) % len(pal)] for i, meth in enumerate(methods)}
    # methods side by side at one s (a few points apart on the page; the data positions stay exact)
    shift = {meth: ScaledTranslation((i - (len(methods) - 1) / 2) * 4 / 72, 0, fig.dpi_scale_trans)
             for i, meth in enumerate(methods)}
    curves = [(axes[j], c["costs"][:, j], f"{name}: $\\tau$ = {tau:g}", "held-out mean cost", name)
              for j, (name, tau) in enumerate(zip(view.names, view.tau, strict=True))]
    curves.append((axes[m], c["reward"], "reward", "held-out mean reward", "reward"))
    lines = {"hat": {"color": "grey", "lw": 1.2, "ls": "-"}, "star": {"color": "black", "lw": 1.5, "ls": "-."}}
    # the direction in every panel's label, wrapped to the panel's width (about half a font size per character)
    room = int(0.8 * fig.get_figwidth() / (m + 1) * 72 / (0.5 * plt.rcParams["font.size"]))
    named = ", ".join(f"{name} {x:.3g}" for name, x in zip(view.names, view.direction, strict=True))
    xlabel = "$\\lambda$" if m == 1 else textwrap.fill(f"s ($\\lambda$ = s d), d = ({named})", max(room, 16))
    for j, (ax, y, title, ylabel, gid) in enumerate(curves):
        ax.plot(s, y, drawstyle="steps-post", color=pal[j] if j < m else "0.3", lw=1.6, zorder=3, gid=f"curve:{gid}")
        if j < m:
            ax.axhline(view.tau[j], color="black", ls="--", lw=1.0)
        for mark, style in lines.items():
            if mark in view.marks:
                ax.axvline(min(view.marks[mark]["s"], s_top), zorder=2, **style)
        values = [(a["cost"][j], a["ci95"][j], a["verdicts"][j] == VERDICTS[0]) if j < m else
                  (a["reward"], a["reward_ci95"], a["joint"].get("verdict") == VERDICTS[0]) for a in view.audited]
        span = _audited(ax, view, values, "audit:", colour, shift)
        _frame(ax, [float(np.min(y)), float(np.max(y)), *([view.tau[j]] if j < m else []), *span], title, ylabel,
               s_top, xlabel)
    for ax, judge in zip(axes[m + 1:], judges, strict=True):  # a judge the decoder never saw: no curve
        values = [(a["judges"][judge]["mean"], a["judges"][judge]["ci95"], False) if judge in a["judges"] else None
                  for a in view.audited]
        span = _audited(ax, view, values, f"judge:{judge}:", colour, shift, notes=False)
        _frame(ax, span, f"judge {judge}\n(never seen by the decoder)", "held-out mean judge score", s_top, xlabel)
    handles = _sweep_handles(view, colour, lines)
    along = "against $\\lambda$" if m == 1 else "along the ray"
    rates = " (rates: Clopper-Pearson)" if any(a.get("exact") for a in view.audited) else ""
    fig.suptitle(f"Best-of-{view.n} {along}, held out ({view.n_prompts} test prompts; audit: bootstrap 95%{rates})")
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False, fontsize="small")
    return fig


def _audited(ax, view: SweepView, values: list, gid: str, colour: dict, shift: dict, notes: bool = True) -> list:
    """Each audited output's value in this panel (``values``, one per output: mean, 95 % interval, met; None: not in
    this panel) at the s of its lambda with its interval, filled where met; ``notes``: an output off the ray or
    beyond the plot is marked so (a star drawn larger). The interval ends drawn."""
    span, s_top = [], view.curve["s_max"]
    for a, got in zip(view.audited, values, strict=True):
        if got is None:
            continue
        y0, (lo, hi), met = got
        beyond, x, col = a["s"] > s_top * (1 + 1e-9), min(a["s"], s_top), colour[a["method"]]
        ax.errorbar(x, y0, yerr=[[y0 - lo], [hi - y0]], fmt=SWEEP_MARKERS.get(a["setting"], "o"), color=col,
                    ms=9 if notes and a["setting"] == "star" else 6, capsize=2, lw=0.8, mew=1.4, zorder=5,
                    clip_on=False, mfc=col if met else "white", transform=ax.transData + shift[a["method"]],
                    gid=f"{gid}{a['method']}/{a['setting']}")
        if notes and (beyond or not a["on_ray"]):
            note = ("off the ray" if not a["on_ray"] else "") + (f" s = {a['s']:.3g} →" if beyond else "")
            ax.annotate(note.strip(), (x, y0), textcoords="offset points", xytext=(-4, 6), ha="right",
                        fontsize="x-small", color=col)
        span += [lo, hi]
    return span


def _frame(ax, span: list[float], title: str, ylabel: str, s_top: float, xlabel: str) -> None:
    """A panel's range, by hand (the shifted error bars are not in data coordinates, so autoscaling leaves them out),
    title and labels."""
    pad = 0.06 * (max(span) - min(span) or 1.0)
    ax.set(ylim=(min(span) - pad, max(span) + pad), title=title, ylabel=ylabel, xlim=(0.0, s_top), xlabel=xlabel)


def sweep_shows(view: SweepView, audit: dict) -> dict:
    """What the constraints_sweep figure shows, for its provenance sidecar and report caption."""
    marks = {k: {"lambda": r4(p["lambda"]), "s": round(p["s"], 4), "on_ray": p["on_ray"], "cost": r4(p["cost"]),
                 "reward": round(p["reward"], 4), "meets_tau": p["meets_tau"]} for k, p in view.marks.items()}
    audited = [{"method": a["method"], "setting": a["setting"], "lambda": r4(a["lambda"]), "s": round(a["s"], 4),
                "on_ray": a["on_ray"], "cost": r4(a["cost"]), "ci95": [r4(ci) for ci in a["ci95"]],
                "verdicts": [_short(v) for v in a["verdicts"]], "reward": round(a["reward"], 4),
                "joint": _short(a["joint"].get("verdict")),
                "judges": {k: {"mean": round(v["mean"], 4), "ci95": r4(v["ci95"])} for k, v in a["judges"].items()}}
               for a in view.audited]
    return view.shows() | {
            "test_prompts": view.n_prompts, "marks": marks, "audited": audited,
            "ray": {"s_max": round(float(view.curve["s_max"]), 4), "points": len(view.curve["s"]),
                    "breakpoints": int(view.curve["breakpoints"])},
            "checks": view.checks, "audit": {"procedure": audit.get("procedure"),
                                             "lambda_record": audit.get("lambda_record")}}


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


def figure(args, opts: FigureSettings, lam: dict | None) -> Drawn:
    """The vector --lambda-json for --constraints, the test prompts' --scores and the --audit of the decoded outputs
    (:func:`~lara.evaluate.figures.vector.read_vector_inputs`, :func:`read_sweep_audit`), drawn; what the figure
    shows (:func:`sweep_shows`)."""
    record, scores = read_vector_inputs(args.lambda_json, args.scores, args.constraints, held_out=True)
    audit = read_sweep_audit(args.audit, args.lambda_json, record, scores.prompts)
    view = sweep_view(record, scores, audit)
    return Drawn(constraints_sweep(view, opts), sweep_shows(view, audit))
