"""The deployment planner: the search space and its steady state, the ranking, the
simulated check, prices, and the launch lines of the chosen plan."""
