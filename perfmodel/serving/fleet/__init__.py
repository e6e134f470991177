"""Replicas of one engine behind a router: the routers, the replicas dealt and run (apart,
in worker processes or on a Dask cluster, or in lockstep) and merged into one result."""
