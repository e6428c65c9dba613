"""How the settings' values are read and reconciled (app/config.py): the environment's lists
and URLs, defaults that give way to what the user set, and a validation error as one line."""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Collection, Container, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_MAX_WAIT_MS = 5.0
DEFAULT_QUEUE_CAPACITY = 1024
DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_MAX_INSTANCES = 256
DEFAULT_GRPC_PORT = 8001  # Triton's
DAY_S = 86400.0  # the longest a timeout or lease may be: longer ones overflow timers and Redis
# The shortest default read_timeout_s, and the shortest a client may take none of its answer
# (app/flow.py), whatever request_timeout_s (perhaps a few milliseconds): a client far away, or
# on a link that lost a few segments in a row (TCP's retransmission timer doubles from 0.2 s),
# can take seconds to send a request or to acknowledge a byte of its answer.
SLOW_LINK_S = 5.0
NAMED_UNKNOWN = 5  # unknown settings an error names, each with its likeliest meaning


def listed_names(value: Any) -> Any:
    """A list of names as the environment gives it: names separated by commas, or a JSON
    list."""
    if not isinstance(value, str):
        return value
    if value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a JSON list; names separated by commas are "
                             "one too") from None
    return [name.strip() for name in value.split(",") if name.strip()]


def without_password(url: str) -> str:
    """``url`` as a log or an error may show it: its password, if it holds one (Redis's
    ``redis://:PASSWORD@host``, the usual way to give one), replaced by ``***``."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a port that is not a number: the text before the host is still cut
        return url.split("://", 1)[0] + "://***@" + url.rsplit("@", 1)[-1] if "@" in url else url
    if not password:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def redis_scheme(value: str) -> str:
    """A URL of a scheme redis-py connects with (it raises a traceback's ValueError later)."""
    if urlsplit(value).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"{without_password(value)!r} is not a redis://, rediss:// or unix:// URL")
    return value


def http_url(value: str | None) -> str | None:
    """An http:// or https:// URL with a host (the OTLP/HTTP exporter fails at each export, a
    line in the log per batch of spans, on anything else)."""
    if value is not None:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{without_password(value)!r} is not an http:// or https:// URL")
    return value


def bearer_token(value: str | None) -> str | None:
    """A key that an ``Authorization: Bearer`` header can carry: visible ASCII, no spaces. A
    secret file's line break at its end would otherwise refuse every client with the key."""
    bad = next((c for c in value or "" if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ValueError(f"holds {bad!r}: a key is visible ASCII characters, what every client "
                         "can send in a header (a line break at the end of a secret's file?)")
    return value


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None  # not a number: the field's own validation reports it
    return number if math.isfinite(number) else None


def derive_defaults(given: Mapping[str, Any], fields: Container[str]) -> dict[str, Any]:
    """``given`` (the values set explicitly) plus defaults of ``fields`` adjusted so that they
    never contradict a value the user set: ``queue_capacity=4`` alone lowers the default
    ``max_instances`` to 4, ``max_instances`` or ``max_batch_size`` above 1024 raise the default
    ``queue_capacity`` to hold that many (a batch never holds more than the queue),
    ``port=8001`` moves the default ``grpc_port`` to 8002, ``request_timeout_s=0.004`` alone
    lowers the default ``max_wait_ms`` to 2, and the other way round; ``read_timeout_s``
    follows ``request_timeout_s``, ``SLOW_LINK_S`` at least. Two explicit values that
    contradict each other are left for the checks."""
    out = dict(given)
    capacity, instances = _number(given.get("queue_capacity")), _number(given.get("max_instances"))
    if "max_instances" not in given and capacity is not None:
        out["max_instances"] = max(1, int(min(DEFAULT_MAX_INSTANCES, capacity)))
    batch = _number(given.get("max_batch_size"))
    if "queue_capacity" not in given and (instances is not None or batch is not None):
        out["queue_capacity"] = int(max(DEFAULT_QUEUE_CAPACITY, instances or 0, batch or 0))
    if "grpc_port" not in given and _number(given.get("port")) == DEFAULT_GRPC_PORT:
        out["grpc_port"] = DEFAULT_GRPC_PORT + 1  # gRPC's default port gives way to HTTP on it
    timeout_s, wait_ms = _number(given.get("request_timeout_s")), _number(given.get("max_wait_ms"))
    if "max_wait_ms" not in given and timeout_s is not None and timeout_s > 0:
        out["max_wait_ms"] = min(DEFAULT_MAX_WAIT_MS, timeout_s * 1000.0 / 2)
    if "request_timeout_s" not in given and wait_ms is not None:
        out["request_timeout_s"] = min(DAY_S, max(DEFAULT_REQUEST_TIMEOUT_S, 2 * wait_ms / 1000.0))
    timeout_s = _number(out.get("request_timeout_s", DEFAULT_REQUEST_TIMEOUT_S))
    if "read_timeout_s" not in given and timeout_s is not None:
        out["read_timeout_s"] = min(DAY_S, max(SLOW_LINK_S, timeout_s))
    return {name: value for name, value in out.items() if name in given or name in fields}


def describe_errors(exc: ValueError, setter: Callable[[str], str | None] | None = None) -> str:
    """One line naming every invalid setting of a validation error, and what set each where
    ``setter`` knows (a flag, a variable, a file: of several, the one that wins). A value is
    shown only for a setting of several kinds (frontends: a number or auto): another's may
    be a secret (api_key, a password in redis_url)."""
    errors = getattr(exc, "errors", None)
    if errors is None:
        return str(exc)
    # A setting of several kinds (frontends: a number or auto) fails once per kind, each at
    # (name, kind): one part a setting, its kinds' messages joined by "or".
    found: dict[str, tuple[Any, list[str]]] = {}
    for err in errors():
        loc = err.get("loc", ())
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        name = str(loc[0]) if len(loc) == 2 and not isinstance(loc[1], int) else ".".join(
            map(str, loc))
        found.setdefault(name, (err.get("input"), []))[1].append(msg)
    parts = []
    for name, (given, msgs) in found.items():
        said = [f"given {given!r}"] if len(msgs) > 1 else []
        where = setter(name) if setter is not None and name else None
        said += [f"set by {where}"] if where else []
        shown = f" ({', '.join(said)})" if said else ""
        parts.append(f"{name}: {' or '.join(msgs)}{shown}" if name else msgs[0])
    return "invalid settings: " + "; ".join(parts)


def nearest(name: str, names: Iterable[str]) -> str | None:
    """The one of ``names`` that ``name`` most resembles, where one is close (a typo's)."""
    near = difflib.get_close_matches(name, list(names), n=1, cutoff=0.7)
    return near[0] if near else None


def unknown_settings(given: Iterable[str], known: Collection[str]) -> str | None:
    """``unknown settings A (did you mean B?), C`` for the names in ``given`` that ``known``
    lacks, each with the one it most resembles; None where there are none. The first
    NAMED_UNKNOWN only: a load's config is a client's, and may name thousands."""
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return None
    parts = []
    for name in unknown[:NAMED_UNKNOWN]:
        near = nearest(name, known)
        parts.append(f"{name} (did you mean {near}?)" if near else name)
    more = len(unknown) - NAMED_UNKNOWN
    return f"unknown settings {', '.join(parts)}" + (f" and {more} more" if more > 0 else "")
