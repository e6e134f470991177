"""Speculative decoding as each engine's flags spell it, read into ``SpecDecode``
(``engines.speculation``) and written back for launch lines; and the published acceptance
profiles (``acceptance.yaml``, beside this module).

- vLLM: ``--speculative-config`` JSON, keys ``method`` ("eagle", "eagle3", "mtp" /
  "deepseek_mtp", "draft_model", "ngram", "suffix"), ``num_speculative_tokens``, ``model``
  (``vllm/config/speculative.py``, ``SpeculativeConfig``).
- SGLang: ``--speculative-algorithm`` (EAGLE, EAGLE3, NEXTN: DeepSeek's MTP, run by the
  EAGLE worker; STANDALONE: a draft model; NGRAM), ``--speculative-draft-model-path``,
  ``--speculative-num-steps``, ``--speculative-eagle-topk``,
  ``--speculative-num-draft-tokens`` (``sglang/srt/server_args.py``; with topk 1 SGLang
  sets the draft tokens to steps + 1).
- TensorRT-LLM: the LLM API's ``speculative_config`` (``decoding_type``: Eagle, Eagle3,
  MTP, NGram, DraftTarget; ``max_draft_len``, ``speculative_model_dir``; MTP's
  ``num_nextn_predict_layers``), ``tensorrt_llm/llmapi/llm_args.py``
  ``DecodingBaseConfig.from_dict``.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import yaml

from perfmodel.serving.engines.speculation import SpecDecode
from perfmodel.specs.errors import SpecError
from perfmodel.specs.model import Model

PROFILES = Path(__file__).with_name("acceptance.yaml")
_VLLM = {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "deepseek_mtp": "mtp",
         "draft_model": "draft_model", "ngram": "ngram", "suffix": "ngram"}
_SGL = {"EAGLE": "eagle", "EAGLE3": "eagle3", "NEXTN": "mtp", "STANDALONE": "draft_model",
        "NGRAM": "ngram"}
_TRT = {"Eagle": "eagle", "Eagle3": "eagle3", "MTP": "mtp", "DraftTarget": "draft_model",
        "NGram": "ngram"}
LOOKAHEAD = ("eagle", "eagle3", "mtp", "draft_model")   # vLLM: use_eagle / uses_draft_model


@cache
def profiles() -> dict:
    """The shipped acceptance profiles by name."""
    return yaml.safe_load(PROFILES.read_text())["profiles"]


def acceptance(given: str | None, profile: str | None, k: int) -> tuple[tuple, str]:
    """(rates, their source) from ``--acceptance`` (one rate, or k comma-separated) or
    ``--acceptance-profile`` (a shipped profile; its last rate repeats past its length)."""
    if (given is None) == (profile is None):
        raise SpecError("--acceptance / --acceptance-profile: speculative decoding needs "
                        "exactly one (a rate, k rates, or one of "
                        f"{', '.join(sorted(profiles()))})")
    if profile is not None:
        if profile not in profiles():
            raise SpecError(f"--acceptance-profile: expected one of "
                            f"{', '.join(sorted(profiles()))}, got {profile!r}")
        p = profiles()[profile]
        rates = list(p["rates"])
        return tuple((rates + rates[-1:] * k)[:k]), f"{profile}: {p['source']}"
    try:
        rates = [float(x) for x in given.split(",")]
    except ValueError:
        raise SpecError(f"--acceptance: expected numbers in [0, 1], got {given!r}") from None
    if len(rates) == 1:
        rates = rates * k
    if len(rates) != k or not all(0 <= a <= 1 for a in rates):
        raise SpecError(f"--acceptance: expected one rate or {k} in [0, 1] (one per drafted "
                        f"token), got {given!r}")
    return tuple(rates), "given"


def _int(value: object, name: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SpecError(f"{name}: expected an integer >= {least}, got {value!r}")
    return value


def _draft_model(method: str, checkpoint: str, option: str) -> Model | None:
    if method != "draft_model":
        return None
    if not checkpoint:
        raise SpecError(f"{option}: a draft model needs its model (a shipped name, model "
                        "YAML or HF config.json)")
    from perfmodel.specs import load

    try:
        return load.model(checkpoint)
    except SpecError as exc:
        raise SpecError(str(exc).replace("--model:", f"{option}:", 1)) from None


def _json(text: str, option: str) -> dict:
    try:
        out = json.loads(text)
    except json.JSONDecodeError:
        raise SpecError(f"{option}: expected a JSON object like "
                        '\'{"method": "eagle", "num_speculative_tokens": 3}\'') from None
    if not isinstance(out, dict):
        raise SpecError(f"{option}: expected a JSON object, got {type(out).__name__}")
    return out


def _pick(table: dict, value: object, option: str) -> str:
    if value not in table:
        raise SpecError(f"{option}: expected one of {', '.join(table)}, got {value!r}")
    return table[value]


def from_vllm(text: str, rates: tuple[str | None, str | None], mode: str = "expected",
              seed: int = 0) -> SpecDecode:
    """vLLM's ``--speculative-config`` JSON; ``rates``: (``--acceptance``,
    ``--acceptance-profile``)."""
    c = _json(text, "--speculative-config")
    method = _pick(_VLLM, c.get("method"), "--speculative-config: method")
    k = _int(c.get("num_speculative_tokens"), "--speculative-config: num_speculative_tokens")
    checkpoint = str(c.get("model") or "")
    got, source = acceptance(*rates, k)
    return SpecDecode(method, k, got, k + 1, 1, _draft_model(method, checkpoint,
                      "--speculative-config: model"), checkpoint,
                      k if method in LOOKAHEAD else 0, mode, seed, source)


def from_sglang(algorithm: str, draft_path: str | None, steps: int | None,
                topk: int | None, draft_tokens: int | None,
                rates: tuple[str | None, str | None], mode: str = "expected",
                seed: int = 0) -> SpecDecode:
    """SGLang's ``--speculative-*`` flags (unset: steps 3, topk 1, draft tokens steps + 1,
    SGLang's chain defaults)."""
    method = _pick(_SGL, algorithm, "--speculative-algorithm")
    k = _int(3 if steps is None else steps, "--speculative-num-steps")
    top = _int(1 if topk is None else topk, "--speculative-eagle-topk")
    verify = k + 1 if top == 1 or draft_tokens is None else \
        _int(draft_tokens, "--speculative-num-draft-tokens", k + 1)
    got, source = acceptance(*rates, k)
    checkpoint = draft_path or ""
    return SpecDecode(method, k, got, verify, top, _draft_model(
        method, checkpoint, "--speculative-draft-model-path"), checkpoint,
        k * top if method in LOOKAHEAD else 0, mode, seed, source)


