"""The backup package's error, apart from zone.py so that parsing a destination loads no client."""

from kontinuum.errors import KontinuumError


class BackupError(KontinuumError):
    """A backup or restore cannot go on; the message names the zone, the node and what to do."""
