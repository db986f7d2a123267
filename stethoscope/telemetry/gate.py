"""The node's Slurm gate (docs/design.md "Remediation safety"): run as Slurm's HealthCheckProgram or in
a prolog, as NHC is. It exits 1 and drains the node with a reason (`scontrol update nodename=N
state=drain reason="stethoscope gate: <rule> <txn>, ..."`) when serve's verdict of the node is
`fail` (an open critical finding, or the node's data silent: `unknown.node`, `unknown.unreachable`);
it exits 0 when clear, and calls no scontrol then (a prolog's gate costs slurmctld no RPC per job).
The safety rules hold here as in the executor: a dry-run serve's verdicts are advisory (the gate
exits 1 and says why, and drains nothing), and serve fails no more nodes than the circuit breaker
has room for (the others' verdicts are ok, "held back by the circuit breaker"). No fresh verdict
(serve down, its verdict stale) is a symptom, not a drain: the gate says so on stderr and exits 0,
or 1 with --fail-when-unverified; it never drains for it.

It never reaches the database: serve publishes one verdict per node each cycle (GET /gate/<node>),
a small JSON {node, verdict, reasons, findings, at, expires} signed with HMAC-SHA256 keyed by the
node's own key, HMAC(cluster secret, node_id), the key the push_agent and slurm_gate roles install
root-only. The gate asks serve with a short timeout (0.5 s) and keeps the last good verdict in its
state folder; only when serve gives no verified verdict does the cached one count, while it is fresh.
A verdict whose MAC does not verify, that is another node's, or that was made more than a minute
ahead of the node's clock, is refused: it counts as no verdict. serve's address is best an IP: the
connection's timeout does not bound a name's resolution.

Standard library only and Python 3.8-compatible: the slurm_gate role copies this file to the node
and runs it with the node's python3:

    python3 gate.py --config /etc/stethoscope/gate.json

`stethoscope gate` on the controller runs the same code.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import math
import os
import re
import socket
import sys
import time
import urllib.parse
from typing import Any, NamedTuple

DOMAIN = b"stethoscope-gate-v1\n"  # the node's key also signs its datagrams: a verdict is not one
REASON_PREFIX = "stethoscope gate:"
STALE_PREFIX = REASON_PREFIX + " no fresh verdict"  # said, never drained for
HELD_BACK = "held back by the circuit breaker"
SILENT_RULES = ("unknown.node", "unknown.unreachable")  # the node's data stopped: it fails
FUTURE_TOLERANCE = 60.0  # seconds a verdict's `at` may be ahead of the node's clock
ENFORCING, ADVISORY = "execute", "dry-run"  # serve's mode, in its verdicts
FETCH_TIMEOUT = 0.5  # seconds serve has to answer
SCONTROL_TIMEOUT = 5.0
MAX_BODY = 65536
REASON_CAP = 240  # characters of the drain reason
CACHE_NAME = "gate-verdict.json"
OK, FAIL = "ok", "fail"
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
SCONTROL_PATHS = ("/usr/bin/scontrol", "/usr/local/bin/scontrol", "/opt/slurm/bin/scontrol")


class VerdictError(Exception):
    """A verdict that cannot be used: unreadable, a MAC that does not verify, another node's."""


class Answer(NamedTuple):
    ok: bool
    reason: str  # one line: the drain reason when not ok, what was seen when ok
    verdict: dict[str, Any] | None
    unverified: bool = False  # no fresh verdict: said, never drained for
    advisory: bool = False  # a dry-run serve's fail: said, not drained for


