"""The boundary to a real Kubernetes cluster: live inventory, actuator, observer, leader election.

The engine decides; this package makes the cluster match the log, and tells the
log what the cluster did. It never decides a placement itself.
"""
