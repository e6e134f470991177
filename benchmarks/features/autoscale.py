"""Autoscaling replay: the stream on a fleet of 1-4 replicas sized by the queue metric
(HPA's rule, target 4 waiting per replica, decisions every 15 s, a 60 s scale-down
window), the replicas stepped in lockstep (``serving.fleet.scaling``)."""

from perfmodel.serving.fleet.autoscale import policy
from perfmodel.serving.simulate import simulate

LABEL = "autoscale queue 1-4 replicas"


def run(reqs, model, hw):
    return simulate(model, hw, reqs, autoscale=policy("queue", 4.0, 1, 4, 15.0, 60.0))
