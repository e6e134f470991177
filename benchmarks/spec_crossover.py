"""Where speculative decoding stops paying in the simulator: Llama-3-8B on one H100 SXM,
closed-loop users (``--concurrency C``) sending 128-token prompts for 256 tokens (short
contexts: attention's KV reads, which a verify shares over its k + 1 tokens, are small), plain
vLLM against vLLM with EAGLE (k, acceptance 0.7 a position; ``--speculative-config``).
The speed-up is the output throughput's ratio (equal users: equal load offered); it falls
as the batch grows (each verify computes k + 1 tokens a request, so the step turns
compute-bound sooner, and the drafting's passes grow with the batch) and crosses 1 where
the verify's extra compute outweighs the E tokens it emits.

    python benchmarks/spec_crossover.py [--k 4] [--acceptance 0.7] [--users 1,8,...]

Not a test: prints one row per concurrency and the crossing, interpolated in log C.
"""

from __future__ import annotations

import argparse
from itertools import pairwise

import numpy as np

import perfmodel as pm
from perfmodel.serving import traffic
from perfmodel.serving.engines.speculation_flags import from_vllm
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.simulate import simulate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--acceptance", default="0.7")
    parser.add_argument("--method", default="eagle")
    parser.add_argument("--users", default="1,16,64,128,192,256")
    parser.add_argument("--rounds", type=int, default=2, help="requests per user")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    args = parser.parse_args()
    m, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    spec = from_vllm(f'{{"method": "{args.method}", "num_speculative_tokens": {args.k}}}',
                     (args.acceptance, None))
    rows = []
    print(f"{'users':>6} {'plain tok/s':>12} {'spec tok/s':>12} {'speed-up':>9} "
          f"{'plain TPOT ms':>14} {'spec TPOT ms':>13} {'accept len':>10}")
    for c in (int(x) for x in args.users.split(",")):
        reqs = traffic.generate(c * args.rounds, concurrency=c, input_len=args.input_len,
                                output_len=args.output_len, seed=0)
        plain = simulate(m, hw, reqs, engine=EngineConfig(max_num_seqs=max(256, c)))
        fast = simulate(m, hw, reqs, engine=EngineConfig(max_num_seqs=max(256, c),
                                                         speculative=spec))
        up = fast.throughput_tokens_per_s / plain.throughput_tokens_per_s
        rows.append((c, up))
        length = fast.summary()["speculation"]["acceptance_length"]
        print(f"{c:6d} {plain.throughput_tokens_per_s:12.0f} "
              f"{fast.throughput_tokens_per_s:12.0f} {up:9.3f} "
              f"{plain.tpot_s.mean() * 1e3:14.2f} {fast.tpot_s.mean() * 1e3:13.2f} "
              f"{length:10.3f}", flush=True)
    for (c0, u0), (c1, u1) in pairwise(rows):
        if u0 >= 1 > u1:
            f = (u0 - 1) / (u0 - u1)
            at = np.exp(np.log(c0) + f * (np.log(c1) - np.log(c0)))
            print(f"speed-up crosses 1 between {c0} and {c1} users (about {at:.0f})")
            return
    print("speed-up does not cross 1 in the users swept")


if __name__ == "__main__":
    main()