def from_trtllm(text: str, rates: tuple[str | None, str | None], mode: str = "expected",
                seed: int = 0) -> SpecDecode:
    """TensorRT-LLM's ``speculative_config`` as JSON (its YAML keys)."""
    c = _json(text, "--speculative-config")
    method = _pick(_TRT, c.get("decoding_type"), "--speculative-config: decoding_type")
    key = "num_nextn_predict_layers" if method == "mtp" and "max_draft_len" not in c \
        else "max_draft_len"
    k = _int(c.get(key), f"--speculative-config: {key}")
    checkpoint = str(c.get("speculative_model_dir") or "")
    got, source = acceptance(*rates, k)
    return SpecDecode(method, k, got, k + 1, 1, _draft_model(
        method, checkpoint, "--speculative-config: speculative_model_dir"), checkpoint,
        k if method in LOOKAHEAD else 0, mode, seed, source)


def engine_flags(spec: SpecDecode, engine: str) -> str:
    """``spec`` as ``engine``'s own flags (vLLM, SGLang) or its entry of the LLM API YAML
    (TensorRT-LLM's ``--extra_llm_api_options``)."""
    if engine == "sglang":
        name = {v: k for k, v in _SGL.items()}[spec.method]
        out = [f"--speculative-algorithm {name}"]
        if spec.checkpoint:
            out.append(f"--speculative-draft-model-path {spec.checkpoint}")
        out += [f"--speculative-num-steps {spec.k}", f"--speculative-eagle-topk {spec.topk}",
                f"--speculative-num-draft-tokens {spec.verify}"]
        return " ".join(out)
    if engine == "trtllm":
        name = {v: k for k, v in _TRT.items()}[spec.method]
        model = f", speculative_model_dir: {spec.checkpoint}" if spec.checkpoint else ""
        return f"speculative_config: {{decoding_type: {name}, max_draft_len: {spec.k}{model}}}"
    c = {"method": spec.method, "num_speculative_tokens": spec.k}
    if spec.checkpoint:
        c["model"] = spec.checkpoint
    return f"--speculative-config '{json.dumps(c)}'"


def launch_args(spec: SpecDecode, engine: str) -> list[str]:
    """``spec`` as the server's arguments (vLLM, SGLang: a list for the command line) or
    TensorRT-LLM's ``speculative_config`` YAML lines."""
    if engine == "trtllm":
        name = {v: k for k, v in _TRT.items()}[spec.method]
        lines = ["speculative_config:", f"  decoding_type: {name}",
                 f"  max_draft_len: {spec.k}"]
        return lines + ([f"  speculative_model_dir: {spec.checkpoint}"] if spec.checkpoint
                        else [])
    if engine == "sglang":
        words = engine_flags(spec, engine).split(" ")
        return words
    return ["--speculative-config", engine_flags(spec, engine).split(" ", 1)[1].strip("'")]


def simulate_flags(spec: SpecDecode, engine: str) -> str:
    """The ``perfmodel simulate`` options that reproduce ``spec`` on ``engine``: its own
    flags and the acceptance (rates, mode, seed)."""
    if engine == "trtllm":
        name = {v: k for k, v in _TRT.items()}[spec.method]
        c = {"decoding_type": name, "max_draft_len": spec.k} | (
            {"speculative_model_dir": spec.checkpoint} if spec.checkpoint else {})
        own = f"--speculative-config '{json.dumps(c)}'"
    else:
        own = engine_flags(spec, engine)
    out = f"{own} --acceptance {','.join(f'{a:g}' for a in spec.rates)}"
    if spec.mode != "expected":
        out += f" --acceptance-mode {spec.mode} --acceptance-seed {spec.seed}"
    return out
