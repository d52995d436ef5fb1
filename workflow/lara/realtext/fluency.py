"""A fluency reward: the mean per-token log-likelihood of a response given its prompt under a causal LM,

    r(x, y) = 1/(|y| + 1) * sum_{t=1}^{|y|+1} log p(y_t | x, y_<t),   y_{|y|+1} = EOS,

on the sequence every other scorer reads (:func:`lara.scoring.encode`), so it scores exactly the text the decoders
produce. docs/real-text.md ("Reward: the fluency scorer") says why the EOS term (an empty response scores
log p(EOS | x), never NaN), why this reward, and its known weakness (with the policy as the scorer it favours
pi_ref's most typical, often repetitive text; a stronger, different LM is the fix).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

ROLES = ("reward",)


class FluencyScorer:
    """Mean log-likelihood per response token (EOS included) under the causal LM at ``path``."""

    def __init__(self, path: str | Path, device: str | None = None, batch_size: int = 16, dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = Path(path)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        if self.tokenizer.eos_token_id is None:
            from lara.settings import ConfigError

            raise ConfigError(f"fluency scorer {path}: the tokenizer has no EOS token (the reward of a complete "
                              "response ends with it)")
        self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype=getattr(torch, dtype)).to(self.device).eval()
        self.batch_size = batch_size

    def tokens(self, prompt: str, response: str) -> tuple[list[int], int]:
        """The ids of prompt + response + EOS (:func:`lara.scoring.encode`) and where the response starts (where they
        stop agreeing with the prompt's own ids; at least one token, EOS, is the response's)."""
        from lara.scoring import encode

        head = encode(self.tokenizer, prompt, "", False)
        full = encode(self.tokenizer, prompt, response, True)
        return full, max(1, min(len(os.path.commonprefix([head, full])), len(full) - 1))

    def score_ids(self, seqs: list[tuple[list[int], int]], progress: str | None = None) -> np.ndarray:
        """Mean log p of tokens ``start:`` of each sequence, in batches of similar lengths (right-padded, positions
        from the mask); the LM head is applied to the response positions only."""
        import torch
        from tqdm import tqdm

        from lara.scoring import pad_batch, position_ids

        out = np.empty(len(seqs))
        order = np.argsort([len(s) for s, _ in seqs], kind="stable")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        backbone = getattr(self.model, self.model.base_model_prefix)
        head = self.model.get_output_embeddings()
        bar = tqdm(total=len(seqs), desc=progress, unit="response", mininterval=10, disable=progress is None)
        with torch.inference_mode(), bar:
            for lo in range(0, len(seqs), self.batch_size):
                idx = order[lo:lo + self.batch_size]
                ids, mask = pad_batch([seqs[i][0] for i in idx], pad, "right")
                ids, mask = ids.to(self.device), mask.to(self.device)
                hidden = backbone(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                                  use_cache=False).last_hidden_state
                for row, i in enumerate(idx):
                    seq, start = seqs[i]
                    # token t is predicted at position t - 1
                    logits = head(hidden[row, start - 1:len(seq) - 1]).float()
                    target = ids[row, start:len(seq)]
                    logp = torch.log_softmax(logits, -1).gather(1, target[:, None]).squeeze(1)
                    out[i] = logp.mean().item()
                bar.update(len(idx))
        if not np.isfinite(out).all():
            raise RuntimeError(f"fluency scorer {self.path}: non-finite log-likelihoods")
        return out

    def score(self, prompts: Sequence[str], responses: Sequence[str], progress: str | None = None) -> np.ndarray:
        return self.score_ids([self.tokens(p, r) for p, r in zip(prompts, responses, strict=True)], progress)


def fluency_role_problem(role: str, argument: str | None = None) -> str | None:
    """The problem of fluency given another role than a reward, or no model to score with (None: fine)."""
    if role not in ROLES:
        return (f"fluency scorer: role {role!r}; fluency is a reward (higher = more fluent), its roles are "
                f"{', '.join(ROLES)}")
    if not argument:
        return ("fluency scorer: name the causal LM that scores, as fluency:<model directory> (e.g. "
                "fluency:results/real-text/import/smollm2-135m-instruct)")
    return None


def fluency_scorer(role: str = "reward", argument: str | None = None, batch_size: int = 16, dtype: str = "float32",
                   device: str | None = None, **_options) -> FluencyScorer:
    """Factory of the named scorer ``fluency``: ``fluency:<causal LM directory>`` (e.g. the imported SmolLM2)."""
    from lara.config.refs import require_model
    from lara.settings import ConfigError

    problem = fluency_role_problem(role, argument)
    if problem:
        raise ConfigError(problem)
    require_model(argument, "fluency scorer")
    return FluencyScorer(argument, device=device, batch_size=batch_size, dtype=dtype)


fluency_scorer.check = fluency_role_problem  # lara.scoring.spec_problem
fluency_scorer.argument_is_model = True  # lara.config.refs: its argument is a model folder, checked as a reference
