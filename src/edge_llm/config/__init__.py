"""The configuration tree: one package below every feature that reads it.

``tree`` holds the sections and the loading (TOML, environment, flags);
``models`` and ``upstream`` the schemas of ``[models.NAME]`` and ``[upstream.NAME]``
tables (each feature's piece, kept here so that the tree imports nothing above
it); ``priority`` the priority classes every layer is held to; ``reference``
renders the reference in docs/configuration.md.
"""
