"""``validate.corpus.splice``: a rewritten key carried into the original text, every other
line (comments included) kept."""

from validate.corpus.splice import splice

ORIGINAL = """\
engines:
  trtllm:
    efficiency:
      # why these attention figures
      attention_fraction: 0.8
      moe_kernels:
        bf16: {gemm_fraction: 0.6, memory_fraction: 0.7,
            latency_s: 2 us}

      collective_fraction: 0.7
    calibration:
      rows: {gemm: 3, moe: 10}
"""

REWRITTEN = """\
engines:
  trtllm:
    efficiency:
      attention_fraction: 0.8
      moe_kernels:
        bf16: {gemm_fraction: 0.65, memory_fraction: 0.9, latency_s: 3 us}
      collective_fraction: 0.7
    calibration:
      rows: {gemm: 3, moe: 12}
"""


def test_splice_replaces_only_the_named_keys_and_keeps_comments() -> None:
    paths = [("engines", "trtllm", "efficiency", "moe_kernels"),
             ("engines", "trtllm", "calibration", "rows")]
    got = splice(ORIGINAL, REWRITTEN, paths)
    assert got == ORIGINAL.replace(
        "        bf16: {gemm_fraction: 0.6, memory_fraction: 0.7,\n"
        "            latency_s: 2 us}\n",
        "        bf16: {gemm_fraction: 0.65, memory_fraction: 0.9, latency_s: 3 us}\n",
    ).replace("moe: 10}", "moe: 12}")


def test_splice_of_a_key_the_original_lacks_is_the_rewritten_text() -> None:
    assert splice(ORIGINAL, REWRITTEN, [("engines", "vllm", "efficiency")]) == REWRITTEN
