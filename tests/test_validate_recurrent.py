"""The harness's tiny recurrent references: each chunked scan equals its one-token step
applied token by token (so the references the report times compute the right thing)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from validate import recurrent  # noqa: E402


@pytest.mark.parametrize("kind", ["ssd", "delta"])
def test_chunked_scan_equals_the_recurrence_token_by_token(kind):
    gen = torch.Generator().manual_seed(0)
    batch, tokens = 2, 128                      # two chunks of 64
    z = recurrent.inputs(kind, batch, tokens, gen)
    y, final = recurrent.prefill_fn(kind)(z)
    state = torch.zeros(batch, recurrent.HEADS, recurrent.D_K, recurrent.D_V)
    step = recurrent.step_fn(kind)
    ys = [step({name: t[:, i:i + 1] for name, t in z.items()}, state) for i in range(tokens)]
    torch.testing.assert_close(y, torch.stack(ys, dim=1), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, state, atol=1e-4, rtol=1e-4)


def test_records_of_the_references():
    ssd = recurrent.record("ssd", 1, 256, 256)
    delta = recurrent.record("delta", 1, 256, 256)
    assert delta.flops > ssd.flops > 0
    decode = recurrent.record("ssd", 8, 1, 1024)
    assert float(np.sum(decode.bytes.kv_read)) == 8 * 4 * 64 * 64 * 4


@pytest.mark.parametrize("kind", ["ssd", "delta"])
def test_the_chain_dispatches_what_the_reference_dispatches(kind):
    """The modelled chain (``cost.scan_chain``) against the aten operators the reference
    calls from Python: as many per chunk and per decode step. (A whole call's chain has
    more: the kernels composite operators run inside, an einsum's copies.)"""
    from perfmodel.cost.scan_chain import chain, totals

    gen = torch.Generator().manual_seed(0)

    def counted(tokens):
        z = recurrent.inputs(kind, 2, tokens, gen)
        if tokens == 1:
            state = recurrent.state_of(kind, 2, gen)
            return recurrent.aten_ops(lambda: recurrent.step_fn(kind)(z, state))
        return recurrent.aten_ops(lambda: recurrent.prefill_fn(kind)(z))

    def modelled(tokens, context):
        return float(totals(chain(recurrent.record(kind, 2, tokens, context)))[2])

    with torch.inference_mode():
        assert modelled(256, 256) - modelled(128, 128) == counted(256) - counted(128)
        assert modelled(1, 300) == counted(1)
