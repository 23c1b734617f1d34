"""HTTP/1.1 for the simulated API server, on h11: the protocol state machine uvicorn itself serves vLLM with.

Only what vLLM's server does: routes by exact path and method, FastAPI's JSON bodies for an unknown path or
method, uvicorn's `date` and `server` headers, keep-alive, chunked streaming, uvicorn's access line when a
response starts. It is its own small layer because a simulated launch must start in a fraction of what a web
framework's import costs: the runner's tests launch the simulator hundreds of times.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import h11

MAX_BODY = 64 << 20  # a request body larger than this is refused (413), as a proxy in front of vLLM would
READ_SIZE = 65536


@dataclass(frozen=True)
class Request:
    method: str
    target: str  # the path and query as sent
    version: str  # "1.1"
    body: bytes
    peer: str  # "host:port", or "-"

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str | None = None
    stream: AsyncIterator[bytes] | None = field(default=None, compare=False)  # chunks, sent as they come


Handler = Callable[[Request], Awaitable[Response]]
AccessLog = Callable[[Request, int], None]


def json_response(data: object, *, status: int = 200) -> Response:
    """JSON as FastAPI writes it: compact."""
    return Response(status, json.dumps(data, separators=(",", ":")).encode(), "application/json")


class HttpServer:
    def __init__(self, routes: dict[str, dict[str, Handler]], access_log: AccessLog | None) -> None:
        self._routes = routes  # path -> method ("*" for any) -> handler
        self._access_log = access_log
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_server(self._connection, sock=sock)

    async def stop(self) -> None:
        """Stops accepting and cuts what is open: vLLM 0.32 stops its engine client in abort mode before its
        HTTP server (shutdown_timeout 0), so a request still open then, a hung one included, is not waited for."""
        if self._server is not None:
            self._server.close()
        for task in self._connections:
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:  # as uvicorn does: a response's last segment is not held back for an ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = writer.get_extra_info("peername")
        client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "-"
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=READ_SIZE)
        try:
            while await self._exchange(conn, reader, writer, client):
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.CancelledError):
            pass  # the client went, or the server is stopping: a connection's task ends quietly either way
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _exchange(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: str
    ) -> bool:
        """One request and its response; False when the connection is to close."""
        try:
            head = await _next(conn, reader)
            if not isinstance(head, h11.Request):
                return False
            body = bytearray()
            while isinstance(event := await _next(conn, reader, expect_continue=writer), h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    await _send(conn, writer, Response(413, b""), close=True)
                    return False
        except h11.RemoteProtocolError:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # uvicorn's answer to a malformed request
                await _send(conn, writer, Response(400, b"Invalid HTTP request received.", "text/plain"), close=True)
            return False
        if not isinstance(event, h11.EndOfMessage):
            return False
        request = Request(
            head.method.decode(), head.target.decode("latin-1"), head.http_version.decode(), bytes(body), client
        )
        response = await self._dispatch(request)
        if self._access_log is not None:
            self._access_log(request, response.status)
        await _send(conn, writer, response, head_only=request.method == "HEAD")
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    async def _dispatch(self, request: Request) -> Response:
        methods = self._routes.get(request.path)
        if methods is None:
            return json_response({"detail": "Not Found"}, status=404)
        handler = methods.get(request.method) or methods.get("*")
        if handler is None:
            return json_response({"detail": "Method Not Allowed"}, status=405)
        try:
            return await handler(request)
        except Exception:  # Starlette answers an exception in the application so
            return Response(500, b"Internal Server Error", "text/plain; charset=utf-8")


async def _next(
    conn: h11.Connection, reader: asyncio.StreamReader, expect_continue: asyncio.StreamWriter | None = None
) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        if expect_continue is not None and conn.they_are_waiting_for_100_continue:
            expect_continue.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        data = await reader.read(READ_SIZE)
        if not data and conn.their_state is h11.SEND_BODY:
            raise ConnectionResetError("the client went mid-body")  # uvicorn closes without an answer
        conn.receive_data(data)  # b"" between requests: h11 then says ConnectionClosed


async def _send(
    conn: h11.Connection,
    writer: asyncio.StreamWriter,
    response: Response,
    *,
    close: bool = False,
    head_only: bool = False,
) -> None:
    """The response; to a HEAD its head alone (with the length its body would have)."""
    headers = [("date", email.utils.formatdate(usegmt=True)), ("server", "uvicorn")]
    if response.stream is None:
        headers.append(("content-length", str(len(response.body))))
    if response.content_type is not None:
        headers.append(("content-type", response.content_type))
    if close:
        headers.append(("connection", "close"))
    reason = HTTPStatus(response.status).phrase.encode()
    head = conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason)) or b""
    if response.stream is None or head_only:
        body = b"" if head_only or not response.body else (conn.send(h11.Data(data=response.body)) or b"")
        writer.write(head + body)  # one segment
    else:
        writer.write(head)
        async for chunk in response.stream:
            writer.write(conn.send(h11.Data(data=chunk)) or b"")
            await writer.drain()
    writer.write(conn.send(h11.EndOfMessage()) or b"")
    await writer.drain()
