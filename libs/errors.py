"""The error a domain refuses a command with.  Its own module, with no imports, so that the
pure domain (`domain/`) and the deciders load neither Kafka's client nor OpenTelemetry."""

from __future__ import annotations

from typing import Any


class CommandError(Exception):
    """A command refused by the domain: `code` (MongoDB's name where one exists) and a message;
    `info`: details for the caller (e.g. StaleConfig's versions)."""

    def __init__(self, code: str, message: str, info: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.info = code, message, info
