"""The serving simulator's entry: ``simulate`` serves a stream of requests on ``plan.dp``
replicas of one engine (and, under data-parallel attention, each of the ``ep`` attention
ranks), dealt to them by a router (``serving.fleet``), each replica's engine run by the
event loop (``serving.engine_loop``) and priced by the core (``serving.pricing``), then
seen from the client (the API server's and the stream's host time: ``serving.host_time``;
a conversation's later turns: ``serving.sessions``).
"""

from __future__ import annotations

from dataclasses import replace

import perfmodel.serving.engines.speculation as speculation
from perfmodel.schedules.assumptions import check_plan
from perfmodel.serving import host_time, pipeline, sessions
from perfmodel.serving.engine_loop import Progress
from perfmodel.serving.engines import lora
from perfmodel.serving.engines.vllm import EngineConfig, context_limit
from perfmodel.serving.fleet import routers
from perfmodel.serving.fleet.replicas import merge, run_replicas
from perfmodel.serving.pricing import kv_pool
from perfmodel.serving.requests import Requests
from perfmodel.serving.results import SimResult
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload


def simulate(model: Model, hw: Hardware, requests: Requests,
             plan: Parallelism | None = None, engine: EngineConfig | None = None,
             workload: Workload | None = None, progress: Progress | None = None,
             label: str = "", router: str = "round-robin", workers: int = 1,
             edge: int | None = None, cluster: str | None = None,
             autoscale: object = None, startup_s: float | None = None) -> SimResult:
    """Serve ``requests`` on ``plan.dp`` replicas of ``model`` on ``hw`` (dtypes from
    ``workload``, default as the checkpoint stores them) with ``engine``'s scheduler,
    behind ``router`` (``serving.fleet``; ``workers`` processes for replicas run apart, on
    the Dask cluster ``cluster`` when given: ``serving.fleet.cluster``).
    ``progress(done, total, clock_s)`` is called as the simulation advances: requests
    finished and the simulated clock, per engine (dp engines run one after another, each
    ``total`` of the requests; engines in lockstep together). ``edge`` 0 / 1: every step's
    GPU time priced at the low / high edge of its 80% band (``serving.bands``).
    ``autoscale`` (``fleet.autoscale.Policy``): the replica count set by that autoscaler
    over the run instead of ``plan.dp`` (``fleet.scaling``), a new replica serving
    ``startup_s`` after its launch (None: ``fleet.startup``'s estimate)."""
    plan = plan or Parallelism()
    engine = engine or EngineConfig()
    workload = workload or Workload.for_model(model)
    pipeline.check(plan, engine)
    if engine.speculative is not None:
        speculation.check(engine, plan, model)
    lora.check_requests(requests, getattr(engine, "lora", None), "simulate")
    check_plan(hw, model, plan)
    limit = context_limit(model, engine)
    longest = int((requests.input_tokens + requests.output_tokens).max())
    if longest > limit:
        raise SpecError(f"simulate: a request of {longest} tokens (input + output) is longer "
                        f"than the context limit {limit} (--max-model-len / the model's "
                        "max_position_embeddings)")
    whole = _whole_len(engine, requests, longest)
    if not engine.chunked_prefill and whole > engine.max_num_batched_tokens and \
            engine.name != "sglang":      # SGLang always takes a prefill batch's first prompt
        raise SpecError(f"--max-num-batched-tokens: {engine.max_num_batched_tokens} cannot hold "
                        f"a {'prompt' if engine.name == 'trtllm' else 'request'} of {whole} "
                        "tokens whole, which chunked prefill off needs (vLLM refuses a budget "
                        "below max_model_len without chunking; TensorRT-LLM a prompt longer "
                        "than max_num_tokens)")
    engines = plan.dp * plan.attention_ways     # more than requests: the rest idle
    if autoscale is not None:
        from perfmodel.serving.fleet import scaling

        scaling.check(router, requests, plan.dp, plan.attention_ways, cluster)
        engines = autoscale.max_replicas
    one = replace(plan, dp=1)
    pool = kv_pool(model, hw, one, workload, engine)
    if -(-longest // engine.block_size) > pool.blocks:
        raise SpecError(f"simulate: a request of {longest} tokens needs more KV blocks than "
                        f"the pool's {pool.blocks} on {hw.name}")
    engine = engine.resolved(pool.blocks, limit)
    routers.check(router, workers, requests, engines, plan.attention_ways, cluster)
    if engines > 1 and router != "session-affinity":    # a session's turns run apart
        requests = sessions.at_nominal_times(requests)
    client, (requests, api_s) = requests, sessions.admitted(requests, engine.host)
    scaled = None
    if autoscale is None:
        parts, runs = run_replicas(model, hw, one, workload, engine, requests, engines,
                                   pool.blocks, router, workers, progress, edge, cluster)
    else:
        parts, runs, scaled = _autoscaled(model, hw, one, workload, engine, requests, pool,
                                          router, autoscale, startup_s, progress, edge)
    info = {"engines": engines, "kv_pool": pool, "plan": plan.describe(), "engine": engine,
            "router": router, "steps_priced": sum(r.pricer.priced for r in runs),
            "price_calls": sum(r.pricer.calls for r in runs)}
    if engine.speculative is not None:
        info["speculation"] = speculation.summary([r.state for r in runs])
    res = merge(requests, parts, runs, pool.blocks, label, info)
    if scaled is not None:
        res.info["autoscale"] = scaled
    if getattr(engine, "lora", None) is not None:
        res.info["lora"] = lora.summary(runs, engine.lora, lora.used(requests),
                                        runs[0].pricer.lora.load_s)
    if plan.pp > 1:
        res = pipeline.with_stages(res, runs[0])
    return sessions.client_side(host_time.client_side(res, client, requests, engine.host),
                                res.arrival_s, client, api_s)


def _autoscaled(model: Model, hw: Hardware, one: Parallelism, workload: Workload,
                engine: EngineConfig, requests: Requests, pool: object, router: str,
                policy: object, startup_s: float | None, progress: Progress | None,
                edge: int | None) -> tuple:
    """``fleet.replicas.run_autoscaled`` with the replicas' start-up (``fleet.startup``
    from the weights on a replica's devices, unless ``startup_s`` is given)."""
    from perfmodel.serving.fleet.replicas import run_autoscaled
    from perfmodel.serving.fleet.startup import startup

    if startup_s is None:
        startup_s = startup(pool.weights_bytes * one.group * one.pp, engine.max_num_seqs,
                            engine.cuda_graphs).total_s
    return run_autoscaled(model, hw, one, workload, engine, requests, pool.blocks, router,
                          policy, startup_s, progress, edge)


def _whole_len(engine: EngineConfig, requests: Requests, longest: int) -> int:
    """The tokens one step must hold whole with chunked prefill off: vLLM's rule is the
    longest request (prompt + output: its budget must reach max_model_len); TensorRT-LLM's
    is the longest prompt alone (``tensorrt_llm/llmapi/llm.py`` ``_check_arguments``:
    prompt length + query length against ``max_num_tokens``, the output never counted; a
    generating request costs one token of the step)."""
    return int(requests.input_tokens.max()) if engine.name == "trtllm" else longest
