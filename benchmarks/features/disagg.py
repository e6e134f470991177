"""Disaggregated prefill/decode (issue 35 item 2): the requests over one prefill and one
decode instance of the device, each prompt's KV moved over NIXL (each GPU's NIC, at
nixlbench's share of its rate), transfers from the prefill instance queued on its NICs:
what ``perfmodel simulate --prefill-replicas 1 --decode-replicas 1`` runs."""

from perfmodel.serving.disagg import Pool, simulate_disaggregated

LABEL = "disagg 1P+1D, nixl, contention"


def run(reqs, model, hw):
    return simulate_disaggregated(model, reqs, Pool(hw), Pool(hw), "nixl", contention=True)