# serve's side: build and sign ------------------------------------------------------------------
def verdict_of(
    node_id: str,
    findings: list[dict[str, Any]],
    at: float,
    grace: float,
    evaluated: float | None = None,
    mode: str = ENFORCING,
) -> dict[str, Any]:
    """The verdict of one node from a cycle's findings: `fail` when an open (or held open) critical
    finding of the node is not silenced, or its data stopped (SILENT_RULES, whatever their
    severity); warnings are listed, not failed on. `at`: when it is made (its freshness counts from
    there: a slow cycle's verdicts are not born stale); `evaluated`: the instant the cycle evaluated;
    `mode`: serve's, ENFORCING or ADVISORY (a dry-run serve's failures drain nothing)."""
    listed = []
    for finding in findings:
        rule = str(finding.get("rule_id", ""))
        severity = str(finding.get("severity"))
        if finding.get("node_id") != node_id or (
            severity not in ("critical", "warning") and rule not in SILENT_RULES
        ):
            continue
        if finding.get("silenced") or finding.get("status") == "silenced":
            continue
        listed.append({"rule": rule, "txn": str(finding.get("txn_id") or ""), "severity": severity})
    listed.sort(key=lambda f: (not _fails(f), f["rule"], f["txn"]))
    failing = [f for f in listed if _fails(f)]
    return {
        "node": node_id,
        "verdict": FAIL if failing else OK,
        "reasons": [(f["rule"] + " " + f["txn"]).strip() for f in failing],
        "findings": listed,
        "at": round(at, 3),
        "expires": round(at + grace, 3),
        "evaluated": round(at if evaluated is None else evaluated, 3),
        "mode": mode,
    }


def _fails(finding: dict[str, str]) -> bool:
    return finding["severity"] == "critical" or finding["rule"] in SILENT_RULES


def hold_back(verdict: dict[str, Any], why: str) -> dict[str, Any]:
    """`verdict` made ok because the circuit breaker has no room for another isolation: its reasons
    stay listed, after why."""
    return {**verdict, "verdict": OK, "reasons": [HELD_BACK + ": " + why, *verdict["reasons"]]}


def sign(keys: list[bytes], verdict: dict[str, Any]) -> bytes:
    """The body serve answers: the verdict as canonical JSON and its MAC under each key (the current
    secret's first, the previous one's during a rotation)."""
    payload = json.dumps(verdict, sort_keys=True, separators=(",", ":"))
    macs = [_mac(key, payload.encode("utf-8")) for key in keys]
    return json.dumps({"payload": payload, "mac": macs}).encode("utf-8")


def _mac(key: bytes, payload: bytes) -> str:
    return hmac.new(key, DOMAIN + payload, hashlib.sha256).hexdigest()


# the node's side: verify, judge, act ----------------------------------------------------------
def verify(key: bytes, body: bytes, node_id: str, now: float | None = None) -> dict[str, Any]:
    """The verdict in `body` if one of its MACs verifies under `key`, it is `node_id`'s and it was
    not made more than FUTURE_TOLERANCE after `now` (a clock ahead would keep it fresh for ever)."""
    try:
        outer = json.loads(body.decode("utf-8"))
        payload, macs = outer["payload"], outer["mac"]
        if not isinstance(payload, str) or not isinstance(macs, list):
            raise TypeError("payload or mac of the wrong type")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise VerdictError("unreadable verdict: %s" % exc) from None
    expected = _mac(key, payload.encode("utf-8"))
    if not any(isinstance(mac, str) and hmac.compare_digest(mac, expected) for mac in macs):
        raise VerdictError("verdict refused: its MAC does not verify under this node's key")
    try:
        verdict = json.loads(payload)
        node, at, expires = verdict["node"], float(verdict["at"]), float(verdict["expires"])
        state, reasons = verdict["verdict"], verdict["reasons"]
    except (ValueError, KeyError, TypeError) as exc:
        raise VerdictError("unreadable verdict: %s" % exc) from None
    if node != node_id:
        raise VerdictError("verdict refused: it is %r's, not %r's" % (node, node_id))
    if state not in (OK, FAIL) or not isinstance(reasons, list) or expires < at:
        raise VerdictError("unreadable verdict: %r" % (state,))
    now = time.time() if now is None else now
    if at > now + FUTURE_TOLERANCE:
        raise VerdictError(
            "verdict refused: made at %s, ahead of this node's clock (%s)" % (_iso(at), _iso(now))
        )
    return verdict


