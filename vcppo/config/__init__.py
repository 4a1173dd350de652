"""The config of every vcppo command: the schema (one dataclass per section, a doc line per field), the
loader (defaults <- YAML presets <- ``key=value``, :mod:`vcppo.config.load`) and the checks it runs before
any engine starts (rules, paths, parallel layouts, resume provenance).

``python -m vcppo.config`` prints the schema as docs/config.md's table.
"""
