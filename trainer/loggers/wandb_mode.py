"""W&B's mode (online, offline or disabled) from the settings, the environment and the credentials,
and whether its server answers: read by the W&B logger before it starts a run."""

from __future__ import annotations

import netrc
import os
import socket
from typing import Mapping
from urllib.parse import urlparse

MODES = ("auto", "online", "offline", "disabled")
DEFAULT_BASE_URL = "https://api.wandb.ai"
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def api_key_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether W&B has credentials: ``WANDB_API_KEY``, or a netrc entry (``$NETRC`` or ``~/.netrc``,
    where ``wandb login`` writes) for the W&B host. Never reads the key's value into anything."""
    environ = os.environ if environ is None else environ
    if environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL).hostname
    try:
        return netrc.netrc(environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):  # no netrc file (or no home directory), or a broken one
        return False


def resolve_mode(mode: str, environ: Mapping[str, str] | None = None) -> str:
    """The W&B mode a run uses: ``online``, ``offline`` or ``disabled``.

    ``auto``: ``$WANDB_MODE`` if set; else ``online`` when an API key is configured
    (`api_key_configured`), ``offline`` when not. Any other mode is used as given.
    """
    if mode not in MODES:
        raise ValueError(f"logger.wandb.mode={mode!r} is not one of {MODES}")
    if mode != "auto":
        return mode
    environ = os.environ if environ is None else environ
    from_env = {"dryrun": "offline", "run": "online"}.get(environ.get("WANDB_MODE", ""), environ.get("WANDB_MODE", ""))
    if from_env in ("online", "offline", "disabled"):
        return from_env
    return "online" if api_key_configured(environ) else "offline"


def server_reachable(environ: Mapping[str, str] | None = None, timeout_s: float = 3.0) -> bool:
    """A TCP connection to the W&B server opens within ``timeout_s`` (assumed true behind a proxy,
    which this check cannot see through)."""
    environ = os.environ if environ is None else environ
    if any(environ.get(name) for name in PROXY_VARIABLES):
        return True
    url = urlparse(environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False
