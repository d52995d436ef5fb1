"""``lara figure --kind constraints``: several constraints at once (``lara calibrate-vector``) on the calibration
prompts: the feasible region of the vector lambda (two constraints), else each constraint's cost along the ray
searched; what it draws in full: :func:`constraints`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lara.evaluate.figures.common import Drawn, FigureSettings, key, panels, theme
from lara.evaluate.figures.vector import RAY_POINTS, RayView, on_ray, plot_end, r4, read_vector_inputs, search_max, vec

GRID_POINTS = 61  # points per axis of the feasible-region grid (two constraints)
SHADE = "green"  # where every constraint is met


# marker and name of each procedure of the vector record, in legend order (then any other, then the brute force)
PROCEDURES = {"hat": ("v", "$\\hat\\lambda$"), "bootstrap": ("*", "bootstrap $\\lambda^*$"), "crc": ("D", "CRC"),
              "ltt": ("s", "LTT"), "ltt_wsr": ("^", "LTT (betting)"), "soft": ("X", "soft dual"),
              "brute_force": ("P", "brute-force best")}


def mean_expected(scores, lams, n: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The exact mean over the prompts of the expected Best-of-n reward (L,) and cost vector (L, m) at each vector
    lambda of ``lams`` (L, m): :func:`lara.calibrate.vector.expected_vector`'s ranking r - lam.c (ties to the lower
    lam.c), with the reward averaged at the same choice."""
    from lara.calibrate.vector import columns, expected_at

    r, c, mask = scores.reward, scores.costs, scores.mask
    out = np.stack([expected_at(r, c, mask, lam, n, r, *columns(c)).mean(axis=1)
                    for lam in np.atleast_2d(np.asarray(lams, dtype=float))])
    return out[:, 0], out[:, 1:]


@dataclass(frozen=True)
class ConstraintGrid:
    """Two constraints on a grid over [0, top]^2; every array indexed [i2, i1] at lambda = (axis[i1], axis[i2])
    (matplotlib's contour layout)."""

    axis: np.ndarray  # (G,)
    reward: np.ndarray  # (G, G) mean expected Best-of-n reward
    costs: np.ndarray  # (G, G, m) mean expected Best-of-n cost of each constraint
    feasible: np.ndarray  # (G, G) every constraint's mean cost <= its tau

    @property
    def lambdas(self) -> tuple[np.ndarray, np.ndarray]:
        return np.meshgrid(self.axis, self.axis)


def constraint_grid(scores, tau, n: int | None, top: float, points: int = GRID_POINTS) -> ConstraintGrid:
    """Each grid point's exact mean expected Best-of-n reward and cost vector on the scores (one
    :func:`mean_expected` per point), and where every constraint is met."""
    from lara.calibrate.vector import meets

    axis = np.linspace(0.0, float(top), points)
    l1, l2 = np.meshgrid(axis, axis)
    reward, costs = mean_expected(scores, np.stack([l1.ravel(), l2.ravel()], axis=1), n)
    return ConstraintGrid(axis, reward.reshape(l1.shape), costs.reshape(*l1.shape, -1),
                          meets(costs, tau).reshape(l1.shape))


@dataclass(frozen=True)
class ConstraintView(RayView):
    """What the constraints figure draws, computed once: the record (:class:`~.vector.RayView`), each procedure's
    lambda with its exact mean reward and costs (and s, its position along the direction), and the feasible-region
    grid (two constraints) or the path along the direction (any other m)."""

    k: int
    procedures: dict[str, dict]
    grid: ConstraintGrid | None = None
    ray: dict | None = None


