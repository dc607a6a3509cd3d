"""Connections that have not finished sending a request's headers: each gets `timeout_s` from its opening
(or from its previous response) and is then closed, and at most `limit` exist at once, the one that has
waited longest closed to make room. uvicorn bounds neither, so a client that sends a header line now and
then would keep its connection for ever; this bounds what such clients hold to `limit` sockets for
`timeout_s` each. A client that sends its headers at once is closed only if `limit` newer connections
arrive while it sends them.
"""

import copy

from uvicorn.protocols.http.h11_impl import H11Protocol

from nanoasr.server.app import LOGGER


class HeaderDeadlines:
    """The connections of one server still sending headers, oldest first, each with its deadline's timer."""

    def __init__(self, timeout_s: float, limit: int):
        self.timeout_s, self.limit = timeout_s, limit
        self.waiting: dict = {}  # protocol -> TimerHandle, in the order their waits began

    def start(self, protocol) -> None:
        self.stop(protocol)
        while len(self.waiting) >= self.limit:
            next(iter(self.waiting)).headers_timed_out()
        self.waiting[protocol] = protocol.loop.call_later(self.timeout_s, protocol.headers_timed_out)

    def stop(self, protocol) -> None:
        timer = self.waiting.pop(protocol, None)
        if timer is not None:
            timer.cancel()


def header_guarded_protocol(timeout_s: float, limit: int) -> type:
    """uvicorn's h11 protocol with one server's HeaderDeadlines: a class for uvicorn.Config(http=...)."""
    deadlines = HeaderDeadlines(timeout_s, limit)

    class HeaderGuardedH11(H11Protocol):
        # uvicorn makes a new request cycle once a request's headers are complete
        def connection_made(self, transport):
            super().connection_made(transport)
            deadlines.start(self)

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:
                deadlines.stop(self)

        def on_response_complete(self) -> None:
            cycle = self.cycle
            if not self.transport.is_closing():
                deadlines.start(self)  # the next request's headers, on a kept-alive connection
            super().on_response_complete()
            if self.cycle is not cycle:  # a pipelined request was complete already
                deadlines.stop(self)

        def handle_websocket_upgrade(self, event) -> None:
            deadlines.stop(self)  # the connection is the websocket protocol's from here on
            super().handle_websocket_upgrade(event)

        def connection_lost(self, exc) -> None:
            deadlines.stop(self)
            super().connection_lost(exc)

        def headers_timed_out(self) -> None:
            deadlines.stop(self)
            self.timeout_keep_alive_handler()  # closes the connection as an idle kept-alive one is closed

    return HeaderGuardedH11


def uvicorn_config(app, *, host: str, port: int, header_timeout_s: float = 10,
                   max_header_connections: int = 64, ws_max_bytes: int = 16 << 20, log_level: str = "info"):
    """The uvicorn.Config that serves `app` with the header bounds above and WebSocket messages of up to
    `ws_max_bytes`; the access log is nanoasr.server's own line per request, which has each request's
    duration."""
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    logging_config = copy.deepcopy(LOGGING_CONFIG)
    logging_config["loggers"][LOGGER] = {"handlers": ["default"], "level": log_level.upper(),
                                         "propagate": False}
    protocol = header_guarded_protocol(header_timeout_s, max_header_connections)
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, log_config=logging_config,
                          access_log=False, http=protocol, ws_max_size=ws_max_bytes)
