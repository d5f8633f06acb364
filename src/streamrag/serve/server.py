"""Run the HTTP API with uvicorn in the foreground until Ctrl-C or SIGTERM.

uvicorn handles the signals: on the first one it stops accepting requests,
finishes those in flight and runs the app's shutdown, which stops the query
worker; :func:`serve_forever` then stops the service, committing what is
pending, before it returns. A signal during that last step exits at once
(:mod:`streamrag.runtime.signals`).

Without API keys it serves only a loopback address, and says so on stderr; any
other address is refused unless ``insecure`` (``--insecure``), which is warned
about loudly (:func:`~streamrag.serve.auth.check_bind`).
"""

from __future__ import annotations

import signal
import socket
import sys
from types import FrameType

import uvicorn

from streamrag.config import ServeSettings, Settings
from streamrag.errors import ConfigError
from streamrag.runtime.service import Service
from streamrag.runtime.signals import graceful_stop
from streamrag.serve.app import create_app
from streamrag.serve.auth import KeyRing, check_bind
from streamrag.timing import SystemClock

__all__ = ["check_port", "check_serving", "serve_forever", "tune_interpreter"]


def check_port(host: str, port: int) -> None:
    """Fail early, before any ingesting, when ``host:port`` cannot be bound."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        msg = (
            f"cannot listen on {host}:{port} ({exc.strerror}); stop what uses it, "
            "or pick another port with --port or serve.port"
        )
        raise ConfigError(msg) from None


def check_serving(settings: Settings, *, insecure: bool = False) -> str | None:
    """Fail early when ``serve.host`` needs API keys and there are none; the note to show."""
    keys = KeyRing.from_settings(settings, SystemClock()).enabled
    return check_bind(settings.serve.host, keys=keys, insecure=insecure)


def tune_interpreter(serve: ServeSettings) -> None:
    """Set the process's interpreter switch interval for serving.

    Queries share one interpreter lock with the ingest thread, and Python hands
    it to a waiting thread only once per switch interval. Each hop of a query
    (event loop, query worker, after a GIL-free matrix product, back) waited up
    to Python's default 5 ms behind a busy writer: a request of four hops took
    27.8 ms p50 beside a busy thread at 5 ms, 3.9 ms at 1 ms
    (``benchmarks/switch_interval.py``).
    """
    sys.setswitchinterval(serve.switch_interval_ms / 1000)


def serve_forever(
    service: Service, *, host: str, port: int, log_level: str = "warning", insecure: bool = False
) -> None:
    """Serve ``service`` on ``host:port``; the service must already be started.

    Without API keys ``host`` must be a loopback address, unless ``insecure``.
    """
    app = create_app(service, manage_service=False)
    tune_interpreter(service.settings.serve)
    note = check_bind(host, keys=app.state.keys.enabled, insecure=insecure)
    if note is not None:
        sys.stderr.write(f"streamrag: {note}\n")
        sys.stderr.flush()
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal
    # with the handler that was installed before it started. Make SIGTERM's
    # handler raise like Ctrl-C does, so that our own shutdown runs after it.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        server.run()
    except KeyboardInterrupt:
        pass  # uvicorn has finished its graceful shutdown; ours follows
    finally:
        signal.signal(signal.SIGTERM, previous)
        with graceful_stop():
            sys.stderr.write(
                "streamrag: stopping, committing what is pending "
                "(a second Ctrl-C or SIGTERM exits at once) ...\n"
            )
            sys.stderr.flush()
            service.stop()


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
