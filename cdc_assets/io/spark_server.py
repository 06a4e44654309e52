"""The local Spark server: one Spark Connect server on this machine that outlives runs.

Dagster starts every run in a fresh process. With Spark in that process, every run pays for a
fresh JVM: seconds to start, and on a small machine most of a short run compiling Spark's code
(a 100k-record batch takes 4.3 s in a new JVM, 0.9 s once warm). The embedded default therefore
runs local Spark as a Spark Connect server (the pyspark wheel's own JVM and ``SparkConnectServer``,
bound to 127.0.0.1 on a free port) that the first run starts and later runs reuse, warm. A small
supervisor process (no pyspark in it) starts the JVM, stops it when no client has been connected
for ``idle_timeout_s``, and takes it along when it is stopped or killed. Runs with other Spark
settings get a server of their own: servers are keyed by a fingerprint of their settings.

The state lives in ``$CDC_SPARK_SERVER_DIR`` (default: ``<tmp>/cdc-assets-spark-<uid>``): per
server ``<fingerprint>.json`` (supervisor pid, port), ``.lock`` (held while a client starts it) and
``.log``, and per session slot (``connect``) ``session-<port>-<slot>.lock`` (the ids of the session
and of its small-batch session, locked by the client using them). A server's state names the
checkout (or installation) that started it:

    python -m cdc_assets.io.spark_server status|stop [--all]   # this checkout's servers; --all: every one
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

import psutil

if TYPE_CHECKING:  # the supervisor never imports pyspark's Python side (pandas and more: ~120 MB)
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

SERVER_DIR_ENV_VAR = "CDC_SPARK_SERVER_DIR"
# How long a new server may take to start, when its caller does not say: a cold JVM that shares a busy machine's
# cores with other JVMs can take minutes (a benchmark's server of the test suite took over 180 s, 2026-12-02).
START_TIMEOUT_ENV_VAR = "CDC_SPARK_START_TIMEOUT_S"
DEFAULT_START_TIMEOUT_S = 180.0
# The checkout (or site-packages) this cdc_assets runs from: servers of other checkouts share the server dir.
CHECKOUT = str(Path(__file__).resolve().parents[2])
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_POLL_S = 5.0
_PORT_ATTEMPTS = 3  # starts of a server whose port another process took first


class SparkServerError(RuntimeError):
    """The local Spark server could not be started or reached."""


def server_dir() -> Path:
    """Where the local servers' state, locks and logs live."""
    default = Path(tempfile.gettempdir()) / f"cdc-assets-spark-{os.getuid()}"
    return Path(os.environ.get(SERVER_DIR_ENV_VAR) or default)


def fingerprint(settings: Mapping[str, str]) -> str:
    """The key of the server for these Spark settings."""
    return hashlib.sha256(json.dumps(dict(sorted(settings.items()))).encode()).hexdigest()[:16]


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
        return True
    return False


def _alive(pid: int) -> bool:
    try:
        # A supervisor started by this process stays a zombie until reaped, and a zombie still takes
        # signals: reap it, or stopping waits out its whole deadline.
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not our child: its parent reaps it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running(state_path: Path) -> dict | None:
    """The server's state if it is up and answering, else None (a stale state file is removed)."""
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError):
        return None
    if _alive(state["pid"]) and _answers(state["port"]):
        return state
    with contextlib.suppress(OSError):
        state_path.unlink()
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_CONNECT_CLIENT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")


def jvm_environ(**extra: str) -> dict[str, str]:
    """This process's environment for a child that runs Spark in a JVM of its own, plus ``extra``: without
    what makes pyspark a Spark Connect client, which ``connect`` sets for this process and a child inherits."""
    return {**{k: v for k, v in os.environ.items() if k not in _CONNECT_CLIENT_ENV}, **extra}


def start_timeout() -> float:
    """How long a new local server may take to start: ``$CDC_SPARK_START_TIMEOUT_S`` seconds, else 180."""
    value = os.environ.get(START_TIMEOUT_ENV_VAR, "").strip()
    try:
        seconds = float(value) if value else DEFAULT_START_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise SparkServerError(f"{START_TIMEOUT_ENV_VAR}={value!r} is not a positive number of seconds")
    return seconds


def ensure_local_server(settings: Mapping[str, str], idle_timeout_s: float = 900.0,
                        start_timeout_s: float | None = None) -> str:
    """The Spark Connect URL of the local server for ``settings``, starting one if none runs, within
    ``start_timeout_s`` (default: ``start_timeout()``)."""
    key = fingerprint(settings)
    base = server_dir()
    state_path = base / f"{key}.json"
    state = _running(state_path)
    if state is not None:
        return f"sc://127.0.0.1:{state['port']}"
    with _locked(base / f"{key}.lock"):
        state = _running(state_path)
        if state is None:
            state = _start(settings, state_path, idle_timeout_s,
                           start_timeout() if start_timeout_s is None else start_timeout_s)
    return f"sc://127.0.0.1:{state['port']}"


