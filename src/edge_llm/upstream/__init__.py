"""Upstream engines behind this one's streaming contract (SPEC section 14).

``config`` (``[upstream.NAME]``, ``--upstream NAME=URL``), ``registry`` (health),
``router`` (local or upstream, fallback, supersede), ``stream`` (one relayed
request: bounded buffer, pause, cancel, failover), ``metrics`` (label ``backend``).
"""
