"""``lara value-prompts``: the prompts CD-Q's value models are trained on.

The value models learn what the reward and cost models will say about a finished response from
a prefix, so they must see the requests where the cost matters: a share ``safety_fraction`` of
the prompts comes from the safety preference data (PKU-SafeRLHF prompts, half of them harmful
requests), the rest from the instruction data (Alpaca). Every prompt of the calibration and test
splits is excluded, so the value models never train on a prompt that calibration or evaluation
uses. Sampling is seeded and without replacement; prompts are deduplicated after whitespace
normalisation.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np
import pandas as pd

from lara.settings import Settings, add_settings_arguments, read_settings, seed_setting, setting

log = logging.getLogger(__name__)

HELP = "draw the CD-Q value models' training prompts: instruction and safety prompts, none calibrated or tested on"


@dataclass(frozen=True)
class ValuePromptSettings(Settings):
    """data.value_prompts: the CD-Q value models' training prompts."""

    SECTION: ClassVar[str] = "data.value_prompts"

    n_prompts: int = setting(400, "Value-training prompts (each sampled train.value.samples_per_prompt times).",
                             minimum=1)
    safety_fraction: float = setting(0.5, "Share drawn from the safety preference prompts; the rest from the "
                                          "instruction (SFT) prompts.", minimum=0, maximum=1)
    seed: int = seed_setting()


def draw(sft: pd.Series, safety: pd.Series, exclude: set[str], s: ValuePromptSettings,
         sources: tuple[str, str] = ("sft", "preferences")) -> pd.DataFrame:
    """prompt_id, prompt, source (instruction | safety): ``round(n * safety_fraction)`` safety prompts and
    the rest instruction prompts, none of them in ``exclude`` (prompt keys, lara.data.splits.prompt_key), none
    twice."""
    from lara.data.splits import distinct_prompts, prompt_id
    from lara.read.files import DataError

    n_safety = int(round(s.n_prompts * s.safety_fraction))
    wanted = {"safety": n_safety, "instruction": s.n_prompts - n_safety}
    taken: set[str] = set(exclude)
    parts = []
    for offset, (kind, texts, source) in enumerate((("safety", safety, sources[1]), ("instruction", sft, sources[0]))):
        texts, keys = distinct_prompts(texts)
        pool = [(t, k) for t, k in zip(texts, keys, strict=True) if k not in taken]
        if len(pool) < wanted[kind]:
            raise DataError(f"{source}: {len(pool)} distinct prompts outside the calibration and test splits, but "
                            f"data.value_prompts wants {wanted[kind]} {kind} prompts (n_prompts = {s.n_prompts}, "
                            f"safety_fraction = {s.safety_fraction})")
        order = np.random.default_rng([s.seed, offset]).permutation(len(pool))[:wanted[kind]]
        chosen = [pool[i] for i in sorted(order)]
        taken |= {k for _, k in chosen}
        parts.append(pd.DataFrame({"prompt_id": [prompt_id(k) for _, k in chosen], "prompt": [t for t, _ in chosen],
                                   "source": kind}))
    return pd.concat(parts, ignore_index=True)


def add_arguments(parser) -> None:
    parser.add_argument("--sft", required=True, help="the instruction data (parquet with a prompt column)")
    parser.add_argument("--preferences", required=True, help="the safety preference data (parquet with prompt)")
    parser.add_argument("--exclude", nargs="+", default=[], help="prompt splits whose prompts are never drawn")
    add_settings_arguments(parser, ValuePromptSettings)
    parser.add_argument("--out", required=True, help="output parquet: prompt_id, prompt, source")


def run(args) -> None:
    from lara.data.text import prompt_key
    from lara.provenance import code_version
    from lara.read.files import read_table, write_table

    s = read_settings(args, ValuePromptSettings)
    sft = read_table(args.sft, required=("prompt",))["prompt"]
    safety = read_table(args.preferences, required=("prompt",))["prompt"]
    exclude = {prompt_key(p) for path in args.exclude for p in read_table(path, required=("prompt",))["prompt"]}
    out = draw(sft, safety, exclude, s, (args.sft, args.preferences))
    write_table(out, args.out, {"settings": asdict(s), "sft": args.sft, "preferences": args.preferences,
                                "excluded": args.exclude, "code": code_version()})
    log.info("%d value-training prompts: %s; %d excluded prompts", len(out),
             out["source"].value_counts().to_dict(), len(exclude))