def judge(verdict: dict[str, Any] | None, now: float, grace: float | None, source: str) -> Answer:
    """What the gate says of `verdict` at `now`. `grace`: seconds a verdict counts after its `at`
    (None: until the `expires` serve gave it)."""
    if verdict is None:
        return Answer(False, STALE_PREFIX + " (none from serve)", None, unverified=True)
    until = verdict["at"] + grace if grace is not None else verdict["expires"]
    if now > until:
        return Answer(False, "%s (last at %s)" % (STALE_PREFIX, _iso(verdict["at"])), verdict, True)
    reasons = ", ".join(_printable(str(r)) for r in verdict["reasons"])
    if verdict["verdict"] == FAIL:
        reason = _cap("%s %s" % (REASON_PREFIX, reasons or "critical finding"))
        return Answer(False, reason, verdict, advisory=verdict.get("mode") == ADVISORY)
    held = " [%s]" % reasons if reasons else ""
    return Answer(True, "ok (verdict at %s, %s)%s" % (_iso(verdict["at"]), source, held), verdict)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() and c not in "\"'\\" else "?" for c in text)


def _cap(text: str) -> str:
    return text if len(text) <= REASON_CAP else text[: REASON_CAP - 3] + "..."


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class Gate:
    def __init__(self, config: dict[str, Any]):
        self.node_id = str(config["node_id"])
        self.serve = str(config["serve"]).rstrip("/")
        if not self.serve.startswith("http://"):
            raise ValueError("serve %r: serve's http://HOST:PORT" % self.serve)
        self.state_dir = str(config["state_dir"])
        self.grace = None if config.get("grace") is None else _seconds(config, "grace")
        asked = _seconds(config, "timeout") if config.get("timeout") is not None else FETCH_TIMEOUT
        self.timeout = min(asked, FETCH_TIMEOUT)
        self.drain = bool(config.get("drain", True))
        self.fail_when_unverified = bool(config.get("fail_when_unverified", False))
        self.slurm_name = str(config.get("slurm_name") or os.environ.get("SLURMD_NODENAME") or self.node_id)
        self.scontrol = str(config.get("scontrol") or _find_scontrol())
        self.slurm_conf = config.get("slurm_conf")
        with open(str(config["key_file"]), encoding="ascii", errors="replace") as handle:
            text = handle.read().strip()
        try:
            self.key = bytes.fromhex(text)
        except ValueError:
            self.key = b""
        if not self.key:
            raise ValueError("key file %s: not a node key (hex)" % config["key_file"])
        self.cache = os.path.join(self.state_dir, CACHE_NAME)
        self.said: list[str] = []  # what went wrong on the way, for the line the gate prints

    # the verdict --------------------------------------------------------------------------
    def answer(self, now: float | None = None) -> Answer:
        fetched = self.fetch()
        if fetched is not None:  # serve's verified verdict wins, whatever the cache holds
            self.keep(fetched)
            return judge(fetched, time.time() if now is None else now, self.grace, "from serve")
        return judge(self.cached(), time.time() if now is None else now, self.grace, "cached")

    def fetch(self) -> dict[str, Any] | None:
        url = "%s/gate/%s" % (self.serve, urllib.parse.quote(self.node_id, safe=""))
        try:
            status, body = http_get(url, self.timeout)
        except (OSError, ValueError) as exc:
            self.said.append("serve %s: %s" % (self.serve, exc))
            return None
        if status != 200:  # serve's own words: no key for this node, no cycle yet
            said = body[:200].decode("utf-8", "replace").strip().splitlines()
            self.said.append("serve %s answered %d: %s" % (self.serve, status, said[0] if said else ""))
            return None
        return self._verified(body, "serve")

    def cached(self) -> dict[str, Any] | None:
        try:
            with open(self.cache, "rb") as handle:
                body = handle.read(MAX_BODY + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.said.append("cache %s: %s" % (self.cache, exc.strerror))
            return None
        return self._verified(body, "cache")

    def _verified(self, body: bytes, source: str) -> dict[str, Any] | None:
        if len(body) > MAX_BODY:
            self.said.append("%s: verdict larger than %d bytes refused" % (source, MAX_BODY))
            return None
        try:
            verdict = verify(self.key, body, self.node_id)
        except VerdictError as exc:
            self.said.append("%s: %s" % (source, exc))
            return None
        verdict["_body"] = body
        return verdict

    def keep(self, verdict: dict[str, Any]) -> None:
        """The verdict's body as received, in the state folder (root-only), replaced atomically."""
        temporary = self.cache + ".%d.tmp" % os.getpid()
        try:
            os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(verdict["_body"])
            os.replace(temporary, self.cache)
        except OSError as exc:  # the verdict still counts now; only the next outage loses it
            self.said.append("cache %s: not written: %s" % (self.cache, exc.strerror))

    # Slurm --------------------------------------------------------------------------------
    def act(self, answer: Answer) -> None:
        """Drain on a failing verdict of an executing serve, unless a drain not the gate's is there (a
        person's reason is kept). Nothing else calls scontrol: a clear node costs slurmctld no RPC,
        no fresh verdict drains nothing, and a drain is never lifted here (resuming after a repair
        is verify's)."""
        if answer.ok or answer.unverified or not self.drain:
            return
        if answer.advisory:
            self.said.append("advisory: serve runs without --execute, not drained")
            return
        state, reason = self.node_state()
        drained = "DRAIN" in state or "DOWN" in state
        if drained and not reason.startswith(REASON_PREFIX):
            self.said.append("already drained: %s" % reason)
            return
        if drained and reason.startswith(answer.reason):
            return
        self.scontrol_run("update", "nodename=" + self.slurm_name, "state=drain", "reason=" + answer.reason)

    def node_state(self) -> tuple[str, str]:
        out = self.scontrol_run("-o", "show", "node", self.slurm_name)
        head, _sep, reason = out.strip().partition(" Reason=")
        fields = dict(token.split("=", 1) for token in head.split() if "=" in token)
        return fields.get("State", ""), reason

    def scontrol_run(self, *argv: str) -> str:
        import subprocess  # here: a clear node's answer does not pay for importing it

        env = dict(os.environ, LANGUAGE="C", LC_ALL="C")
        if self.slurm_conf:
            env["SLURM_CONF"] = str(self.slurm_conf)
        try:
            done = subprocess.run(
                [self.scontrol, *list(argv)],
                capture_output=True,
                text=True,
                timeout=SCONTROL_TIMEOUT,
                env=env,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.said.append("scontrol %s: %s" % (argv[0], exc))
            return ""
        if done.returncode != 0:
            self.said.append("scontrol %s: rc=%d %s" % (argv[0], done.returncode, done.stderr.strip()[:200]))
        return done.stdout

    def run(self) -> int:
        answer = self.answer()
        self.act(answer)
        line = "%s %s: %s" % (
            REASON_PREFIX,
            self.node_id,
            answer.reason if answer.ok else "FAIL: " + answer.reason,
        )
        if self.said:
            line += " [" + "; ".join(_printable(s) for s in self.said) + "]"
        print(line, file=sys.stdout if answer.ok else sys.stderr, flush=True)
        if answer.unverified and not self.fail_when_unverified:
            return EXIT_OK  # a symptom of serve, not of the node
        return EXIT_OK if answer.ok else EXIT_FAIL


def http_get(url: str, timeout: float) -> tuple[int, bytes]:
    """(status, body) of GET `url` (http://HOST:PORT/PATH), connecting, sending and reading all within
    `timeout` seconds. A bare HTTP/1.0 request: urllib would cost the node more to import (~0.1 s)
    than serve takes to answer, and its timeout bounds each read, not the whole answer."""
    deadline = time.monotonic() + timeout
    scheme, _sep, rest = url.partition("://")
    if scheme != "http":
        raise ValueError("%s: only http:// is served" % url)
    authority, _sep, path = rest.partition("/")
    if authority.startswith("["):  # [IPv6]:port
        host, _sep, port = authority[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _sep, port = authority.partition(":")
    request = "GET /%s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path, authority)
    chunks: list[bytes] = []
    with socket.create_connection((host, int(port or 80)), timeout=timeout) as connection:
        connection.settimeout(max(deadline - time.monotonic(), 0.001))
        connection.sendall(request.encode("ascii"))
        while sum(len(c) for c in chunks) <= MAX_BODY + 4096:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError("timed out")
            connection.settimeout(left)
            chunk = connection.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status) < 2 or not status[1].isdigit():
        raise ValueError("not an HTTP answer")
    return int(status[1]), body


# stethoscope's one duration syntax (timeutil.parse_duration), here in the standard library alone
_DURATION = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)\s*(s|m|h|d|w)?$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration_seconds(text: object) -> float:
    """'90s', '15m', '1.5h', '2d', '1w' or plain seconds -> seconds above 0; ValueError otherwise."""
    match = None if isinstance(text, bool) else _DURATION.match(str(text).strip())
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"] if match else 0.0
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError("%r is not a duration above 0 (90s, 15m, 1.5h, 2d, 1w or plain seconds)" % (text,))
    return int(seconds) if seconds.is_integer() else seconds


def _seconds(config: dict[str, Any], name: str) -> float:
    try:
        return duration_seconds(config[name])
    except ValueError as exc:
        raise ValueError("%s: %s" % (name, exc)) from None


def _find_scontrol() -> str:
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if folder and os.access(os.path.join(folder, "scontrol"), os.X_OK):
            return os.path.join(folder, "scontrol")
    return next((path for path in SCONTROL_PATHS if os.access(path, os.X_OK)), "scontrol")


# the command ----------------------------------------------------------------------------------
def _duration_option(text: str) -> float:
    """argparse's type for --grace and --timeout: a bad one is exit 2 naming the option and the value."""
    try:
        return duration_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The gate's options, for the node's gate.py and `stethoscope gate` alike."""
    parser.add_argument("--config", help="gate.json (serve, node_id, key_file, state_dir, grace, ...)")
    parser.add_argument("--serve", help="serve's base URL, http://HOST:PORT")
    parser.add_argument("--node", dest="node_id", help="this node's inventory name")
    parser.add_argument("--slurm-name", help="its Slurm name (default $SLURMD_NODENAME, else --node)")
    parser.add_argument("--key-file", help="the node's key (hex), root-only")
    parser.add_argument("--state-dir", help="where the last good verdict is kept")
    parser.add_argument(
        "--grace",
        type=_duration_option,
        help="how long a verdict counts after it was made, a duration (10m; "
        "bare: seconds; default: its expires)",
    )
    parser.add_argument(
        "--timeout", type=_duration_option, help="how long serve has to answer (at most 0.5s)"
    )
    parser.add_argument("--no-drain", dest="drain", action="store_false", default=None, help="exit code only")
    parser.add_argument(
        "--fail-when-unverified",
        action="store_true",
        default=None,
        help="exit 1 (never drain) when no fresh verdict is there (default: say it, exit 0)",
    )
    parser.add_argument("--scontrol", help="path of scontrol (default: PATH, then /usr/bin)")
    parser.add_argument("--slurm-conf", help="SLURM_CONF for scontrol")


FLAGS = (  # the settings a flag gives, over gate.json's
    "serve", "node_id", "slurm_name", "key_file", "state_dir", "grace", "timeout", "drain",
    "fail_when_unverified", "scontrol", "slurm_conf",
)  # fmt: skip


def load_config(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if args.config:
        with open(args.config, encoding="utf-8") as handle:
            config = json.load(handle)
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    for name in FLAGS:
        if getattr(args, name, None) is not None:
            config[name] = getattr(args, name)
    missing = [name for name in ("serve", "node_id", "key_file", "state_dir") if not config.get(name)]
    if missing:
        raise ValueError("missing setting: " + ", ".join(missing))
    return config


def run(args: argparse.Namespace) -> int:
    try:
        gate = Gate(load_config(args))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        where = args.config or "gate"
        print("%s %s: %s" % (REASON_PREFIX, where, exc), file=sys.stderr)
        return EXIT_USAGE
    return gate.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stethoscope-gate", description=__doc__.split("\n\n", 1)[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
