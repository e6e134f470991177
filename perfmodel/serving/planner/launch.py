"""How to start a planned deployment: the command lines for vLLM and SGLang and a
TensorRT-LLM config, each for one named engine version (``VERSIONS``), pure (no I/O).

Every flag emitted is one the named version's launcher defines: the lists are made from
the engines' source by ``reports/engines/make_flag_lists.py`` into ``engines/flags/`` and
the tests check every emitted command against them.

The rules, per engine version:

- vLLM 0.24.0 (``vllm/engine/arg_utils.py``): one server is TP x PP GPUs per attention
  rank times ``--data-parallel-size`` ranks; ``--enable-expert-parallel`` makes the
  experts' group TP x DP, inside that one server. Independent replicas are separate
  servers behind a router. A server beyond a node: data-parallel ranks spread over nodes
  with ``--data-parallel-size-local`` / ``--data-parallel-address`` /
  ``--data-parallel-rpc-port`` / ``--data-parallel-start-rank`` and ``--headless`` on the
  other nodes (``docs/serving/data_parallel_deployment.md``); a TP x PP group larger than a
  node with ``--nnodes`` / ``--node-rank`` / ``--master-addr`` / ``--master-port``, the
  other nodes ``--headless`` (``vllm/entrypoints/cli/serve.py: run_headless``).
- SGLang 0.5.14 (``python/sglang/srt/server_args.py``): ``--tp-size`` is every GPU of the
  server; ``--dp-size`` with ``--enable-dp-attention`` splits attention into that many
  ranks; ``--ep-size`` the experts' group; across nodes ``--nnodes`` / ``--node-rank`` /
  ``--dist-init-addr``. ``--max-running-requests`` is the server's total (its scheduler
  divides it by the DP ranks).
- TensorRT-LLM (``trtllm-serve``, PyTorch backend): the parallel sizes, batch and KV cache
  in the ``--extra_llm_api_options`` YAML; ``tensor_parallel_size`` every GPU of the
  server, ``enable_attention_dp`` for attention ranks; across nodes under ``mpirun`` with
  ``trtllm-llmapi-launch``.
- The scheduler: each server's batch, token budget, chunked prefill and queue policy in the
  engine's own names (``serving.planner.scheduler_flags``), said again in ``Launch.scheduler``.
- Quantization follows the checkpoint: a checkpoint whose config carries its own
  ``quantization_config`` (``format`` fp8 or mxfp4) needs no flag; ``--quantization fp8``
  (online W8A8-fp8) only for a bf16 checkpoint planned at fp8; fp8 KV is
  ``--kv-cache-dtype fp8`` (vLLM), ``fp8_e4m3`` (SGLang), ``kv_cache_config.dtype``.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from perfmodel.serving.planner.platforms import platform
from perfmodel.serving.planner.scheduler_flags import as_flags, as_yaml, said, scheduler
from perfmodel.specs.errors import SpecError

ENGINES = ("vllm", "sglang", "trtllm")
VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "main-00209af"}
FORMATS = {"bf16": "bf16", "fp8": "fp8", "mxfp4": "fp4", "int4": "int4", "int8": "int8",
           "fp4": "fp4"}   # checkpoint format -> the weights dtype it serves; bf16: unquantized
PORTS = {"vllm": 8000, "sglang": 30000, "trtllm": 8000}
DP_RPC_PORT, MASTER_PORT, DIST_INIT_PORT = 13345, 29501, 5000
HEAD = "HEAD_IP"                        # placeholder: the address of a server's node 0
NIXL = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                  separators=(",", ":"))


class LaunchError(SpecError):
    """A deployment no engine command can express (one line, for ``fail``)."""


@dataclass(frozen=True)
class Checkpoint:
    """The Hugging Face repository served and the format its weights ship in (``FORMATS``:
    fp8 / mxfp4 carry their own ``quantization_config``); ``base``: the pretrained
    checkpoint when ``repo`` is the family's chat/instruct one."""

    repo: str
    format: str = "bf16"
    base: str | None = None


