"""Upstream engines behind this one's streaming contract (docs/design.md §14).

``config`` (``[upstream.NAME]``, ``--upstream NAME=URL``), ``registry`` (health),
``router`` (local or upstream, fallback, supersede), ``stream`` (one relayed
request: bounded buffer, pause, cancel, failover), ``translate`` (Responses and
Messages requests as chat completions, chat chunks back as output events),
``metrics`` (label ``backend``).
"""