def connect(url: str) -> SparkSession:
    """A Spark Connect session on the local server at ``url``; ``disconnect`` ends it.

    Runs take turns on a few long-lived server sessions, the server's session slots, instead of
    opening a new session each. A slot is held under a file lock from ``connect`` to ``disconnect``
    (or the process's end); a process that finds every slot taken gets a session of its own,
    released on ``disconnect``. Why: Spark Connect gives every session a class loader of its own,
    and Spark's cache of generated code is keyed by class loader, so a new session per run compiled
    the merge path's code again and ran it cold (docs/tuning.md). A reused session first drops what
    an earlier holder may have left set (``RESET``: a run killed inside ``DeltaSparkWriter``'s commit settings).

    Spark Connect's client retries an unreachable server for ten minutes; a local server that is
    gone does not come back, so a run fails within seconds instead. A process is either a Spark
    Connect client or runs Spark in its own JVM (``pyspark.sql.functions`` serves one of them):
    Spark refuses this session if the process already runs a local JVM session.
    """
    port = url.rsplit(":", 1)[-1]
    for slot in range(_SESSION_SLOTS):
        handle = _try_lock(server_dir() / f"session-{port}-{slot}.lock")
        if handle is None:
            continue
        try:
            session = _reused_session(url, handle, 0)
        except BaseException:
            handle.close()
            raise
        _connected[id(session)] = _Connection(url, handle)
        return session
    session = _session(url)
    _connected[id(session)] = _Connection(url, None)
    return session


def disconnect(session: SparkSession) -> None:
    """End ``session`` (from ``connect``) and its small-batch session: a slot's sessions stay on the
    server for the next run, its slot is freed; sessions of their own are released."""
    connection = _connected.pop(id(session), None)
    sessions = [session] if connection is None or connection.small is None else [session, connection.small]
    if connection is None or connection.slot is None:
        for own in sessions:
            own.stop()
        return
    for kept in sessions:
        _close_client(kept)
    connection.slot.close()  # frees the slot's lock


def small_batch_session(session: SparkSession) -> SparkSession | None:
    """The session that folds the small batches of ``session`` (from ``connect``): on the same server, with
    ``SMALL_BATCH_SETTINGS``, made on first use (a slot's is kept with the slot, as the slot's session is);
    None for a session not from ``connect``. Worker threads of one run ask at once: one of them makes it."""
    connection = _connected.get(id(session))
    if connection is None:
        return None
    with _small_batch_lock:
        if connection.small is None:
            small = _reused_session(connection.url, connection.slot, 1) if connection.slot else _session(connection.url)
            for key, value in SMALL_BATCH_SETTINGS.items():
                small.conf.set(key, value)
            connection.small = small
    return connection.small


# A small batch's query on a warm server costs more to plan and to generate code for than to run: below
# about 1,000 records of W2's events, interpreted expressions without whole-stage code generation or
# adaptive execution cost 8-37% less of the server's CPU, from 2,000 more (docs/tuning.md). Each connected
# session therefore gets a sibling with these settings, on the same server, when it first folds one.
SMALL_BATCH_SETTINGS = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
}


@dataclass
class _Connection:
    """A session from ``connect``: its server, its slot's locked file (None: a session of its own) and its
    small-batch session, once made."""

    url: str
    slot: IO[str] | None
    small: SparkSession | None = None


_connected: dict[int, _Connection] = {}  # id(session) -> what ``connect`` made it with
_small_batch_lock = threading.Lock()


def _close_client(session: SparkSession) -> None:
    """Close ``session``'s connection, leaving the session on the server."""
    cast("ConnectSession", session).release_session_on_close = False
    session.stop()


# Sessions of a server that runs take turns on (``connect``): more runs at once than this get sessions
# of their own.
_SESSION_SLOTS = 8