@dataclass(frozen=True)
class Server:
    """One engine server, one copy of the model: ``dp`` attention ranks (MoE only) of
    ``tp`` x ``pp`` GPUs each, the experts over ``ep`` = tp x dp GPUs (1: the experts
    split by TP); ``max_num_seqs``: sequences the whole server runs at once;
    ``max_num_batched_tokens``: tokens per step (chunked-prefill budget) per rank."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep", "max_num_seqs", "max_num_batched_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise LaunchError(f"launch: {name}: expected an integer >= 1, got "
                                  f"{getattr(self, name)!r}")
        if self.ep not in (1, self.tp * self.dp):
            raise LaunchError(f"launch: ep: expected 1 or tp x dp = {self.tp * self.dp} "
                              f"(vLLM's expert-parallel group is TP x DP in one server), "
                              f"got {self.ep}")
        if self.dp > 1 and self.ep == 1:
            raise LaunchError(f"launch: dp: expected 1 without expert parallelism (attention "
                              f"data parallelism in a server needs ep = tp x dp; independent "
                              f"replicas are separate servers), got {self.dp}")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def per_rank(self, count: int) -> int:
        """A server-wide count shared by its ``dp`` attention ranks (rounded up)."""
        return -(-count // self.dp)


@dataclass(frozen=True)
class Deployment:
    """``replicas`` independent servers of ``server`` (the decode pool when
    ``prefill_replicas`` > 0, each prefill server shaped ``prefill`` or as ``server``);
    ``weights``: the planned weights (the checkpoint's format, or fp8 W8A8 from a bf16
    checkpoint); ``kv_dtype`` bf16 or fp8; ``versions``: engine -> version."""

    checkpoint: Checkpoint
    server: Server
    replicas: int = 1
    prefill_replicas: int = 0
    prefill: Server | None = None
    gpus_per_node: int = 8
    weights: str = "bf16"
    kv_dtype: str = "bf16"
    gpu_memory_utilization: float = 0.9
    versions: dict = field(default_factory=lambda: dict(VERSIONS))
    platform: str = "cuda"      # serving.planner.platforms: cuda, rocm, tpu, neuron, gaudi
    speculative: object = None  # ``engines.speculation.SpecDecode``: the drafter's flags

    def __post_init__(self) -> None:
        platform(self.platform)
        if self.checkpoint.format not in FORMATS:
            raise LaunchError(f"launch: checkpoint format: expected one of "
                              f"{', '.join(FORMATS)}, got {self.checkpoint.format!r}")
        if self.kv_dtype not in ("bf16", "fp8"):
            raise LaunchError(f"launch: kv_dtype: expected bf16 or fp8, got {self.kv_dtype!r}")
        if self.replicas < 1 or self.prefill_replicas < 0 or self.gpus_per_node < 1:
            raise LaunchError("launch: replicas >= 1, prefill_replicas >= 0 and "
                              "gpus_per_node >= 1 expected")
        for s in self.servers:
            if s.gpus > self.gpus_per_node and s.gpus % self.gpus_per_node:
                raise LaunchError(f"launch: a server of {s.gpus} GPUs spans nodes of "
                                  f"{self.gpus_per_node} unevenly")

    @property
    def servers(self) -> tuple[Server, ...]:
        return (self.server,) + ((self.prefill or self.server,) if self.prefill_replicas
                                 else ())

    @property
    def gpus(self) -> int:
        return self.replicas * self.server.gpus + self.prefill_replicas * (
            self.prefill or self.server).gpus

    def online_fp8(self) -> bool:
        """fp8 weights planned from a bf16 checkpoint: the engine quantizes them on load."""
        return self.weights == "fp8" and self.checkpoint.format == "bf16"


@dataclass(frozen=True)
class Step:
    """One shell command and where it runs; ``checked``: an engine launcher whose flags
    are in the engine's flag list (a router or a file is not)."""

    where: str
    command: str
    checked: bool = True


