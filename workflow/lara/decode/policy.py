"""``lara generate-policy``: one response per test prompt from a fine-tuned policy (SFT,
Safe-RLHF, SafeDPO), sampled with the experiment's generation settings, in the decoders'
output schema (``prompt_id, prompt, response, n_tokens, method, setting, lambda``).

A fine-tuned policy has no lambda of its own: ``setting`` is ``policy`` and ``lambda`` is NaN.
"""

from __future__ import annotations

import logging

from lara.sample import GenerationSettings, add_tensor_parallel_argument
from lara.settings import add_settings_arguments, read_settings

log = logging.getLogger(__name__)

HELP = "sample one response per test prompt from a fine-tuned policy (SFT, Safe-RLHF, SafeDPO)"

POLICIES = ("sft", "safe_rlhf", "safedpo")  # the base policies; decode.policy_variants name others
DECODER_COLUMNS = ["prompt_id", "prompt", "response", "n_tokens", "method", "setting", "lambda"]


def policy_name(text: str) -> str:
    """A policy's name as the config writes it (a base policy or a variant: lower case, digits and _)."""
    import argparse
    import re

    if not re.fullmatch(r"[a-z][a-z0-9_]*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a policy name (a base policy, {', '.join(POLICIES)}, or a "
                                         "decode.policy_variants name: lower-case letters, digits and _)")
    return text


def add_arguments(parser) -> None:
    parser.add_argument("--policy", required=True, type=policy_name,
                        help=f"which policy (names the method column): {', '.join(POLICIES)} or a "
                             "decode.policy_variants name")
    parser.add_argument("--model", required=True, help="the policy's model directory")
    parser.add_argument("--prompts", required=True, help="test prompts (prompt_id, prompt)")
    add_settings_arguments(parser, GenerationSettings)
    add_tensor_parallel_argument(parser)
    parser.add_argument("--out", required=True, help="output parquet: one response per prompt")


def run(args) -> None:
    from lara import identity
    from lara.read.files import read_table, write_table
    from lara.sample import make_generator

    s = read_settings(args, GenerationSettings)
    df = read_table(args.prompts, required=("prompt_id", "prompt"))
    prompts = identity.prompt_set(df, f"--prompts {args.prompts}", per_prompt=1)  # each prompt once, before decoding
    gen = make_generator(s.backend, args.model, s.dtype, args.tensor_parallel)
    log.info("%s policy: one response to each of %d prompts (%s)", args.policy, len(df), s)
    out = gen.generate(df["prompt_id"].tolist(), df["prompt"].tolist(), 1, s, s.seed)
    out = out.drop(columns=["sample_id"])
    out["method"], out["setting"], out["lambda"] = args.policy, "policy", float("nan")
    log.info("mean response length %.1f tokens", out["n_tokens"].mean())
    made = identity.stamp("responses", args.out, method=args.policy, setting="policy",
                          role=identity.role_of(args.prompts), made_from={"--prompts": args.prompts},
                          prompts=prompts.record())
    write_table(out[DECODER_COLUMNS], args.out, {"method": args.policy, "model": args.model,
                                                 "settings": s.__dict__, "seed": s.seed, identity.KEY: made})