def _try_lock(path: Path) -> IO[str] | None:
    """``path`` opened and exclusively locked, or None if another holder has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _reused_session(url: str, slot: IO[str], line: int) -> SparkSession:
    """The session of a locked ``slot`` whose id is kept in ``line`` of the slot's file (the run's
    session, then its small-batch session): a new one if the slot has none yet or the server closed it
    (Spark Connect closes a session idle for an hour)."""
    slot.seek(0)
    ids = [*slot.read().splitlines(), "", ""][:2]
    session_id = ids[line].strip()
    if session_id:
        session = _session(f"{url}/;session_id={session_id}")
        try:
            session.sql("RESET")
            return session
        except Exception as exc:
            _close_client(session)
            if "SESSION_CLOSED" not in str(exc):
                raise
    ids[line] = session_id = str(uuid.uuid4())
    slot.seek(0)
    slot.truncate()
    slot.write("\n".join(ids))
    slot.flush()
    return _session(f"{url}/;session_id={session_id}")


def _session(url: str) -> SparkSession:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    session = SparkSession.builder.remote(url).create()
    session.client.set_retry_policies([DefaultPolicy(max_retries=4)])
    # Reattachable execution survives dropped connections to a remote server, at the price of a
    # release call per response and threads to make them: nothing to survive on the loopback.
    session.client.disable_reattachable_execute()
    return session


def _start(settings: Mapping[str, str], state_path: Path, idle_timeout_s: float, start_timeout_s: float) -> dict:
    log_path = state_path.with_suffix(".log")
    command = [sys.executable, "-m", "cdc_assets.io.spark_server", "serve", "--state", str(state_path),
               "--idle-timeout-s", str(idle_timeout_s), "--start-timeout-s", str(start_timeout_s)]
    with log_path.open("w") as log:
        # A session of its own: the server outlives the run that started it (and its signals).
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, text=True, env=jvm_environ())
        assert process.stdin is not None
        process.stdin.write(json.dumps(dict(settings)))
        process.stdin.close()
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline:
        state = _running(state_path)
        if state is not None:
            return state
        if process.poll() is not None:
            tail = log_path.read_text()[-2000:]
            raise SparkServerError(f"the local Spark server exited with code {process.returncode} while starting "
                                   f"(log {log_path}):\n{tail}")
        time.sleep(0.2)
    process.kill()
    raise SparkServerError(f"the local Spark server did not answer within {start_timeout_s:.0f} s (log {log_path}; "
                           f"a busy machine may need longer: {START_TIMEOUT_ENV_VAR})")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _spark_submit() -> Path:
    """The ``spark-submit`` of the installed pyspark (its JVM and jars), found without importing it."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SparkServerError("pyspark is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "bin" / "spark-submit"


def _die_with_parent() -> None:
    """In the JVM's process, before it runs: SIGTERM it when the supervisor dies, however it dies."""
    # A JVM that starts with SIGTERM ignored (inherited: CI found one) keeps ignoring it, and outlives us.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux)


def serve(settings: Mapping[str, str], state_path: Path, idle_timeout_s: float, start_timeout_s: float) -> None:
    """Supervise the server's JVM until no client has been connected for ``idle_timeout_s`` (or the
    supervisor is stopped); the JVM stops with it."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    jvm: subprocess.Popen | None = None
    try:
        jvm, port = _start_jvm(settings, start_timeout_s)
        state_path.write_text(json.dumps({"pid": os.getpid(), "port": port, "settings": dict(settings),
                                          "checkout": CHECKOUT}))
        print(f"local Spark server: sc://127.0.0.1:{port}", flush=True)
        _wait_until_idle(jvm, port, idle_timeout_s)
    finally:
        if jvm is not None:
            _stop_jvm(jvm, port, state_path)


def _start_jvm(settings: Mapping[str, str], start_timeout_s: float,
               attempts: int = _PORT_ATTEMPTS) -> tuple[subprocess.Popen, int]:
    """The server's JVM, listening on a free port of its own. Another process can take the port between its
    choice and the JVM's bind (the demo's broker, started beside it): then the JVM is stopped and started again
    on another port, up to ``attempts`` times."""
    for attempt in range(1, attempts + 1):
        port = _free_port()
        conf = {
            **settings,
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.log.level": "ERROR",
        }
        command = [str(_spark_submit()), "--class", CONNECT_SERVER_CLASS]
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        # Two malloc arenas instead of up to 8 per core: the JVM runs ~250 threads, most of them Spark's
        # idle pools. Measured together with the survivor sizing of ``spark.EMBEDDED_DEFAULTS``.
        jvm = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                               env={**os.environ, "MALLOC_ARENA_MAX": "2"})
        deadline, taken = time.monotonic() + start_timeout_s, False
        # The JVM's own listener, not an answer on the port: clients must not reach another process there.
        while not _listens(jvm, port):
            taken = _answers(port) and not _listens(jvm, port)
            if jvm.poll() is not None or taken or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        else:
            return jvm, port
        exited = jvm.poll()
        jvm.kill()
        jvm.wait()
        if not taken or attempt == attempts:
            why = ("another process listens on its port" if taken else
                   f"within {start_timeout_s:.0f} s" if exited is None else f"exit code {exited}")
            raise SparkServerError(f"the Spark Connect server did not start on port {port} ({why}; attempt "
                                   f"{attempt} of {attempts})")
        print(f"port {port} was taken by another process: starting on another one", flush=True)
    raise AssertionError("unreachable")


def _stop_jvm(jvm: subprocess.Popen, port: int, state_path: Path) -> None:
    # The state file goes first, under the start lock: a client from now on starts a new server.
    # One that read the state a moment before fails within seconds (``connect``).
    with _locked(state_path.with_suffix(".lock")):
        with contextlib.suppress(OSError):
            state_path.unlink()
        for slot in state_path.parent.glob(f"session-{port}-*.lock"):  # its sessions end with it
            slot.unlink(missing_ok=True)
        jvm.terminate()
        try:
            jvm.wait(60)
        except subprocess.TimeoutExpired:
            jvm.kill()


def _listens(jvm: subprocess.Popen, port: int) -> bool:
    """Whether ``jvm``'s own process listens on ``port``."""
    with contextlib.suppress(psutil.Error):
        return _connections(psutil.Process(jvm.pid), port, psutil.CONN_LISTEN) > 0
    return False