@dataclass(frozen=True)
class Launch:
    engine: str
    version: str
    steps: tuple[Step, ...]
    files: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    scheduler: tuple[str, ...] = ()     # per server shape: its scheduler settings

    def text(self) -> str:
        out = [f"# scheduler {line}" for line in self.scheduler]
        out += [f"# {name}:\ncat > {name} <<'EOF'\n{body.rstrip()}\nEOF" for name, body
                in self.files]
        out += [f"# {s.where}:\n{s.command}" for s in self.steps]
        return "\n".join(out + [f"# note: {n}" for n in self.notes])


def launch(dep: Deployment, engine: str) -> Launch:
    """The steps that start ``dep`` with ``engine`` (``ENGINES``) at ``dep.versions``."""
    if engine not in ENGINES:
        raise LaunchError(f"launch: engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    where = platform(dep.platform)
    rule = where.rule(engine)
    if rule.refused:
        return Launch(engine, dep.versions[engine], (), (),
                      (f"no launch on {where.name}: {rule.refused}",))
    notes = list(_weight_notes(dep, engine)) + list(_platform_notes(dep))
    steps, files, args = [], [], {}
    pools = [("prefill", dep.prefill or dep.server, dep.prefill_replicas)] \
        if dep.prefill_replicas else []
    pools.append(("decode" if dep.prefill_replicas else "", dep.server, dep.replicas))
    for role, server, _ in pools:
        if engine == "trtllm":
            name = f"extra-{role or 'llm-api'}.yaml"
            files.append((name, _trtllm_yaml(dep, server, role)))
            args[role] = ["trtllm-serve", dep.checkpoint.repo, "--backend", "pytorch",
                          "--extra_llm_api_options", name, "--host", "0.0.0.0"]
        else:
            args[role] = (_vllm if engine == "vllm" else _sglang)(dep, server, role)
    steps = _packed(dep, pools, args, engine)
    for role, server, count in pools:
        if server.gpus > dep.gpus_per_node:
            steps += _spanning(dep, server, count, role, args[role], engine)
    steps += _front(dep, engine)
    lines = tuple(f"({role or 'server'}{', ' + files[k][0] if engine == 'trtllm' else ''}): "
                 + said(scheduler(engine, server), engine)
                 for k, (role, server, _) in enumerate(pools))
    return Launch(engine, dep.versions[engine], tuple(steps), tuple(files), tuple(notes),
                  lines)


def launches(dep: Deployment) -> dict[str, Launch]:
    return {e: launch(dep, e) for e in ENGINES}


def _platform_notes(dep: Deployment):
    where = platform(dep.platform)
    if where.devices_env is None and any(s.gpus < dep.gpus_per_node for s in dep.servers):
        yield (f"{where.name}: a server of fewer {where.unit}s than a host's "
               f"{dep.gpus_per_node} runs on a host (VM) of its own size: {where.unit}s are "
               f"not split between servers here")


def _weight_notes(dep: Deployment, engine: str):
    fmt = dep.checkpoint.format
    if dep.weights not in (FORMATS[fmt], "fp8" if fmt == "bf16" else FORMATS[fmt]):
        yield (f"the plan priced {dep.weights} weights; {dep.checkpoint.repo} ships {fmt}, "
               f"which the engine serves as shipped (no flag converts it)")
    if dep.online_fp8() and engine == "trtllm":
        yield ("TensorRT-LLM does not quantize on load: serve an fp8 checkpoint (NVIDIA "
               "ModelOpt) for the planned fp8 weights")
    if dep.checkpoint.base and dep.checkpoint.base != dep.checkpoint.repo:
        yield f"chat workload: the instruct checkpoint; the pretrained one is {dep.checkpoint.base}"


def _vllm(dep: Deployment, s: Server, role: str) -> list[str]:
    args = ["vllm", "serve", dep.checkpoint.repo, "--tensor-parallel-size", str(s.tp)]
    args += ["--pipeline-parallel-size", str(s.pp)] if s.pp > 1 else []
    args += ["--data-parallel-size", str(s.dp)] if s.dp > 1 else []
    args += ["--enable-expert-parallel"] if s.ep > 1 else []
    args += ["--quantization", "fp8"] if dep.online_fp8() else []
    args += ["--kv-cache-dtype", "fp8"] if dep.kv_dtype == "fp8" else []
    args += [*as_flags(scheduler("vllm", s)),
             "--gpu-memory-utilization", f"{dep.gpu_memory_utilization:g}"]
    args += _speculative(dep, "vllm")
    return args + (["--kv-transfer-config", NIXL] if role else [])


def _sglang(dep: Deployment, s: Server, role: str) -> list[str]:
    args = ["python", "-m", "sglang.launch_server", "--model-path", dep.checkpoint.repo,
            "--tp-size", str(s.tp * s.dp)]
    args += ["--dp-size", str(s.dp), "--enable-dp-attention"] if s.dp > 1 else []
    args += ["--ep-size", str(s.ep)] if s.ep > 1 else []
    args += ["--pp-size", str(s.pp)] if s.pp > 1 else []
    args += ["--quantization", "fp8"] if dep.online_fp8() else []
    args += ["--kv-cache-dtype", "fp8_e4m3"] if dep.kv_dtype == "fp8" else []
    args += as_flags(scheduler("sglang", s))
    args += _speculative(dep, "sglang")
    if role:
        args += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl"]
    return [*args, "--host", "0.0.0.0"]


def _trtllm_yaml(dep: Deployment, s: Server, role: str) -> str:
    kv = {"free_gpu_memory_fraction": dep.gpu_memory_utilization} | (
        {"dtype": "fp8"} if dep.kv_dtype == "fp8" else {})
    lines = [f"tensor_parallel_size: {s.tp * s.dp}", f"pipeline_parallel_size: {s.pp}",
             f"moe_expert_parallel_size: {s.ep}",
             f"enable_attention_dp: {'true' if s.dp > 1 else 'false'}",
             *as_yaml(scheduler("trtllm", s)), "kv_cache_config:",
             *(f"  {k}: {v}" for k, v in kv.items()), *_speculative(dep, "trtllm")]
    if role:
        lines += ["cache_transceiver_config:", "  backend: NIXL"]
        lines += ["disable_overlap_scheduler: true"] if role == "prefill" else []
    return "\n".join(lines) + "\n"


def _packed(dep: Deployment, pools: list, args: dict, engine: str) -> list[Step]:
    """The servers that fit a node, packed onto nodes in pool order, each on its own GPUs
    and port; nodes laid out alike are shown once."""
    n, nodes, free = dep.gpus_per_node, [], 0
    where = platform(dep.platform)
    unit, env_name = where.unit, where.devices_env
    engine_env = list(where.rule(engine).env)
    for role, s, count in pools:
        for _ in range(count if s.gpus <= n else 0):
            if not nodes or free + s.gpus > n:
                nodes.append([])
                free = 0
            nodes[-1].append((role, s, free))
            free += s.gpus
    out, k = [], 0
    while k < len(nodes):
        last = k
        while last + 1 < len(nodes) and nodes[last + 1] == nodes[k]:
            last += 1
        place = f"node {k}" if last == k else f"nodes {k}-{last}, each"
        for i, (role, s, first) in enumerate(nodes[k]):
            gpus = ",".join(str(g) for g in range(first, first + s.gpus))
            env = [f"{env_name}={gpus}"] if s.gpus < n and env_name else []
            cmd = _wrap(engine, engine_env + env + args[role]
                        + ["--port", str(PORTS[engine] + i)], s.gpus, 1)
            name = f"{role} server" if role else "server"
            out.append(Step(f"{place}: {name} on {unit}{'s' if s.gpus > 1 else ''} {gpus}",
                            _join(cmd)))
        k = last + 1
    return out


def _spanning(dep: Deployment, s: Server, count: int, role: str, args: list[str],
              engine: str) -> list[Step]:
    """Servers larger than a node: each on whole nodes of its own, the engine's multi-node
    flags naming its node 0 (``HEAD``); one step per node of a server."""
    n = dep.gpus_per_node
    nodes = s.gpus // n
    env = list(platform(dep.platform).rule(engine).env)
    name = f"{role} server" if role else "server"
    each = f"{count} {name}{'s' if count > 1 else ''}, " + (
        f"each on {nodes} nodes of its own" if count > 1 else f"on {nodes} nodes") + \
        f" ({HEAD}: the address of its node 0)"
    port = ["--port", str(PORTS[engine])]
    if engine == "trtllm":
        return [Step(f"{each}; once, from node 0", _join(_wrap(engine, args + port,
                                                                 s.gpus, nodes)))]
    return [Step(f"{each}: node {r}", _join(env + args + _multinode(engine, s, r, nodes, n)
                                            + (port if r == 0 else [])))
            for r in range(nodes)]


def _multinode(engine: str, s: Server, rank: int, nodes: int, per_node: int) -> list[str]:
    if engine == "sglang":
        return ["--nnodes", str(nodes), "--node-rank", str(rank), "--dist-init-addr",
                f"{HEAD}:{DIST_INIT_PORT}"]
    if s.tp * s.pp <= per_node:       # vLLM: data-parallel ranks spread over the nodes
        local = per_node // (s.tp * s.pp)
        out = ["--data-parallel-size-local", str(local), "--data-parallel-address", HEAD,
               "--data-parallel-rpc-port", str(DP_RPC_PORT)]
        return out + (["--headless", "--data-parallel-start-rank", str(rank * local)]
                      if rank else [])
    return ["--nnodes", str(nodes), "--node-rank", str(rank), "--master-addr", HEAD,
            "--master-port", str(MASTER_PORT)] + (["--headless"] if rank else [])


def _wrap(engine: str, args: list[str], gpus: int, nodes: int) -> list[str]:
    """TensorRT-LLM beyond one GPU runs under MPI: ``trtllm-llmapi-launch`` in each rank."""
    if engine != "trtllm" or gpus == 1:
        return args
    env = [a for a in args if "=" in a and not a.startswith("-")]
    rest = [a for a in args if a not in env]
    hosts = ["-H", ",".join(f"NODE{k}:{gpus // nodes}" for k in range(nodes))] \
        if nodes > 1 else []
    return [*env, "mpirun", "-n", str(gpus), *hosts, "trtllm-llmapi-launch", *rest]


def _front(dep: Deployment, engine: str) -> list[Step]:
    """What goes in front of several servers (not an engine flag list's business)."""
    if dep.prefill_replicas:
        cmd = {"vllm": "python toy_proxy_server.py --prefiller-hosts PREFILL_HOSTS "
                       "--decoder-hosts DECODE_HOSTS  # vLLM's NIXL example proxy "
                       "(tests/v1/kv_connector/nixl_integration)",
               "sglang": "python -m sglang_router.launch_router --pd-disaggregation "
                         "--prefill http://PREFILL_HOST:PORT --decode http://DECODE_HOST:PORT",
               "trtllm": "trtllm-serve disaggregated -c disagg.yaml  # disagg.yaml: "
                         "context_servers and generation_servers, their urls"}[engine]
        return [Step("in front, one router: each request prefilled, then decoded", cmd,
                     checked=False)]
    if dep.replicas > 1:
        cmd = {"sglang": "python -m sglang_router.launch_router --worker-urls "
                         "http://SERVER1:30000 http://SERVER2:30000 ...",
               }.get(engine, f"any HTTP load balancer over the {dep.replicas} servers (the "
                             "addresses and ports above; each an independent replica)")
        return [Step(f"in front of the {dep.replicas} servers", cmd, checked=False)]
    return []


def _speculative(dep: Deployment, engine: str) -> list[str]:
    """The drafter's flags (vLLM ``--speculative-config``, SGLang ``--speculative-*``) or
    TensorRT-LLM's ``speculative_config`` YAML (``engines.speculation_flags``)."""
    if dep.speculative is None:
        return []
    from perfmodel.serving.engines.speculation_flags import launch_args

    return launch_args(dep.speculative, engine)


def _join(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)
