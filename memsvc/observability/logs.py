"""structlog set-up: JSON lines off a TTY, the console renderer on one, for memsvc's own
events and the standard-library records of the libraries it uses alike."""

from __future__ import annotations

import logging
import sys

import structlog

# Their INFO lines describe the ONNX export's graph passes (a hundred per first start).
QUIET_LIBRARIES = ("onnxscript", "onnx_ir", "torch.onnx", "torch.export", "torch._dynamo")


def configure_logging(fmt: str = "auto", level: str = "INFO") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(ensure_ascii=False)
        if use_json
        else structlog.dev.ConsoleRenderer()
    )
    # Libraries log through the standard library: their records become the same JSON lines
    # (with a `logger` field), and the ONNX exporter's chatty INFO passes stay out.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=renderer,
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for chatty in QUIET_LIBRARIES:
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
