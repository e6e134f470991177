"""Serving under a stream of requests: traffic, the engine's scheduler and paged KV pool,
the discrete-event simulation whose steps the core prices, disaggregated serving and the
deployment planner."""
