"""A text scorer as a stepping scorer of token-level decoding (:mod:`lara.decode.rgtg`).

ARGS scores each of the policy's k candidate tokens z by r(x, y z) − λ·c(x, y z). The steppers of rgtg read token
ids, so their reward and cost models must share the policy's tokenizer. :class:`TextScorerStepper` lifts that: it
keeps each row's generated tokens, and for every candidate decodes generated + z to text exactly as the decoder
writes its responses (``tokenizer.decode(tokens, skip_special_tokens=True).strip()``) and asks any text scorer
(``score(prompts, responses)``: hatesonar, the fluency reward, the toy oracle, ...) for the B·k scores in one call.
So the score of a candidate is the scorer's score of the response the decoder would return if it stopped after
that candidate; an EOS candidate scores the response as it stands.

Cost: one decode of the whole prefix per candidate (a prefix is re-decoded, not extended, because byte-level BPE
pieces only become text together) plus one scorer call of B·k texts per step. Rows that have finished (``alive``
false at a commit) are not scored again: their candidates get 0, which the decoder ignores (it emits padding for
them).
"""

from __future__ import annotations

from collections.abc import Sequence


class TextScorerStepper:
    """``start(ids, mask)``, ``candidates(top_ids) -> (B, k)``, ``commit(tokens, choice, alive)``, as the steppers of
    :mod:`lara.decode.rgtg`, over a text scorer; ``prompts``: the batch's prompts (plain user text, in row order)."""

    def __init__(self, scorer, tokenizer, prompts: Sequence[str]):
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.prompts = list(prompts)
        self.dev = "cpu"

    def start(self, ids, mask) -> None:
        if ids.shape[0] != len(self.prompts):
            raise ValueError(f"a batch of {ids.shape[0]} rows for {len(self.prompts)} prompts")
        self.dev = ids.device
        self.generated: list[list[int]] = [[] for _ in self.prompts]
        self.alive = [True] * len(self.prompts)

    def texts(self, row: int, cand: Sequence[int]) -> list[str]:
        """The response of ``row`` after each candidate token, as the decoder would write it."""
        head = self.generated[row]
        return [self.tokenizer.decode([*head, int(z)], skip_special_tokens=True).strip() for z in cand]

    def candidates(self, cand):
        import torch

        b, k = cand.shape
        rows = [i for i in range(b) if self.alive[i]]
        out = torch.zeros(b, k, dtype=torch.float32)
        if rows:
            listed = cand.tolist()
            prompts = [self.prompts[i] for i in rows for _ in range(k)]
            responses = [t for i in rows for t in self.texts(i, listed[i])]
            scores = torch.as_tensor(self.scorer.score(prompts, responses), dtype=torch.float32)
            out[rows] = scores.reshape(len(rows), k)
        return out.to(cand.device)

    def commit(self, tokens, choice, alive) -> None:
        for i, (token, live) in enumerate(zip(tokens.tolist(), alive.tolist(), strict=True)):
            if live:
                self.generated[i].append(int(token))
            self.alive[i] = bool(live)
