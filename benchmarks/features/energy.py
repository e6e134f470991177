"""Energy on (issue 35, item 6): the run simulated as with every feature off, then its
joules, watts and joules per token priced (``serving.energy.sim_energy``: every committed
step re-priced for its roofline utilization). The figure is the cost of that pass."""

from __future__ import annotations

import perfmodel as pm
from perfmodel.serving.energy import sim_energy
from perfmodel.serving.simulate import simulate

LABEL = "energy (simulate --energy)"


def run(reqs: object, model: object, hw: object) -> object:
    res = simulate(model, hw, reqs)
    spent = sim_energy(res, model, hw, pm.Parallelism(), pm.Workload())
    assert spent is not None and spent["j_per_output_token"] > 0
    return res
