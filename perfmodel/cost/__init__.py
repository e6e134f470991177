"""The cost model: operator records, the step template of a model, tiling, the roofline,
memory and parameter counts; ``step.price_step`` prices any step under a plan."""
