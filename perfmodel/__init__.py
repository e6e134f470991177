"""perfmodel: predict LLM inference speed on an accelerator, and say how wrong it is.

Light at import: no torch, no matplotlib, no pandas until asked for.
"""

from perfmodel.estimate import Estimate, estimate
from perfmodel.load import hardware, load_hardware, load_model, model
from perfmodel.specs import Hardware, Model, SpecError, Workload

__all__ = ["Estimate", "Hardware", "Model", "SpecError", "Workload", "estimate", "hardware",
           "load_hardware", "load_model", "model"]
__version__ = "0.1.0"
