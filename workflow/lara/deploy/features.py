"""``lara prompt-features``: one feature vector per prompt, for the shift check (:mod:`lara.deploy.shift`).

    lara prompt-features --model models/reward --prompts prompts_calibration.parquet prompts_deployment.parquet \\
        --settings '{"dtype": "float32"}' --out features.parquet

A prompt's features are the mean over its tokens (weighted by the attention mask) of the model's last hidden
states, on the prompt as every scorer sees it (the conversation template, :func:`lara.scoring.encode` without a
response, cut to the scorer's ``max_length``). The model is the run's reward model: the representation the
calibrated scores come from, so a shift it cannot see is one the scores do not see either. Its backbone is loaded
(``AutoModel``: the head is not needed). Batches go by length (right padding, positions from the mask) and the
steps run deterministic algorithms (:data:`lara.steps.TORCH_COMMANDS`), so the same prompts give the same features.

The output has one row per distinct prompt of all ``--prompts`` files (columns ``prompt_id, f0 .. f{d-1}``,
float32). A prompt id given twice with one text counts once (a stream lists a prompt at every visit); one id with
two texts, two ids for one text, or ids that collapse to one ("01" and 1) are refused, naming them.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from lara.data.errors import DataError
from lara.settings import Dtype, Settings, add_settings_arguments, dtype_setting, read_settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeatureSettings(Settings):
    """What the prompt features read from the config: the weight dtype of the model."""

    dtype: Dtype = dtype_setting()


def distinct_prompts(frames: list[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """(prompt_id, prompt) once per prompt, in order of first appearance across the files; an id with two texts is
    refused (naming both files), and so are two ids for one text and ids that collapse to one
    (:func:`lara.identity.prompt_set`)."""
    from lara import identity

    parts = []
    for path, df in frames:
        pairs = df[["prompt_id", "prompt"]].drop_duplicates()
        twice = pairs["prompt_id"].duplicated(keep=False)
        if twice.any():
            pid = pairs["prompt_id"][twice.to_numpy()].iloc[0]
            raise DataError(f"--prompts {path}: prompt {pid!r} has two different texts")
        parts.append(pairs.assign(_file=path))
    allp = pd.concat(parts, ignore_index=True)
    allp["_key"] = allp["prompt_id"].map(identity.id_key)
    texts = allp.drop_duplicates(["_key", "prompt"])
    clash = texts["_key"].duplicated(keep=False)
    if clash.any():
        rows = texts[clash.to_numpy()]
        a, b = rows.iloc[0], rows[rows["_key"] == rows["_key"].iloc[0]].iloc[1]
        raise DataError(f"--prompts: prompt {a['prompt_id']!r} has one text in {a['_file']} and another in "
                        f"{b['_file']} ({b['prompt_id']!r})")
    out = texts.drop_duplicates("_key")[["prompt_id", "prompt"]].reset_index(drop=True)
    identity.prompt_set(out, "--prompts (all files)")
    return out


def mean_pooled(model, tokenizer, seqs: list[list[int]], batch_size: int, progress: str | None = None) -> np.ndarray:
    """(P, d) float32: each sequence's last hidden states averaged over its tokens (attention-mask weighted)."""
    import torch
    from tqdm import tqdm

    from lara.scoring import pad_batch, position_ids

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    out = None
    order = np.argsort([len(s) for s in seqs], kind="stable")  # similar lengths batch together
    bar = tqdm(total=len(seqs), desc=progress, unit="prompt", mininterval=10, disable=progress is None)
    with torch.inference_mode(), bar:
        for lo in range(0, len(seqs), batch_size):
            idx = order[lo:lo + batch_size]
            ids, mask = pad_batch([seqs[i] for i in idx], pad, "right")
            ids, mask = ids.to(device), mask.to(device)
            hidden = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                           use_cache=False).last_hidden_state.float()
            m = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(dim=1) / m.sum(dim=1)
            if out is None:
                out = np.empty((len(seqs), pooled.shape[1]), dtype=np.float32)
            out[idx] = pooled.cpu().numpy()
            bar.update(len(idx))
    return out


def load_backbone(path, dtype: str):
    """The model's backbone (its last hidden states; no head), tokenizer and the scorer's max_length."""
    from pathlib import Path

    import torch
    from transformers import AutoModel, AutoTokenizer

    from lara.scoring import SCORER_FILE

    meta_file = Path(path) / SCORER_FILE
    from lara.read.files import json_file
    meta = json_file(meta_file, mapping=False) if meta_file.exists() else {}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    return model, tokenizer, meta.get("max_length")


def features(model_dir, prompts: pd.DataFrame, s: FeatureSettings, batch_size: int = 32) -> pd.DataFrame:
    """The features table of ``prompts`` (prompt_id, prompt)."""
    from lara.scoring import encode

    model, tokenizer, max_length = load_backbone(model_dir, s.dtype)
    log.info("model %s on %s (%s), max_length %s", model_dir, next(model.parameters()).device, s.dtype, max_length)
    seqs = [encode(tokenizer, p, "", False, max_length) for p in prompts["prompt"]]
    x = mean_pooled(model, tokenizer, seqs, batch_size, progress="prompt features")
    if not np.isfinite(x).all():
        raise DataError(f"{model_dir}: non-finite hidden states for {int((~np.isfinite(x).all(axis=1)).sum())} "
                        "prompts")
    cols = pd.DataFrame(x, columns=[f"f{j}" for j in range(x.shape[1])])
    return pd.concat([prompts[["prompt_id"]].reset_index(drop=True), cols], axis=1)


# ---------------------------------------------------------------------------------------------
# CLI: lara prompt-features

HELP = "one feature vector per prompt (a model's mean-pooled last hidden states), for the shift check"


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="model directory (the reward model)")
    parser.add_argument("--prompts", nargs="+", required=True,
                        help="tables with prompt_id and prompt (calibration prompts, the deployment pool, a stream)")
    add_settings_arguments(parser, FeatureSettings)
    parser.add_argument("--batch-size", type=int, default=32, help="prompts per forward pass")
    parser.add_argument("--out", required=True, help="output parquet: prompt_id, f0 .. f{d-1}")


def run(args) -> None:
    from lara import identity
    from lara.provenance import code_version
    from lara.read.files import read_table, write_table

    s = read_settings(args, FeatureSettings)
    identity.distinct_files(args.prompts, "--prompts")
    frames = [(p, read_table(p, required=("prompt_id", "prompt"))) for p in args.prompts]
    prompts = distinct_prompts(frames)
    log.info("%d distinct prompts from %d file(s); settings %s", len(prompts), len(frames), s)
    if args.batch_size < 1:
        raise DataError(f"--batch-size {args.batch_size}: at least one prompt per forward pass")
    table = features(args.model, prompts, s, args.batch_size)
    made = identity.stamp("prompt_features", args.out, model=str(args.model), dim=table.shape[1] - 1,
                          prompts=identity.prompt_set(prompts, "--prompts").record(),
                          made_from={f"--prompts {i}": p for i, p in enumerate(args.prompts)})
    write_table(table, args.out, {"settings": asdict(s), "model": str(args.model), "code": code_version(),
                                  identity.KEY: made})
    log.info("wrote %d x %d features to %s", len(table), table.shape[1] - 1, args.out)
