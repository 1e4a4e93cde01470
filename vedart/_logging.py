"""The ``vedart`` logger: silent by default, made verbose by ``VEDART_LOG``.

A library must not configure logging for its host application, so the logger gets
only a ``NullHandler`` at import. Setting a level (``VEDART_LOG=debug`` or
``Config.builder().log_level("debug")``) also attaches one stderr handler, because
a user who asked for debug output expects to see it without configuring logging.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vedart")
logger.addHandler(logging.NullHandler())

_stderr_handler: logging.Handler | None = None


def apply_log_level(level: str | None) -> None:
    """Set the ``vedart`` logger's level; ``None`` leaves logging as the host set it."""
    global _stderr_handler
    if level is None:
        return
    logger.setLevel(level.upper())
    if _stderr_handler is None:
        _stderr_handler = logging.StreamHandler()
        _stderr_handler.setFormatter(logging.Formatter("vedart %(levelname)s: %(message)s"))
        logger.addHandler(_stderr_handler)
