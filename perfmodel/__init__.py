"""perfmodel: predict LLM inference speed on an accelerator, and say how wrong it is.

Light at import: numpy, no torch, no matplotlib, no pandas until asked for.
"""

from perfmodel.cost.step import Dtypes, Step, StepCost, price_step
from perfmodel.schedules.diffusion import Diffusion
from perfmodel.schedules.energy import estimate_energy
from perfmodel.schedules.estimate import Estimate
from perfmodel.schedules.estimates import Estimates, estimate, estimate_many
from perfmodel.schedules.speculative import Speculation
from perfmodel.specs import Hardware, Model, Parallelism, SpecError, Workload, Workloads
from perfmodel.specs.load import hardware, load_hardware, load_model, model

__all__ = ["Diffusion", "Dtypes", "Estimate", "Estimates", "Hardware", "Model", "Parallelism",
           "SpecError", "Speculation", "Step", "StepCost", "Workload", "Workloads", "estimate",
           "estimate_many", "hardware", "load_hardware", "load_model", "model", "price_step"]
__all__ += ["estimate_energy"]      # energy and cost of an estimate (docs/energy.md)
__version__ = "0.1.0"
