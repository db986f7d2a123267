"""clickhouse-connect DSNs: the embedded default made absolute, credentials given as options moved into
the address, and passwords kept out of messages.

A password may hold any character: percent-encoded (`%40` for `@`, `%2F` for `/`), or raw except
`/`, `?` and `#`, which end the address's host part; a raw `@` is fine, as the last `@` before the
host ends the user info (as browsers and urllib read it).
"""

from __future__ import annotations

import os
import re
from urllib.parse import SplitResult, parse_qsl, quote, urlencode, urlsplit, urlunsplit

from stethoscope.paths import default_db_path

DEFAULT_DATABASE = "stethoscope"


class ConfigError(ValueError):
    """A setting the user gave cannot be used (exit code 2 on the CLI)."""


def resolve_dsn(dsn: str | None = None, database: str | None = None) -> str:
    """Return the DSN to connect with.

    Order: the argument, $STETHOSCOPE_DSN, the embedded default at <project>/.stethoscope/db.
    clickhouse-connect reads ``chdb://X/Y`` as host X and database Y; only ``chdb:///abs`` is a path,
    so a relative embedded path is made absolute here.
    """
    dsn = dsn or os.environ.get("STETHOSCOPE_DSN") or f"chdb://{default_db_path()}"
    database = database_name(database)
    parts = urlsplit(dsn)
    if parts.scheme not in ("chdb", "http", "https", "clickhouse", "clickhouses"):
        raise ConfigError(f"unsupported DSN scheme {parts.scheme!r} in {redact(dsn)}")
    query = dict(parse_qsl(parts.query))
    if parts.scheme == "chdb":
        path = dsn[len("chdb://") :].split("?", 1)[0]
        path = os.path.abspath(os.path.expanduser(path))
        query.setdefault("database", database)
        return f"chdb://{path}?{urlencode(query)}"
    parts = _credentials_in_address(parts, query, dsn)
    if not parts.path.strip("/") and "database" not in query:
        parts = parts._replace(path=f"/{database}")
    return urlunsplit(parts._replace(query=urlencode(query)))


_USER_OPTIONS = ("user", "username", "user_name")


def _credentials_in_address(parts: SplitResult, query: dict[str, str], dsn: str) -> SplitResult:
    """A user or password given as an option (`?password=`) moves into the address, where
    clickhouse-connect reads it: as an option it reached the client twice. Given in both places
    (which one counts?) it is a ConfigError, as is an address whose port is not a number (a password
    with a raw `/`, `?` or `#` cut it there)."""
    try:
        _port = parts.port  # urllib checks it only when asked
    except ValueError:
        raise ConfigError(
            f"DSN {redact(dsn)}: the host:port is not valid (a password holding '/', '?' or '#' "
            "must be percent-encoded: %2F, %3F, %23)"
        ) from None
    users = [name for name in _USER_OPTIONS if name in query]
    if "password" not in query and not users:
        return parts
    userinfo, _, host = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if len(users) > 1 or (users and user):
        raise ConfigError(f"DSN {redact(dsn)}: the user is given twice (in the address and as an option)")
    if "password" in query and colon:
        raise ConfigError(f"DSN {redact(dsn)}: the password is given twice (in the address and as an option)")
    if users:
        user = quote(query.pop(users[0]), safe="")
    if "password" in query:
        password, colon = quote(query.pop("password"), safe=""), ":"
    return parts._replace(netloc=f"{user or 'default'}{colon}{password}@{host}")


def database_of(dsn: str) -> str:
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    if parts.scheme == "chdb":
        return query.get("database", DEFAULT_DATABASE)
    return query.get("database") or parts.path.strip("/") or DEFAULT_DATABASE


def is_embedded(dsn: str) -> bool:
    return dsn.startswith("chdb://")


def embedded_path(dsn: str) -> str:
    return dsn[len("chdb://") :].split("?", 1)[0]


# user:secret@host where the secret may hold anything up to the last `@` of the address (the user too
# may hold an `@`): rather a host masked with it than a password's tail printed
_USERINFO_SECRET = re.compile(r"(://[^:/\s'\"]*:)[^\s'\"]*@")
# a secret passed as a DSN option or any key=value pair: ?password=x, &pass=x, pwd=x, access_token=x
_KEY_SECRET = re.compile(
    r"((?:^|[?&;,\s\"'])(?:password|passwd|pass|pwd|secret|access_token|token)\s*[=:]\s*)([^&\s\"',;]+)",
    re.IGNORECASE,
)


def database_name(database: str | None = None) -> str:
    """The database to use: the argument, $STETHOSCOPE_DATABASE, else stethoscope."""
    return database or os.environ.get("STETHOSCOPE_DATABASE") or DEFAULT_DATABASE


def redact(text: object) -> str:
    """Mask every password in text: URL user info (user:secret@host) and secret options (?password=x).

    The one function every message about a DSN goes through.
    """
    masked = _USERINFO_SECRET.sub(r"\1***@", str(text))
    return _KEY_SECRET.sub(r"\1***", masked)


def target_of(dsn: str) -> str:
    """Where a DSN points, without password or options: what a spool file is bound to."""
    parts = urlsplit(dsn)
    if parts.scheme == "chdb":
        return f"chdb://{embedded_path(dsn)}"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = (
        (f"{parts.username}@" if parts.username else "") + host + (f":{parts.port}" if parts.port else "")
    )
    return f"{parts.scheme}://{netloc}"
