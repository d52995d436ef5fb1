"""``lara train-value``: CD-Q value functions for reward or cost.

The value model is a causal LM (initialised from SFT) whose vocabulary-sized head gives
Q(prefix, z) for every next token z in one forward pass: Q(prefix, z) = logits[prefix][z].
It is trained on responses sampled from the SFT policy and scored by the reward (or cost)
model. For response token y_t following prefix x, y_<t:

* target ``cdq`` (CD-Q, Mudgal et al.): Q(x y_<t, y_t) -> sum_z pi_ref(z | x y_<=t) * Qbar(x y_<=t, z)
  for a non-final token, where Qbar is the current model without gradient; the final
  token (EOS, or the last one when truncated) regresses on the sequence's score;
* target ``fudge``: every Q(x y_<t, y_t) regresses on the sequence's final score.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from lara.scoring import encode, last_token_index, pad_batch
from lara.settings import read_settings
from lara.template import PROMPT_TEMPLATE
from lara.train import common

log = logging.getLogger(__name__)

HELP = "train a CD-Q value function (vocabulary-sized value head) for the reward or the cost"
TARGETS = ("cdq", "fudge")


def value_targets(q_logits, ref_logprobs, input_ids, response_mask, final, target: str = "cdq"):
    """Predictions and targets for every response token (pure torch).

    q_logits: (B, L, V) value-model logits; ref_logprobs: (B, L, V) log pi_ref (only used by
    ``cdq``); input_ids: (B, L); response_mask: (B, L) 1 on response tokens (EOS included);
    final: (B,) sequence scores. Position t of the logits scores token t + 1, so returns
    (pred, tgt, mask), each (B, L - 1): pred[b, t] = Q(ids[b, :t+1], ids[b, t+1]).
    """
    import torch

    nxt = input_ids[:, 1:]
    pred = q_logits[:, :-1].gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
    mask = response_mask[:, 1:].to(pred.dtype)
    # the final response token of each row: the last position where the response mask is 1
    is_last = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0) == last_token_index(mask).unsqueeze(1)
    tgt = final.to(pred.dtype).unsqueeze(1).expand_as(pred).clone()
    if target == "cdq":
        with torch.no_grad():
            bootstrap = (ref_logprobs[:, 1:].exp() * q_logits[:, 1:].detach()).sum(-1)
        tgt = torch.where(is_last, tgt, bootstrap.to(pred.dtype))
    elif target != "fudge":
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    return pred, tgt, mask


def value_loss(pred, tgt, mask, tokens=None, world: int = 1):
    """The mean squared error over the response tokens: over ``tokens`` (the job's count; default this batch's),
    times ``world``, the processes whose gradients are averaged (so the mean is as one process computes it)."""
    return ((pred - tgt) ** 2 * mask).sum() / (mask.sum() if tokens is None else tokens).clamp(min=1) * world


def make_value_trainer(ref_model, target: str):
    import torch
    from transformers import Trainer

    class ValueTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            ids, attn = inputs["input_ids"], inputs["attention_mask"]
            q = model(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()
            ref = None
            if target == "cdq":
                with torch.no_grad():
                    ref = torch.log_softmax(ref_model(input_ids=ids, attention_mask=attn, use_cache=False)
                                            .logits.float(), dim=-1)
            pred, tgt, mask = value_targets(q, ref, ids, inputs["response_mask"], inputs["final"], target)
            world = self.accelerator.num_processes
            tokens = self.accelerator.reduce(mask.sum().detach().float(), reduction="sum") if world > 1 else None
            loss = value_loss(pred, tgt, mask, tokens, world)
            return (loss, {"pred": pred}) if return_outputs else loss

    return ValueTrainer


def collate(pad_id: int):
    import torch

    def fn(examples):
        ids, attn = pad_batch([e["input_ids"] for e in examples], pad_id)
        resp = torch.zeros_like(ids)
        for i, e in enumerate(examples):
            resp[i, e["response_start"]:len(e["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": attn, "response_mask": resp,
                "final": torch.tensor([e["final"] for e in examples], dtype=torch.float)}

    return fn


def tokenize_samples(df: pd.DataFrame, tokenizer, column: str, max_length: int) -> list[dict]:
    out = []
    for p, r, y in zip(df["prompt"], df["response"], df[column], strict=True):
        head = encode(tokenizer, p, "", False)
        ids = encode(tokenizer, p, r, True, max_length)
        if len(ids) > len(head):
            out.append({"input_ids": ids, "response_start": len(head), "final": float(y)})
    return out


def evaluate_values(model, tokenizer, examples: list[dict], batch_size: int = 64) -> dict:
    """Correlation between predicted Q of taken tokens and the realised final scores, at the
    first, middle and last response token of held-out samples."""
    import torch

    model.eval()
    dev = next(model.parameters()).device
    picks = {"first": [], "middle": [], "last": []}
    finals = []
    with torch.inference_mode():
        for lo in range(0, len(examples), batch_size):
            batch = collate(tokenizer.pad_token_id)(examples[lo:lo + batch_size])
            q = model(input_ids=batch["input_ids"].to(dev), attention_mask=batch["attention_mask"].to(dev)).logits
            pred, _, mask = value_targets(q.float(), None, batch["input_ids"].to(dev),
                                          batch["response_mask"].to(dev), batch["final"].to(dev), "fudge")
            for row in range(pred.shape[0]):
                idx = torch.nonzero(mask[row]).squeeze(-1).cpu().numpy()
                vals = pred[row].cpu().numpy()
                for key, at in zip(picks, (idx[0], idx[len(idx) // 2], idx[-1]), strict=True):
                    picks[key].append(vals[at])
            finals += batch["final"].tolist()
    finals = np.asarray(finals)
    return {f"corr_{k}": float(np.corrcoef(v, finals)[0, 1]) for k, v in picks.items()} | {"n": len(finals)}


def train_value(kind: str, model_path: str, data_path: str, checkpoints: str, out: str,
                s: common.TrainSettings) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainingArguments

    tokenizer, df = common.start(model_path, s, data_path)
    if kind not in df.columns:
        from lara.read.files import DataError

        raise DataError(f"{data_path}: missing column {kind!r} (the {kind} scores of the samples)")
    train_df, eval_df = common.split_eval(df, s.eval_fraction, s.seed)
    train_ex = tokenize_samples(train_df, tokenizer, kind, s.max_length)
    eval_ex = tokenize_samples(eval_df, tokenizer, kind, s.max_length)
    log.info("value_%s (%s target): %d training and %d held-out samples", kind, s.target, len(train_ex), len(eval_ex))
    dtype = common.torch_dtype(s.dtype)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(common.device()).eval().requires_grad_(False)
    args = common.training_arguments(TrainingArguments, s, checkpoints, has_eval=False, remove_unused_columns=False)
    trainer = common.quiet_trainer(make_value_trainer(ref, s.target)(
        model=model, args=args, train_dataset=Dataset.from_list(train_ex),
        data_collator=collate(tokenizer.pad_token_id)))
    inputs = {"init_model": model_path, "samples": data_path}
    metrics = common.fit(trainer, checkpoints, s, inputs) | {"n_train": len(train_ex)}
    if eval_ex:
        metrics["held_out"] = evaluate_values(trainer.model, tokenizer, eval_ex)
        log.info("held-out value correlations: %s", metrics["held_out"])
    scorer = {"kind": f"value_{kind}", "role": kind, "target": s.target, "max_length": s.max_length,
              "template": PROMPT_TEMPLATE, "score": "lm_head logits: Q(prefix, z) for every next token z"}
    return common.save_trained(trainer, tokenizer, out, metrics, kind=f"value_{kind}", settings=s, inputs=inputs,
                               scorer=scorer)


def add_arguments(parser) -> None:
    parser.add_argument("--kind", required=True, choices=("reward", "cost"))
    common.add_common_arguments(parser, common.ValueSettings, model_help="initial model and pi_ref (the SFT model)")


def run(args) -> None:
    s = read_settings(args, common.ValueSettings)
    train_value(args.kind, args.model, args.data, args.checkpoints, args.out, s)
