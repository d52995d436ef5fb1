"""Reward, cost and PARGS partial models: Bradley-Terry training with TRL's RewardTrainer (docs/training.md).

Losses, each plus reg * mean(score^2): reward -log sigma(r_better - r_worse); cost ``safe_rlhf`` adds Safe-RLHF's
sign terms -log sigma(s c) of both responses (s = +1 unsafe, -1 safe), so safe responses are pushed to c < 0 and
unsafe ones to c > 0; cost ``bt`` is the pairwise term alone (the paper's stated objective). Its scores are
shift-invariant, so a budget tau would mean nothing: with ``anchor_zero`` the zero is fitted after training on the
*held-out* pairs' safety labels (:func:`fit_zero`), stored in ``lara_scorer.json`` and subtracted wherever the model
scores (``lara.scoring``), so tau is in units where c > 0 means "judged unsafe". Scores are the head at the true
last token (``lara.scoring.sequence_scores``), exactly as the scorer reads them. PARGS partial models are trained on
pairs of *prefixes* of both responses (:func:`prefix_pairs`), each with the full pair's label.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lara.scoring import encode, pad_batch, sequence_scores
from lara.settings import read_settings
from lara.template import PROMPT_TEMPLATE
from lara.train import common

log = logging.getLogger(__name__)

KINDS = ("reward", "cost")
SIDES = ("chosen", "rejected")
COLUMNS = ("chosen_ids", "rejected_ids", "chosen_sign", "rejected_sign")  # a training pair, as the trainer reads it


# ---------------------------------------------------------------------------------------------
# Losses (pure torch)


def cost_loss(c_unsafer, c_safer, s_unsafer, s_safer, regularization: float = 0.0, loss: str = "safe_rlhf"):
    """The cost loss: the pairwise Bradley-Terry term on the harmfulness preference, plus (``safe_rlhf``)
    Safe-RLHF's two sign terms that anchor safe responses below 0 and unsafe ones above; ``bt`` is the
    pairwise term alone (the signs unused), which is also the reward loss. Then the regulariser."""
    import torch.nn.functional as F

    if loss not in ("safe_rlhf", "bt"):
        raise ValueError(f"cost loss {loss!r}: safe_rlhf or bt")
    terms = -F.logsigmoid(c_unsafer - c_safer)
    if loss == "safe_rlhf":
        terms = terms - F.logsigmoid(s_safer * c_safer) - F.logsigmoid(s_unsafer * c_unsafer)
    loss = terms.mean()
    if regularization:
        import torch

        loss = loss + regularization * torch.cat([c_unsafer, c_safer]).square().mean()
    return loss


# ---------------------------------------------------------------------------------------------
# Data


def oriented_pairs(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """prompt, chosen (the higher-scoring side), rejected, and safety signs of both.

    reward: chosen = the better response. cost: chosen = the *unsafer* response (the one the
    cost model must score higher), rejected = the safer one.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    resp = df[["response_0", "response_1"]].to_numpy()
    safe = df[["is_response_0_safe", "is_response_1_safe"]].to_numpy().astype(bool)
    rows = np.arange(len(df))
    hi = df["better_response_id"].to_numpy() if kind == "reward" else 1 - df["safer_response_id"].to_numpy()
    lo = 1 - hi
    sign = np.where(safe, -1.0, 1.0)
    return pd.DataFrame({"prompt": df["prompt"].to_numpy(), "chosen": resp[rows, hi], "rejected": resp[rows, lo],
                         "chosen_sign": sign[rows, hi], "rejected_sign": sign[rows, lo]})


def tokenized_pairs(pairs: pd.DataFrame, tokenizer, max_length: int) -> dict:
    return {f"{side}_ids": [encode(tokenizer, p, t, True, max_length)
                            for p, t in zip(pairs["prompt"], pairs[side], strict=True)] for side in SIDES} | {
        f"{side}_sign": pairs[f"{side}_sign"].tolist() for side in SIDES}


