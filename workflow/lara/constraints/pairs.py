"""``lara category-pairs``: the preference pairs seen through one harm category, for that category's cost model.

PKU-SafeRLHF labels each response harmful or not in each of its harm categories
(``response_{0,1}_harm_category``) but gives one severity order per pair (``safer_response_id``). The view for
category c keeps every pair and relabels it: a response is safe when it is not harmful in c; where the two
responses' c labels differ the safer one is the one not harmful in c; where they agree the pair says nothing
about c's order, so the order is a seeded coin (its ranking term then pulls the two costs together in
expectation, as the toy world's own ties do) and only the sign terms carry information. Using the pair's
overall order there would teach the c cost model another category's harm.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from lara.data.ingest import HARM_CATEGORY_COLUMNS
from lara.settings import Settings, add_settings_arguments, read_settings, seed_setting

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class CategoryPairsSettings(Settings):
    """What the category view reads from the config: the seed of the coin that orders tied pairs."""

    seed: int = seed_setting()


HELP = "the preference pairs relabelled by one harm category (for that category's cost model)"


def category_view(df, category: str, seed: int, where: str = "--input"):
    """The PKU-schema table with is_response_{0,1}_safe and safer_response_id for ``category`` alone."""
    from lara.read.files import DataError

    missing = [c for c in HARM_CATEGORY_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"{where}: no per-category labels ({', '.join(missing)}): the preference data must carry "
                        "PKU-SafeRLHF's response_0_harm_category and response_1_harm_category to train a cost "
                        f"model for the category {category!r}")
    known = sorted(df[HARM_CATEGORY_COLUMNS[0]].iloc[0])
    if category not in known:
        raise DataError(f"{where}: the harm category {category!r} is not labelled (labelled: {', '.join(known)})")
    from lara.read.expect import strict_bool

    harmful = np.stack([[strict_bool(v.get(category) if isinstance(v, dict) else v,
                                     f"{where}: column {c!r} row {i} ({category})") for i, v in enumerate(df[c])]
                        for c in HARM_CATEGORY_COLUMNS], axis=1)
    out = df.drop(columns=list(HARM_CATEGORY_COLUMNS)).copy()
    out["is_response_0_safe"], out["is_response_1_safe"] = ~harmful[:, 0], ~harmful[:, 1]
    coin = np.random.default_rng(seed).integers(0, 2, len(df))
    differ = harmful[:, 0] != harmful[:, 1]
    out["safer_response_id"] = np.where(differ, harmful[:, 0].astype(int), coin)
    log.info("category %s: %d pairs, %d with differing labels, %d responses harmful in it", category, len(df),
             int(differ.sum()), int(harmful.sum()))
    return out, {"category": category, "pairs": len(df), "pairs_labels_differ": int(differ.sum()),
                 "responses_harmful": int(harmful.sum())}


def add_arguments(parser) -> None:
    parser.add_argument("--input", required=True, help="the ingested preference pairs (data/preferences.parquet)")
    parser.add_argument("--category", required=True, help="the harm category (a key of response_0_harm_category)")
    add_settings_arguments(parser, CategoryPairsSettings)
    parser.add_argument("--out", required=True, help="output parquet (PKU-SafeRLHF schema)")


def run(args) -> None:
    from lara import identity
    from lara.provenance import code_version
    from lara.read.files import read_table, write_table

    s = read_settings(args, CategoryPairsSettings)
    df = read_table(args.input, required=("prompt", "response_0", "response_1", "safer_response_id"))
    out, info = category_view(df, args.category, s.seed, f"--input {args.input}")
    made = identity.stamp("preferences", args.out, made_from={"--input": args.input}, category=args.category)
    write_table(out, args.out, {"input": args.input, "seed": s.seed, "code": code_version(), **info,
                                identity.KEY: made})
