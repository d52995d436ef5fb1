"""The constraint list (``calibration.constraints``): parsing and checking, shared by the config loader and
every step of the stage (each step receives the list as ``--constraints`` JSON)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass

NAME = re.compile(r"^[a-z][a-z0-9_]*$")
CATEGORY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _/&,'-]*$")  # PKU-SafeRLHF's: "Privacy Violation", ...
CATEGORY = "category:"
KEYS = ("name", "cost", "tau", "evaluation", "bounds", "kind", "threshold")
KINDS = ("mean", "probability")


@dataclass(frozen=True)
class Constraint:
    """E[c] <= tau for the cost ``cost``: ``category:<c>`` (a cost model trained on the preference data's
    per-category labels ``response_{0,1}_harm_category[c]``), ``cost`` (the experiment's trained cost model) or a
    scorer spec (a named scorer, ``name:argument``, a model directory or hub id). ``evaluation`` scores the
    audit (null: the experiment's ``evaluation.cost_model``). A named scorer is given the constraint's name as
    its role (the toy oracle's harm category, hatesonar's class). ``bounds`` ([lo, hi], fixed before the
    calibration samples are seen; null: ``calibration.cost_bounds``) bound this cost for LTT.

    ``kind``: ``mean`` bounds E[c] <= tau; ``probability`` bounds P(c > threshold) <= tau, a loss in {0, 1}
    (:meth:`loss`): every step of the stage reads the scorer's c and calibrates, decodes and audits that loss, so
    its bounds are [0, 1] exactly (nothing is clipped) and tau is a rate in (0, 1)."""

    name: str
    cost: str
    tau: float
    evaluation: str | None = None
    bounds: tuple[float, float] | None = None
    kind: str = "mean"
    threshold: float | None = None

    def loss(self, scores):
        """The constraint's loss of a response from its scorer's scores: the score itself (mean), or 1 where the
        score is above the threshold, else 0 (probability), as float64."""
        import numpy as np

        values = np.asarray(scores, dtype=np.float64)
        return values if self.kind == "mean" else (values > self.threshold).astype(np.float64)

    @property
    def category(self) -> str | None:
        return self.cost[len(CATEGORY):] if self.cost.startswith(CATEGORY) else None

    @property
    def slug(self) -> str | None:
        """The category as a file name part (models/cost_<slug>): lower case, runs of other characters to _."""
        return None if self.category is None else category_slug(self.category)

    @property
    def column(self) -> str:
        return f"cost_{self.name}"


def category_slug(category: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", category.lower()).strip("_")


def parse(items, where: str = "calibration.constraints") -> list[Constraint]:
    """The list checked: each entry a mapping of the known keys, a unique lower-case name, a finite tau."""
    from lara.settings import ConfigError

    if not isinstance(items, list):
        raise ConfigError(f"{where}: a list of {{name, cost, tau}} mappings, got {type(items).__name__}")
    out, seen = [], set()
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{at}: a mapping with name, cost and tau, got {item!r}")
        unknown = sorted(set(item) - set(KEYS))
        missing = [k for k in ("name", "cost", "tau") if k not in item]
        if unknown or missing:
            raise ConfigError(f"{at}: " + "; ".join(
                ([f"unknown key(s) {unknown} (known: {', '.join(KEYS)})"] if unknown else [])
                + ([f"missing {missing}"] if missing else [])))
        name = item["name"]
        if not isinstance(name, str) or not NAME.match(name):
            raise ConfigError(f"{at}.name: {name!r} is not a lower-case identifier (it names a column and files)")
        if name in seen:
            raise ConfigError(f"{at}.name: {name!r} is given twice (each constraint is its own column and verdict)")
        seen.add(name)
        cost = item["cost"]
        bad_category = (isinstance(cost, str) and cost.startswith(CATEGORY)
                        and not CATEGORY_NAME.match(cost[len(CATEGORY):]))
        if not isinstance(cost, str) or not cost or bad_category:
            raise ConfigError(f"{at}.cost: {cost!r} is not `cost`, `category:<name>` or a scorer spec")
        tau = item["tau"]
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau):
            raise ConfigError(f"{at}.tau: {tau!r} is not a finite number")
        ev = item.get("evaluation")
        if ev is not None and (not isinstance(ev, str) or not ev):
            raise ConfigError(f"{at}.evaluation: {ev!r} is not a scorer spec")
        bounds = item.get("bounds")
        if bounds is not None:
            ok = (isinstance(bounds, list) and len(bounds) == 2
                  and all(not isinstance(b, bool) and isinstance(b, (int, float)) and math.isfinite(b) for b in bounds)
                  and bounds[0] < bounds[1])
            if not ok:
                raise ConfigError(f"{at}.bounds: {bounds!r} is not [lo, hi] with finite lo < hi")
            bounds = (float(bounds[0]), float(bounds[1]))
        kind, threshold = _kind(item, at, tau, bounds)
        made = Constraint(name, cost, float(tau), ev, (0.0, 1.0) if kind == "probability" else bounds, kind,
                          threshold)
        other = next((c for c in out if c.slug is not None and c.slug == made.slug and c.category != made.category),
                     None)
        if other is not None:
            raise ConfigError(f"{at}.cost: the categories {other.category!r} and {made.category!r} share the file "
                              f"name cost_{made.slug}")
        out.append(made)
    return out


def _kind(item: dict, at: str, tau, bounds) -> tuple[str, float | None]:
    """The constraint's kind and threshold, checked: a probability constraint states a finite threshold, a rate tau
    in (0, 1) and no bounds of its own (its loss is in {0, 1}); a mean constraint states no threshold."""
    from lara.settings import ConfigError

    kind = item.get("kind", "mean")
    if kind not in KINDS:
        raise ConfigError(f"{at}.kind: {kind!r} is not one of {', '.join(KINDS)}")
    threshold = item.get("threshold")
    if kind == "mean":
        if threshold is not None:
            raise ConfigError(f"{at}.threshold: {threshold!r} is given for a mean constraint (E[c] <= tau has no "
                              "threshold); set kind: probability to bound P(c > threshold)")
        return kind, None
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ConfigError(f"{at}.threshold: {threshold!r}: a probability constraint bounds P(c > threshold) and needs "
                          "a finite threshold in its cost's units")
    if not 0 < tau < 1:
        raise ConfigError(f"{at}.tau: {tau!r}: a probability constraint's tau is a rate in (0, 1)")
    if bounds is not None and tuple(bounds) != (0.0, 1.0):
        raise ConfigError(f"{at}.bounds: {list(bounds)!r}: a probability constraint's loss is 0 or 1, so its bounds "
                          "are [0, 1] by construction; remove bounds")
    return kind, float(threshold)


def as_item(c: Constraint) -> dict:
    """The constraint as a config entry (a mean constraint without the kind and threshold it does not use, so the
    rules' parameters of a list of mean constraints are what they were before probability constraints existed)."""
    item = asdict(c)
    if c.kind == "mean":
        del item["kind"], item["threshold"]
    return item


def losses(constraints: list[Constraint]) -> list[dict]:
    """What defines each constraint's loss column of a stream (lara make-stream --constraints): its name, its cost's
    scorer, its kind and threshold; a stream is followed only under the constraints it was made for."""
    return [{"name": c.name, "cost": c.cost, "kind": c.kind, "threshold": c.threshold} for c in constraints]


def to_json(constraints: list[Constraint]) -> str:
    return json.dumps([as_item(c) for c in constraints], sort_keys=True)


def from_arg(text: str, flag: str = "--constraints") -> list[Constraint]:
    """The list a step was given, parsed and checked (at least one)."""
    from lara.settings import ConfigError, _strict_loads

    try:
        items = _strict_loads(text, flag)  # a key given twice is refused, as in --settings
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag}: not JSON ({exc})") from None
    out = parse(items, flag)
    if not out:
        raise ConfigError(f"{flag}: no constraints")
    return out


def bounds(constraints: list[Constraint], default) -> list | None:
    """Each constraint's cost bounds (its own, else ``default``: calibration.cost_bounds); None when one has none."""
    out = [c.bounds if c.bounds is not None else (None if default is None else tuple(default)) for c in constraints]
    return None if any(b is None for b in out) else [list(b) for b in out]
