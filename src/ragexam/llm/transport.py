"""The HTTP transport under the openai SDK: aiohttp, for a lower CPU cost per call.

At hundreds of calls in flight the event loop's one thread is the limit, and about half its
time went to the SDK's default HTTP stack (pool bookkeeping, sending, receiving). Through
aiohttp the same calls took 29% less CPU (5.3 -> 3.7 ms per call at 256 in flight, measured in
one run), with one connection per call in flight, where the default pool keeps 100 and reopens
the rest. The openai SDK ships an aiohttp
transport too; this one differs in saying honestly what failed: there a refused or dropped
connection is reported as a timeout.

Timeouts are the SDK's (RAGEXAM_TIMEOUT): to connect, between bytes read, and to get a
connection from the pool. Redirects, retries and the SDK's headers are left to the SDK.

The transport is an httpx2 one. openai 3.x speaks httpx2, and 2.47 and later take an httpx2
client beside their own httpx one; openai 2.45 and 2.46 (the oldest that langchain-openai
takes) speak httpx only, and there the SDK's own client serves instead of this one.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import httpx2
import openai
import yarl
from aiohttp.helpers import get_env_proxy_for_url

from ragexam.llm.deferred import RoutableTransport

DEFAULTS = openai.DEFAULT_CONNECTION_LIMITS  # at most 1000 connections, idle ones kept 5 s
# aiohttp's timeouts, by the httpx2 timeout the SDK reports them as: the most specific first.
TIMEOUTS: list[tuple[type[BaseException], type[httpx2.TimeoutException]]] = [
    (aiohttp.ConnectionTimeoutError, httpx2.ConnectTimeout),
    (aiohttp.SocketTimeoutError, httpx2.ReadTimeout),
    (asyncio.TimeoutError, httpx2.PoolTimeout),  # waiting for a free connection
]


@contextmanager
def _honest_errors() -> Iterator[None]:
    """aiohttp's failures as the httpx2 errors the SDK expects, named for what happened.

    The SDK turns a timeout into APITimeoutError and any other into APIConnectionError, with
    the aiohttp error as the cause; an exception it does not know would escape as a crash.
    """
    try:
        yield
    except aiohttp.ClientConnectorError as exc:  # refused, unreachable, no such host, TLS
        raise httpx2.ConnectError(str(exc)) from exc
    except (aiohttp.ClientError, OSError) as exc:  # TimeoutError is an OSError
        for found, timeout in TIMEOUTS:
            if isinstance(exc, found):
                raise timeout(str(exc) or type(exc).__name__) from exc
        if isinstance(exc, aiohttp.ServerDisconnectedError):
            raise httpx2.RemoteProtocolError(f"the server closed the connection: {exc}") from exc
        raise httpx2.ReadError(str(exc) or type(exc).__name__) from exc


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport that sends each request through one pooled aiohttp session."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._proxies: dict[tuple[str, str, int | None], tuple[Any, Any]] = {}
        self._tls: ssl.SSLContext | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running event loop, which an aiohttp session belongs to.
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=DEFAULTS.max_connections or 0,
                keepalive_timeout=DEFAULTS.keepalive_expiry or 0,
            )
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def _verify(self, url: httpx2.URL) -> ssl.SSLContext | bool:
        """httpx2's certificate checks (certifi's roots) for https; made on the first https
        call, as loading the roots takes 20-70 ms that a local http server need not wait."""
        if url.scheme != "https":
            return True  # aiohttp's default, unused without TLS
        if self._tls is None:
            self._tls = httpx2.create_ssl_context()
        return self._tls

    def _proxy(self, url: httpx2.URL) -> tuple[Any, Any]:
        """The proxy the environment names for this host (HTTPS_PROXY, NO_PROXY...) and its
        credentials, looked up once: aiohttp's trust_env would look in a thread per request."""
        key = (url.scheme, url.host, url.port)
        if key not in self._proxies:
            try:
                self._proxies[key] = get_env_proxy_for_url(yarl.URL(str(url)))
            except LookupError:
                self._proxies[key] = (None, None)
        return self._proxies[key]

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send the request and read the whole reply (ragexam never streams)."""
        timeout: dict[str, Any] = request.extensions.get("timeout", {})
        limits = aiohttp.ClientTimeout(
            sock_connect=timeout.get("connect"),
            sock_read=timeout.get("read"),
            connect=timeout.get("pool"),
        )
        # httpx2 has turned credentials in the URL into a header already; aiohttp would refuse
        # them in both places.
        url = request.url.copy_with(userinfo=b"") if request.url.userinfo else request.url
        proxy, proxy_auth = self._proxy(url)
        with _honest_errors():
            async with self._client().request(
                request.method,
                str(url),
                headers=request.headers.multi_items(),
                data=await request.aread() or None,
                ssl=self._verify(url),
                proxy=proxy,
                proxy_auth=proxy_auth,
                allow_redirects=False,
                auto_decompress=False,  # httpx2 decodes, by the Content-Encoding header
                timeout=limits,
            ) as reply:
                content = await reply.read()
        return httpx2.Response(
            reply.status, headers=reply.raw_headers, content=content, request=request
        )

    async def aclose(self) -> None:
        """Close the session and its connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def async_http_client(**options: Any) -> Any:
    """The SDK's default async client (its timeout and redirect defaults) over aiohttp, where
    the SDK takes an httpx2 client; else the SDK's own client, as it is.

    Over aiohttp, a route set in context (deferred.routed: the batch road) answers its requests
    instead of the network.
    """
    default: Any = openai.DefaultAsyncHttpxClient
    factory = _httpx2_client()
    if factory is not None:
        return factory(transport=RoutableTransport(AiohttpTransport()), **options)
    return default(**options)


def _httpx2_client() -> Any:
    """The SDK's client class that takes an httpx2 transport, if this openai has one."""
    default: Any = openai.DefaultAsyncHttpxClient
    if isinstance(default, type) and issubclass(default, httpx2.AsyncClient):  # openai 3.x
        return default
    return getattr(openai, "DefaultAsyncHttpx2Client", None)  # openai 2.47 and later


def routable() -> bool:
    """Whether LLM clients' requests can be taken at the transport (what the batch road needs):
    not where the SDK only takes an httpx client (openai 2.45 and 2.46)."""
    return _httpx2_client() is not None


def client_kind(client: Any) -> str:
    """Which HTTP stack a client is, for the manifest: aiohttp, or the SDK's own."""
    transport = getattr(client, "_transport", None)
    if isinstance(transport, RoutableTransport):
        transport = transport.inner
    if isinstance(transport, AiohttpTransport):
        return "aiohttp"
    return f"openai {openai.__version__}'s own ({type(client).__module__.split('.')[0]})"
