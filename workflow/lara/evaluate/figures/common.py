"""What every figure of ``lara figure`` shares: the plot options (:class:`FigureSettings`, the config section
``figures``), the seaborn theme, the markers of the decoded lambda settings, the command's logger and what a kind's
``figure`` returns (:class:`Drawn`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from lara.settings import Settings, cross_key, setting

# seaborn's own palettes (a name among them needs no import of seaborn to check)
SEABORN_PALETTES = ("deep", "deep6", "muted", "muted6", "pastel", "pastel6", "bright", "bright6", "dark", "dark6",
                    "colorblind", "colorblind6")

# every figure module logs as the command, lara.evaluate.figures (the name the log lines show)
log = logging.getLogger(__package__)

MARKERS = {"zero": "o", "hat": "v", "star": "*", "max": "s", "policy": "D"}


@dataclass(frozen=True)
class FigureSettings(Settings):
    """figures: plot options of every figure (changing one redraws the figures and nothing else)."""

    SECTION: ClassVar[str] = "figures"

    width: float = setting(7.0, "Figure width in inches.", exclusive_minimum=0)
    height: float = setting(3.2, "Panel height in inches.", exclusive_minimum=0)
    dpi: int = setting(150, "PNG resolution.", minimum=1)
    font_scale: float = setting(1.2, "Seaborn font scale.", exclusive_minimum=0)
    palette: str = setting("colorblind", "Seaborn palette (colour-blind safe by default).")

    @cross_key("figures.palette", witness={"figures": {"palette": "colourblind"}})
    def palette_known(self):
        if self.palette in SEABORN_PALETTES:
            return None
        import seaborn as sns  # only for a name that is not one of seaborn's own palettes

        try:
            sns.color_palette(self.palette)
        except (ValueError, TypeError) as exc:
            return f"figures.palette: {self.palette!r} is not a palette seaborn knows ({exc})"
        return None


def theme(opts: FigureSettings):
    """The seaborn theme of every figure (off-screen backend, whitegrid, the font scale); its colour palette."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper", font_scale=opts.font_scale)
    return sns.color_palette(opts.palette)


def panels(opts: FigureSettings, *grid: int, height: float = 0.0, **kw):
    """A figure in the theme: its palette (:func:`theme`), figure and axes (``plt.subplots(*grid, **kw)``, constrained
    layout unless ``layout`` says otherwise; ``figsize`` by default the options' width and panel height plus
    ``height`` inches)."""
    pal = theme(opts)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*grid, **{"figsize": (opts.width, opts.height + height), "layout": "constrained"} | kw)
    return pal, fig, axes


def key(**kw):
    """A legend entry that stands for what the figure draws (a line without data)."""
    from matplotlib.lines import Line2D

    return Line2D([], [], **kw)


class Drawn(NamedTuple):
    """A kind's figure, drawn from the inputs it read: the matplotlib figure, what it shows beyond what the
    command reads off the trail (:func:`lara.evaluate.figures.provenance.describe`), and the evaluation summary it
    drew (kind tradeoff), whose rows the sidecar names."""

    fig: Any
    extra: dict | None = None
    summary: Any = None


def check_record(lam: dict | None, path, tau, n, where: str) -> None:
    """--lambda-json ``path`` (``lam``; None: not given) beside an input ``where`` of full Best-of-N for ``tau`` and
    N = ``n`` (None: not said): a record of that decoder, tau and N, else refused (what the figure's provenance
    shows of the record is then the input's)."""
    import math

    from lara.read.files import DataError

    if lam is None:
        return
    dec = lam.get("decoder") or {}
    same_tau = all(isinstance(t, int | float) for t in (tau, lam.get("tau"))) and math.isclose(
        lam["tau"], tau, rel_tol=1e-9, abs_tol=1e-12)
    if dec.get("kind") != "best_of_n" or not same_tau or (n is not None and dec.get("n") != n):
        raise DataError(f"--lambda-json {path}: calibrated for tau {lam.get('tau')} and decoder {dec.get('kind')} "
                        f"with N = {dec.get('n')}, but {where} is full Best-of-N's (best_of_n) for tau {tau} and "
                        f"N = {n}")
