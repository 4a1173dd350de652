"""The errors a user reads, at the bottom of the package (it imports nothing of vcppo): every layer
raises them, so none has to import another layer to name a bad key, file or row."""
from __future__ import annotations


class ConfigError(ValueError):
    """A config problem the user must fix; the message names the key / file. The CLI prints it as one
    line and exits with code 2 (its subclasses too)."""


class DataError(ConfigError):
    """Prompt data the user must fix; the message names the file and the line / row / field."""
