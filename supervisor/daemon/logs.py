"""structlog set-up: readable lines on a terminal, JSON lines for journald and files."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(json_lines: bool | None = None, level: int = logging.INFO) -> None:
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_lines
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(**bind: object) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("specfleet").bind(**bind)
