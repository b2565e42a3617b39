"""Starting, watching and stopping one engine server process (and the processes it spawns)."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from dflash_plugin.errors import DFlashError
from dflash_cli.serving.flags import Launch


class ServerExited(DFlashError):
    """The server process ended before it became ready."""

    def __init__(self, returncode: int, output_tail: str):
        self.returncode = returncode
        self.output_tail = output_tail
        super().__init__(f"the server exited with code {returncode} before it was ready"
                         + (f"; last output:\n{output_tail}" if output_tail else ""))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def local_url(host: str, port: int) -> str:
    """The address to reach a server listening on host (wildcards are reached on loopback)."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def is_healthy(base_url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _die_with_parent():  # runs in the child between fork and exec
    """Linux: the server gets SIGTERM when the process that started it dies, even by SIGKILL, so
    a killed `dflash serve` / bench / test run leaves no server behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Server:
    """One server process in its own session, so that stop() ends its whole process tree."""

    def __init__(self, launch: Launch, log_path: str | Path | None = None,
                 env_base: dict[str, str] | None = None):
        self.launch = launch
        self.log_path = Path(log_path) if log_path else None
        self.env_base = env_base
        self.process: subprocess.Popen | None = None
        self.base_url = local_url(launch.host, launch.port)

    def start(self) -> "Server":
        output = None
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            output = self.log_path.open("wb")
        try:
            self.process = subprocess.Popen(
                self.launch.argv, env=self.launch.environ(self.env_base), stdout=output,
                stderr=subprocess.STDOUT if output else None, stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        finally:
            if output:
                output.close()
        return self

    def output_tail(self, num_bytes: int = 6000) -> str:
        if not self.log_path or not self.log_path.is_file():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(max(0, self.log_path.stat().st_size - num_bytes))
            return f.read().decode(errors="replace")

    def wait_ready(self, timeout: float) -> float:
        """Seconds until /health answered 200. Raises ServerExited or TimeoutError."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            code = self.process.poll()
            if code is not None:
                raise ServerExited(code, self.output_tail())
            if is_healthy(self.base_url):
                return time.monotonic() - start
            time.sleep(1.0)
        raise TimeoutError(f"server at {self.base_url} not ready after {timeout:.0f} s"
                           + (f" (log: {self.log_path})" if self.log_path else ""))

    def signal(self, sig: int):
        if self.process and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 30.0) -> int | None:
        """SIGTERM to the server's process group, SIGKILL after `grace` seconds."""
        if self.process is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        # Engine-core and worker processes may outlive the API process briefly; end them too.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return self.process.wait(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