def _connections(process: psutil.Process, port: int, status: str) -> int:
    """How many of ``process``'s TCP connections on its local ``port`` are in ``status``."""
    with contextlib.suppress(psutil.Error):
        return sum(1 for c in process.net_connections(kind="tcp")
                   if c.laddr and c.laddr.port == port and c.status == status)
    return 0


def _wait_until_idle(jvm: subprocess.Popen, port: int, idle_timeout_s: float) -> None:
    """Return when no client has been connected for ``idle_timeout_s``, or the JVM has exited. A
    run holds its connection from its session's start to its end."""
    process = psutil.Process(jvm.pid)
    last_active = time.monotonic()
    while jvm.poll() is None:
        time.sleep(min(_POLL_S, idle_timeout_s))
        now = time.monotonic()
        if _connections(process, port, psutil.CONN_ESTABLISHED):  # a client holds a session
            last_active = now
        elif now - last_active > idle_timeout_s:
            return


def running_servers(this_checkout: bool = False) -> list[tuple[Path, dict]]:
    """The running local servers of this server directory: (state file, state with pid and port);
    ``this_checkout``: only those this checkout started (``CHECKOUT``)."""
    found = []
    for path in sorted(server_dir().glob("*.json")):
        state = _running(path)
        if state is not None and (not this_checkout or state.get("checkout") == CHECKOUT):
            found.append((path, state))
    return found


def stop_servers(states: list[tuple[Path, dict]], timeout_s: float = 60.0, *, kill: bool = False) -> int:
    """Stop the servers of ``states`` (from ``running_servers``) and wait for them; the number stopped.
    ``kill``: their JVMs are killed rather than stopped, for servers whose state nothing needs any more (a test
    session's end): a JVM's shutdown hooks may wait out their retries on object stores that are gone already."""
    for _, state in states:
        if kill:
            with contextlib.suppress(psutil.Error):
                for jvm in psutil.Process(state["pid"]).children(recursive=True):
                    jvm.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(state["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(_alive(state["pid"]) for _, state in states) and time.monotonic() < deadline:
        time.sleep(0.2)
    return len(states)


def stop_all(timeout_s: float = 60.0, *, kill: bool = False) -> int:
    """Stop every local server of this server directory, whichever checkout started it; the number stopped
    (``kill``: as ``stop_servers``)."""
    return stop_servers(running_servers(), timeout_s, kill=kill)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for command, what in (("status", "list"), ("stop", "stop")):
        sub = commands.add_parser(command, help=f"{what} this checkout's running local servers")
        sub.add_argument("--all", action="store_true", help=f"{what} every checkout's, not only this one's")
    serve_parser = commands.add_parser("serve", help=argparse.SUPPRESS)
    serve_parser.add_argument("--state", required=True)
    serve_parser.add_argument("--idle-timeout-s", type=float, required=True)
    serve_parser.add_argument("--start-timeout-s", type=float, required=True)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(json.loads(sys.stdin.read()), Path(args.state), args.idle_timeout_s, args.start_timeout_s)
        return
    states = running_servers(this_checkout=not args.all)
    scope = "" if args.all else f" of {CHECKOUT}"
    others = [] if args.all else [state for state in running_servers() if state not in states]
    if args.command == "stop":
        print(f"stopped {stop_servers(states)} local Spark server(s){scope} in {server_dir()}")
    else:
        for path, state in states:
            print(f"sc://127.0.0.1:{state['port']}  pid {state['pid']}  log {path.with_suffix('.log')}")
        if not states:
            print(f"no local Spark server{scope} running in {server_dir()}")
    if others:
        print(f"{len(others)} server(s) of other checkouts left alone (--all includes them)")


if __name__ == "__main__":
    main()