def constraint_view(record: dict, scores, points: int = GRID_POINTS) -> ConstraintView:
    """The vector record read against the calibration scores it was made from (:mod:`lara.constraints.calibrate`).
    The plotted range: the record's brute-force square (two constraints), else twice the largest lambda (s) of
    the procedures that found a feasible one (an uncertified LTT sits at the end of the search), capped at
    calibration.lambda_search_max, as the calibration sizes its brute-force check."""
    from lara.calibrate.bestofn import expected
    from lara.calibrate.vector import columns, combined, meets

    m = scores.costs.shape[2]
    fields = RayView.fields(record, scores.n_prompts)
    tau, n, d = fields["tau"], fields["n"], fields["direction"]
    found = {name: p for name, p in record["procedures"].items() if p.get("lambda") is not None}
    best = (record.get("brute_force") or {}).get("best")
    if m == 2 and best:
        found["brute_force"] = {"lambda": best["lambda"], "feasible": True}
    order = [k for k in PROCEDURES if k in found and k != "brute_force"]
    order += [k for k in found if k not in PROCEDURES] + (["brute_force"] if "brute_force" in found else [])
    lams = np.array([found[k]["lambda"] for k in order], dtype=float).reshape(len(order), m)
    reward, costs = mean_expected(scores, lams, n) if len(order) else (np.empty(0), np.empty((0, m)))
    procedures = {}
    for i, name in enumerate(order):
        lam = lams[i]
        s = float(lam @ d / (d @ d))
        procedures[name] = {"lambda": lam, "feasible": bool(found[name].get("feasible", True)), "reward": reward[i],
                            "cost": costs[i], "meets_tau": bool(meets(costs[i], tau)), "s": s,
                            "on_ray": on_ray(lam, s, d)}
    good = [p for k, p in procedures.items() if p["feasible"] and k != "brute_force"]
    cap = search_max(record, lams)
    common = fields | {"k": int(record["decoder"].get("k") or n), "procedures": procedures}
    if m == 2:
        top = (record.get("brute_force") or {}).get("top")
        if top is None:
            top = plot_end(cap, [float(p["lambda"].max()) for p in good])
        return ConstraintView(**common, grid=constraint_grid(scores, tau, n, float(top), points))
    s_top = plot_end(cap / float(d.max()), [p["s"] for p in good])
    s = np.union1d(np.linspace(0.0, s_top, RAY_POINTS), [p["s"] for p in procedures.values() if 0 <= p["s"] <= s_top])
    along = expected(scores.reward, combined(scores.costs, d), scores.mask, s, n, scores.reward,
                     *columns(scores.costs)).mean(axis=1)  # (1 + m, L)
    return ConstraintView(**common, ray={"s": s, "reward": along[0], "costs": along[1:].T, "s_max": s_top,
                                         "feasible": meets(along[1:].T, tau)})


# marker size and layer: the soft dual's lambda (large, behind) and lambda-hat often all but coincide, the
# brute-force best sits near them; each stays visible
LAYER = {"soft": (12, 4), "bootstrap": (15, 5), "hat": (9, 6), "ltt": (9, 5), "ltt_wsr": (10, 5), "crc": (8, 6),
         "brute_force": (7, 7)}


def _label_spot(cs, marks: np.ndarray, top: float) -> tuple[float, float]:
    """Where to write a boundary's name: the point of its contour farthest from every marker and from the square's
    edges (a name written at an edge is cut off)."""
    pts = np.concatenate([seg for seg in cs.allsegs[0] if len(seg)])
    room = 2.0 * np.minimum(pts, top - pts).min(axis=1)
    if len(marks):
        room = np.minimum(room, np.linalg.norm(pts[:, None, :] - marks[None, :, :], axis=2).min(axis=1))
    return tuple(pts[int(np.argmax(room))])


def _procedure_label(name: str, p: dict, view: ConstraintView, record: dict, shown_off: bool) -> str:
    title = PROCEDURES.get(name, ("o", name))[1]
    if name == view.deployed:
        title += " (deployed)"
    if name in ("ltt", "ltt_wsr"):
        delta = record["procedures"][name].get("delta")
        title += f" ($\\delta$ = {delta:g})" if isinstance(delta, int | float) else ""
        title += ": certified" if p["feasible"] else ": not certified (end of the search)"
    elif name == "crc" and not p["feasible"]:
        title += ": not certified"
    elif name == "brute_force":
        title += f" on the {record['brute_force'].get('grid')}$^2$ grid"
    elif not p["feasible"]:
        title += ": infeasible"
    where = f"$\\lambda$ = {vec(p['lambda'])}" if len(view.names) > 1 else f"$\\lambda$ = {p['lambda'][0]:.3g}"
    off = " (off the plot)" if shown_off else " (off the ray)" if view.ray is not None and not p["on_ray"] else ""
    return f"{title}: {where}, reward {p['reward']:.3g}{off}"