def prefix_pairs(pairs: pd.DataFrame, tokenizer, max_length: int, per_pair: int | None, seed: int) -> dict:
    """PARGS training pairs: both responses cut to the same number of response tokens l, at every length or
    ``per_pair`` sampled ones (the last length of each includes its EOS), each with the full pair's label."""
    rng = np.random.default_rng(seed)
    out = {k: [] for k in (*COLUMNS, "prefix_fraction")}
    columns = ["prompt", "chosen", "rejected", "chosen_sign", "rejected_sign"]
    for p, c, r, sc, sr in pairs[columns].itertuples(index=False):
        head = encode(tokenizer, p, "", False)
        full_c, full_r = encode(tokenizer, p, c, True, max_length), encode(tokenizer, p, r, True, max_length)
        if full_c[:len(head)] != head or full_r[:len(head)] != head:
            raise ValueError("the tokenizer does not keep the prompt's tokens as a prefix of prompt + response")
        tail_c, tail_r = full_c[len(head):], full_r[len(head):]
        longest = max(len(tail_c), len(tail_r))
        lengths = np.arange(1, longest + 1)
        if per_pair is not None and per_pair < len(lengths):
            lengths = np.sort(rng.choice(lengths, size=per_pair, replace=False))
        for n in lengths:
            for key, value in zip(out, (head + tail_c[:n], head + tail_r[:n], sc, sr, float(n) / longest), strict=True):
                out[key].append(value)
    return out


# ---------------------------------------------------------------------------------------------
# Trainer


def make_trainer_class():
    """A RewardTrainer subclass with the collator, signature columns and losses above
    (built lazily so that importing this module does not import TRL)."""
    import torch
    from trl import RewardTrainer
    from trl.trainer.reward_trainer import DataCollatorForPreference

    @dataclass
    class SignedPreferenceCollator(DataCollatorForPreference):
        """TRL's preference collator plus the safety signs of both sides."""

        def torch_call(self, examples):
            return super().torch_call(examples) | {f"{side}_sign": torch.tensor(
                [e[f"{side}_sign"] for e in examples], dtype=torch.float) for side in SIDES}

    class ScoreModelTrainer(RewardTrainer):
        def __init__(self, *args, kind: str = "reward", regularization: float = 0.0, cost_loss: str = "safe_rlhf",
                     **kwargs):
            self.kind, self.regularization, self.cost_loss = kind, regularization, cost_loss
            processing_class = kwargs["processing_class"]
            kwargs.setdefault("data_collator", SignedPreferenceCollator(pad_token_id=processing_class.pad_token_id))
            super().__init__(*args, **kwargs)

        def _set_signature_columns_if_needed(self):
            if self._signature_columns is None:
                self._signature_columns = list(COLUMNS)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            mode = "train" if self.model.training else "eval"
            scores = sequence_scores(model, inputs["input_ids"], inputs["attention_mask"])
            hi, lo = torch.chunk(scores, 2)
            loss = cost_loss(hi, lo, inputs["chosen_sign"], inputs["rejected_sign"], self.regularization,
                             self.cost_loss if self.kind == "cost" else "bt")
            if self.kind == "cost":
                signs = torch.cat([inputs["chosen_sign"], inputs["rejected_sign"]])
                sign_acc = ((torch.cat([hi, lo]) > 0).float() == (signs > 0).float()).float().mean()
                self._metrics[mode]["sign_accuracy"].append(self.accelerator.gather_for_metrics(sign_acc).mean().item())
            acc = (hi > lo).float().mean()
            self._metrics[mode]["accuracy"].append(self.accelerator.gather_for_metrics(acc).mean().item())
            return (loss, {"scores": scores}) if return_outputs else loss

    return ScoreModelTrainer


