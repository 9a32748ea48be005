"""Gradients and replicas: packing gradients, and every collective.

`packing` groups a gradient list so that one op serves many gradients;
`replicas` holds every cross-replica communication and the strategy rules.
The bottom of the runtime: it imports only `compat`.
"""