def _mark(ax, name: str, p: dict, at: tuple, shown_off: bool, view: ConstraintView, record: dict, colour: dict):
    """A procedure's lambda drawn at ``at``: its marker, size and layer, hollow where not certified / feasible."""
    size, z = LAYER.get(name, (9, 5))
    ax.plot(*at, marker=PROCEDURES.get(name, ("o", name))[0], ms=size, ls="none", color=colour[name],
            mfc=colour[name] if p["feasible"] else "none", mew=1.4, mec="black" if p["feasible"] else colour[name],
            clip_on=False, zorder=z, label=_procedure_label(name, p, view, record, shown_off))


def _feasible_plane(view: ConstraintView, record: dict, opts: FigureSettings, pal, colour: dict, handles: list):
    """Two constraints: the (lambda_1, lambda_2) plane of :func:`constraints`; its legend entries go to
    ``handles``."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    g = view.grid
    top = float(g.axis[-1])
    side = max(opts.width * 0.75, 4.0)  # a square panel, the legend to its right
    _, fig, ax = panels(opts, figsize=(side + max(opts.width * 0.75, 4.0), side))
    l1, l2 = g.lambdas
    marks = np.array([np.minimum(p["lambda"], top) for p in view.procedures.values()]).reshape(-1, 2)
    ax.pcolormesh(l1, l2, np.ma.masked_where(~g.feasible, np.ones_like(l1)), shading="nearest",
                  cmap=ListedColormap([SHADE]), alpha=0.18, lw=0, zorder=1)
    handles.append(Patch(color=SHADE, alpha=0.25, label=f"every constraint met ({int(g.feasible.sum())} of "
                                                       f"{g.feasible.size} grid points)"))
    rs = ax.contour(l1, l2, g.reward, levels=6, colors="0.55", linewidths=0.7, linestyles=":", zorder=2)
    ax.clabel(rs, fmt="%.3g", fontsize="x-small")
    handles.append(key(color="0.55", lw=0.7, ls=":", label="mean reward"))
    for j, (name, tau) in enumerate(zip(view.names, view.tau, strict=True)):
        z = g.costs[..., j]
        label = f"{name}: mean cost = $\\tau$ = {tau:g}"
        if z.min() <= tau <= z.max() and z.min() < z.max():
            cs = ax.contour(l1, l2, z, levels=[tau], colors=[pal[j]], linewidths=1.8, linestyles="solid",
                            zorder=3)
            ax.clabel(cs, fmt={cs.levels[0]: name}, fontsize="small", manual=[_label_spot(cs, marks, top)])
        else:
            label += " (met on the whole grid)" if z.max() <= tau else " (missed on the whole grid)"
        handles.append(key(color=pal[j], lw=1.8, label=label))
    d = view.direction
    end = top / float(d.max()) * d
    ax.plot([0.0, end[0]], [0.0, end[1]], color="0.25", ls="--", lw=1.0, zorder=3)
    handles.append(key(color="0.25", ls="--", lw=1.0, label=f"ray searched: s d, d = {vec(d)}"))
    for name, p in view.procedures.items():
        x, y = p["lambda"]
        _mark(ax, name, p, (min(x, top), min(y, top)), max(x, y) > top * (1 + 1e-9), view, record, colour)
    ax.set(xlim=(0.0, top), ylim=(0.0, top), aspect="equal", xlabel=f"$\\lambda_1$ ({view.names[0]})",
           ylabel=f"$\\lambda_2$ ({view.names[1]})",
           title=f"Best-of-{view.n}: the feasible region ({view.n_prompts} calibration prompts)")
    return fig, [ax]


def _costs_along_ray(view: ConstraintView, record: dict, opts: FigureSettings, pal, colour: dict, handles: list):
    """Any number of constraints but two: each mean cost and the reward along the ray of :func:`constraints`;
    its legend entries go to ``handles``."""
    from matplotlib.patches import Patch

    m = len(view.names)
    ray = view.ray
    s, s_top = ray["s"], ray["s_max"]
    _, fig, axes = panels(opts, 1, m + 1, figsize=(max(opts.width, 2.8 * (m + 1)), opts.height + 1.4), sharex=True)
    curves = [(axes[j], ray["costs"][:, j], f"{name}: $\\tau$ = {tau:g}", "mean expected cost")
              for j, (name, tau) in enumerate(zip(view.names, view.tau, strict=True))]
    curves.append((axes[m], ray["reward"], "reward", "mean expected reward"))
    for j, (ax, y, title, ylabel) in enumerate(curves):
        ax.plot(s, y, drawstyle="steps-post", color=pal[j] if j < m else "0.3", lw=1.5)
        ax.fill_between(s, 0, 1, where=ray["feasible"], step="post", color=SHADE, alpha=0.1, lw=0,
                        transform=ax.get_xaxis_transform())
        if j < m:
            ax.axhline(view.tau[j], color="black", ls="--", lw=1.0)
        for name, p in view.procedures.items():
            _mark(ax, name, p, (min(p["s"], s_top), p["cost"][j] if j < m else p["reward"]),
                  p["s"] > s_top * (1 + 1e-9), view, record, colour)
        ax.set(title=title, ylabel=ylabel, xlim=(0.0, s_top), xlabel="$\\lambda$" if m == 1 else "s ($\\lambda$ = s d)")
    handles.append(Patch(color=SHADE, alpha=0.2, label="every constraint met"))
    handles.append(key(color="black", ls="--", lw=1.0, label="$\\tau$"))
    if m > 1:
        handles.append(key(color="0.3", lw=0, label=f"d = {vec(view.direction)}"))
    along = "against $\\lambda$" if m == 1 else "along the ray searched"
    fig.suptitle(f"Best-of-{view.n} {along} ({view.n_prompts} calibration prompts)")
    return fig, axes


def constraints(view: ConstraintView, record: dict, opts: FigureSettings):
    """Several constraints at once (the vector lambda of ``lara calibrate-vector``), on the calibration prompts, every
    number exact (the expected Best-of-N choice over all N-subsets of each prompt's K samples). Two constraints: the
    plane of (lambda_1, lambda_2), shaded where every constraint's mean cost meets its tau (grid points), each
    constraint's boundary (its mean cost at tau), the mean reward faint, the ray searched and every procedure's
    lambda (hollow where it is not certified / feasible). Any other number: each constraint's mean cost along that
    ray with its tau (shaded where all are met) and the mean reward, every procedure at its s."""
    pal = theme(opts)
    m = len(view.names)
    colour = {name: pal[(m + i) % len(pal)] for i, name in enumerate(view.procedures)}
    handles: list = []
    draw = _feasible_plane if view.grid is not None else _costs_along_ray
    fig, axes = draw(view, record, opts, pal, colour, handles)
    proc_handles, _ = axes[0].get_legend_handles_labels()
    where = {"loc": "outside right center"} if view.grid is not None else {"loc": "outside lower center", "ncol": 2}
    fig.legend(handles=handles + proc_handles, frameon=False, fontsize="small", **where)
    return fig


def constraint_shows(view: ConstraintView) -> dict:
    """What the constraints figure shows, for its provenance sidecar and report caption."""
    shows = view.shows() | {
             "k": view.k, "calibration_prompts": view.n_prompts, "view": "region" if view.grid is not None else "ray",
             "procedures": {k: {"lambda": r4(p["lambda"]), "feasible": p["feasible"],
                                "reward": round(float(p["reward"]), 4), "cost": r4(p["cost"]),
                                "meets_tau": p["meets_tau"], "on_ray": p["on_ray"]}
                            for k, p in view.procedures.items()}}
    if view.grid is not None:
        g = view.grid
        shows["grid"] = {"points": len(g.axis), "top": round(float(g.axis[-1]), 4),
                         "feasible_points": int(g.feasible.sum()), "total": int(g.feasible.size)}
    else:
        shows["ray"] = {"s_max": round(float(view.ray["s_max"]), 4), "points": len(view.ray["s"])}
    return shows


def figure(args, opts: FigureSettings, lam: dict | None) -> Drawn:
    """The vector --lambda-json for --constraints and the --scores it was calibrated on, drawn; what the figure
    shows (:func:`constraint_shows`)."""
    record, scores = read_vector_inputs(args.lambda_json, args.scores, args.constraints)
    view = constraint_view(record, scores)
    return Drawn(constraints(view, record, opts), constraint_shows(view))