def score_pairs(model, tokenizer, data: dict, batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Scores of both sides of tokenized pairs with a trained model (evaluation)."""
    import torch

    model.eval()
    dev = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    out = []
    with torch.inference_mode():
        for side in ("chosen_ids", "rejected_ids"):
            seqs, vals = data[side], []
            for lo in range(0, len(seqs), batch_size):
                ids, mask = pad_batch(seqs[lo:lo + batch_size], pad)
                vals.append(sequence_scores(model, ids.to(dev), mask.to(dev)).float().cpu().numpy())
            out.append(np.concatenate(vals) if vals else np.empty(0))
    return out[0], out[1]


def fit_zero(scores: np.ndarray, unsafe: np.ndarray) -> float:
    """The offset b that makes ``scores - b > 0`` classify responses as unsafe most accurately: among
    the thresholds between consecutive distinct scores (and beyond both ends) with the highest
    accuracy, the middle one. Scale-free (a threshold, no fitted slope) and defined for separable data."""
    scores, unsafe = np.asarray(scores, dtype=float), np.asarray(unsafe, dtype=bool)
    if len(scores) == 0 or not np.isfinite(scores).all():
        raise ValueError("fitting the cost scale's zero needs finite held-out scores")
    values = np.unique(scores)
    gaps = np.diff(values)
    cuts = np.concatenate([[values[0] - 1.0], values[:-1] + gaps / 2, [values[-1] + 1.0]])
    # accuracy of "unsafe iff score > cut" for every cut, by counting through the sorted scores
    below = np.searchsorted(np.sort(scores[unsafe]), cuts, side="right")  # unsafe at or below: missed
    safe_sorted = np.sort(scores[~unsafe])
    safe_below = np.searchsorted(safe_sorted, cuts, side="right")  # safe at or below: right
    correct = safe_below + (unsafe.sum() - below)
    best = np.flatnonzero(correct == correct.max())
    return float(cuts[best[len(best) // 2]])


def zero_report(scores: np.ndarray, unsafe: np.ndarray, offset: float, folds: int = 2, seed: int = 0) -> dict:
    """How well c - offset > 0 separates unsafe from safe held-out responses: the accuracy at the fitted
    zero (in sample: one parameter), the same with the zero fitted on the other fold (cross-fitted), the
    accuracy at the trained zero (offset 0), and both classes' rates."""
    scores, unsafe = np.asarray(scores, dtype=float), np.asarray(unsafe, dtype=bool)
    pred = scores - offset > 0
    rng = np.random.default_rng(seed)
    fold = rng.permutation(len(scores)) % folds
    cross = np.empty(len(scores), dtype=bool)
    for k in range(folds):
        out = fold == k
        cross[out] = scores[out] - fit_zero(scores[~out], unsafe[~out]) > 0 if (~out).any() else pred[out]
    return {"offset": offset, "n_responses": int(len(scores)), "unsafe_share": float(unsafe.mean()),
            "accuracy_at_zero": float(np.mean(pred == unsafe)),
            "accuracy_at_zero_cross_fitted": float(np.mean(cross == unsafe)),
            "accuracy_at_trained_zero": float(np.mean((scores > 0) == unsafe)),
            "unsafe_recall": float(pred[unsafe].mean()) if unsafe.any() else None,
            "safe_recall": float((~pred[~unsafe]).mean()) if (~unsafe).any() else None}


def evaluate_pairs(hi: np.ndarray, lo: np.ndarray, data: dict, kind: str) -> dict:
    res = {"pairwise_accuracy": float(np.mean(hi > lo)), "n_pairs": len(hi)}
    if kind == "cost":
        signs = np.concatenate([data["chosen_sign"], data["rejected_sign"]])
        res["sign_accuracy"] = float(np.mean((np.concatenate([hi, lo]) > 0) == (signs > 0)))
        # pairs whose safety labels differ: the "safer" label is decisive there, while between two
        # responses of the same safety label it may be a tie broken at random (as in the toy world)
        differ = np.asarray(data["chosen_sign"]) != np.asarray(data["rejected_sign"])
        if differ.any():
            res["pairwise_accuracy_safety_differs"] = float(np.mean((hi > lo)[differ]))
            res["n_pairs_safety_differs"] = int(differ.sum())
    if "prefix_fraction" in data:
        frac = np.asarray(data["prefix_fraction"])
        bins = [0.0, 0.25, 0.5, 0.75, 1.0]
        res["accuracy_by_prefix_fraction"] = {
            f"{a:.2f}-{b:.2f}": float(np.mean((hi > lo)[(frac > a) & (frac <= b)]))
            for a, b in zip(bins[:-1], bins[1:], strict=True) if np.any((frac > a) & (frac <= b))}
    return res


def train_preference_model(kind: str, model_path: str, data_path: str, checkpoints: str, out: str,
                           s: common.TrainSettings, partial: bool = False) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification
    from trl import RewardConfig

    tokenizer, df = common.start(model_path, s, data_path)
    name = f"partial_{kind}" if partial else kind
    loss_name = getattr(s, "cost_loss" if partial else "loss", "safe_rlhf") if kind == "cost" else "bradley_terry"
    log.info("%s model, loss: %s", name, loss_name)
    anchored = kind == "cost" and not partial and loss_name == "bt" and s.anchor_zero  # the zero fitted (fit_zero)
    pairs = oriented_pairs(df, kind)
    train_df, eval_df = common.split_eval(pairs, s.eval_fraction, s.seed)
    if anchored and not len(eval_df):
        from lara.config import ConfigError

        raise ConfigError("train.cost.anchor_zero fits the cost scale's zero on held-out pairs, but "
                          f"train.cost.eval_fraction = {s.eval_fraction} holds none out: raise it, or set "
                          "anchor_zero: false (tau then has no anchored meaning)")
    train_data, eval_data = ((prefix_pairs(train_df, tokenizer, s.max_length, s.prefixes_per_pair, s.seed),
                              prefix_pairs(eval_df, tokenizer, s.max_length, None, s.seed + 1)) if partial else
                             (tokenized_pairs(df, tokenizer, s.max_length) for df in (train_df, eval_df)))
    log.info("%s model: %d training pairs, %d held-out pairs", name, len(train_data["chosen_ids"]),
             len(eval_data["chosen_ids"]))
    model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=1,
                                                               dtype=common.torch_dtype(s.dtype))
    log.info("the %s model's score head is new: a load report listing score.weight as MISSING (newly initialized) "
             "is expected, it is what this step trains", name)
    model.config.pad_token_id = tokenizer.pad_token_id
    has_eval = len(eval_data["chosen_ids"]) > 0
    trainer = common.quiet_trainer(make_trainer_class()(
        model=model, args=common.training_arguments(RewardConfig, s, checkpoints, has_eval=has_eval,
                                                    max_length=s.max_length, center_rewards_coefficient=None),
        train_dataset=Dataset.from_dict({k: train_data[k] for k in COLUMNS}),
        eval_dataset=Dataset.from_dict({k: eval_data[k] for k in COLUMNS}) if has_eval else None,
        processing_class=tokenizer, kind=kind, regularization=s.regularization, cost_loss=loss_name))
    inputs = {"init_model": model_path, "data": data_path}
    metrics = common.fit(trainer, checkpoints, s, inputs) | {"n_train_pairs": len(train_data["chosen_ids"])}
    offset = None
    if has_eval:
        hi, lo = score_pairs(trainer.model, tokenizer, eval_data)
        metrics["held_out"] = evaluate_pairs(hi, lo, eval_data, kind)
        log.info("held-out: %s", metrics["held_out"])
        if kind == "cost" and not partial:
            scores = np.concatenate([hi, lo])
            unsafe = np.concatenate([eval_data["chosen_sign"], eval_data["rejected_sign"]]) > 0
            offset = fit_zero(scores, unsafe) if anchored else 0.0
            metrics["zero"] = zero_report(scores, unsafe, offset, seed=s.seed) | {
                "anchored": anchored, "how": "fitted on the held-out pairs' safety labels" if anchored else
                "as trained" + (" (Safe-RLHF's sign terms anchor c > 0 as unsafe)" if loss_name == "safe_rlhf"
                                else " (train.cost.anchor_zero is false: tau has no anchored meaning)")}
            log.info("cost scale's zero (accuracies of c > 0 as unsafe, held out): %s", metrics["zero"])

    scorer = {"kind": name, "role": kind, "loss": loss_name, "append_eos": not partial, "max_length": s.max_length,
              "template": PROMPT_TEMPLATE, "score": "head at the last real token"}
    if offset:
        scorer |= {"offset": offset, "score": "head at the last real token, minus offset (the fitted zero)"}
    return common.save_trained(trainer, tokenizer, out, metrics, kind=name, settings=s, inputs=inputs,
                               scorer=scorer)


def command(settings_cls: type[common.TrainSettings], kind: str | None = None):
    """The ``add_arguments`` and ``run`` of ``lara train-reward`` and ``lara train-cost`` (``kind``), and of ``lara
    train-partial`` (no ``kind``: its ``--kind`` names it; the partial models of PARGS)."""

    def add_arguments(parser) -> None:
        if kind is None:
            parser.add_argument("--kind", required=True, choices=KINDS)
        common.add_common_arguments(parser, settings_cls, model_help="initial model (the SFT model)")

    def run(args) -> None:
        s = read_settings(args, settings_cls)
        train_preference_model(kind or args.kind, args.model, args.data, args.checkpoints, args.out, s,
                               partial=kind is None)

    return add_arguments, run
