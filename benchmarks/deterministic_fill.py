"""Deterministic mode's NaN fill of ``torch.empty`` (``torch.utils.deterministic.fill_uninitialized_memory``)
on the training step every TRL SFT run takes: TRL's fused log-probability head, forward and backward.

    python benchmarks/deterministic_fill.py [--tokens 1600] [--vocab 1024] [--hidden 64] [--repeats 10]

The head allocates a scratch tile of 4,096 tokens x 32,768 vocabulary columns per call whatever the model's
vocabulary; with the fill on, every page of it is written with NaN before the projection overwrites the part it
uses. Times the head with the fill on (torch's default under ``use_deterministic_algorithms``) and off (what
``lara.runtime.deterministic_algorithms`` sets), checks both give bit-identical log-probabilities and
gradients, and prints the ratio, plus the floor: the same projection as one plain ``log_softmax`` over
materialised logits (what the fused head exists to avoid at a large vocabulary; at the toy's it is cheap).
The defaults are the toy SFT's shapes (batch 32 of about 50 tokens, vocabulary 1,024, hidden size 64).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread, as every toy job gets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=1600)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()

    import torch
    import torch.utils.deterministic
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE as CHUNK

    from lara.runtime import deterministic_algorithms

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    deterministic_algorithms(torch)
    gen = torch.Generator().manual_seed(0)
    hidden0 = torch.randn(args.tokens, args.hidden, generator=gen)
    weight0 = torch.randn(args.vocab, args.hidden, generator=gen) * 0.1
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=gen)

    def fused():
        hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
        logp = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, CHUNK)[0]
        logp.sum().backward()
        return logp.detach(), hidden.grad, weight.grad

    def plain():
        hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
        logp = torch.log_softmax(hidden @ weight.t(), dim=-1).gather(1, targets[:, None])[:, 0]
        logp.sum().backward()
        return logp.detach(), hidden.grad, weight.grad

    def timed(fn, fill: bool):
        torch.utils.deterministic.fill_uninitialized_memory = fill
        out = fn()  # warm-up, and the result compared below
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), out

    with_fill, a = timed(fused, True)
    without, b = timed(fused, False)
    floor, c = timed(plain, False)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), "the fill changed the result"
    torch.testing.assert_close(c[0], b[0], rtol=1e-5, atol=1e-5)  # the same log-probabilities, another kernel

    print(f"TRL's fused log-prob head, forward + backward, {args.tokens} tokens x vocabulary {args.vocab} "
          f"(scratch tile {min(args.tokens, 4096)} x {CHUNK}), one thread, median of {args.repeats}:")
    print(f"  NaN fill on (torch's deterministic default): {with_fill * 1e3:8.1f} ms")
    print(f"  NaN fill off (lara):                         {without * 1e3:8.1f} ms   "
          f"{with_fill / without:.1f}x faster, bit-identical outputs and gradients")
    print(f"  floor, plain log_softmax over the logits:    {floor * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
